package redistest

import (
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
)

// CommandCalls is how many times s ran each of cmds ("evalsha",
// "script|load", ...) since its stats were last reset, added up, from
// INFO commandstats.
func (s *Server) CommandCalls(t testing.TB, cmds ...string) int64 {
	t.Helper()
	info, err := s.Do(t, "INFO", "commandstats").ToString()
	if err != nil {
		t.Fatalf("INFO commandstats on %s: %v", s.Addr(), err)
	}
	var n int64
	for _, line := range strings.Split(info, "\r\n") {
		for _, cmd := range cmds {
			rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls=")
			if !ok {
				continue
			}
			calls, _, _ := strings.Cut(rest, ",")
			c, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				t.Fatalf("INFO commandstats line %q: %v", line, err)
			}
			n += c
		}
	}
	return n
}

// HoldsScripts reports whether s's script cache holds every one of srcs
// (SCRIPT EXISTS of their SHA1s).
func (s *Server) HoldsScripts(t testing.TB, srcs ...string) bool {
	t.Helper()
	args := []string{"SCRIPT", "EXISTS"}
	for _, src := range srcs {
		sum := sha1.Sum([]byte(src))
		args = append(args, hex.EncodeToString(sum[:]))
	}
	v, err := s.Do(t, args...).AsIntSlice()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range v {
		if x != 1 {
			return false
		}
	}
	return true
}
