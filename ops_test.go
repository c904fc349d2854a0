package main

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"quotad/integration/redistest"
)

func TestServeRejectsBadOpsSettings(t *testing.T) {
	dir, err := os.MkdirTemp("", "qo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--log-decisions", "some"}, "--log-decisions"},
		{[]string{"--http-addr", taken.Addr().String()}, "--http-addr"},
	} {
		args := append([]string{"serve", "--socket", filepath.Join(dir, "q.sock"), "--log-level", "error"}, tc.args...)
		_, stderr, code := runCLI(t, args...)
		if code != exitError || !strings.Contains(stderr, tc.want) {
			t.Errorf("serve %v: code %d, stderr %q; want exit 1 naming %s", tc.args, code, stderr, tc.want)
		}
		if _, err := os.Stat(filepath.Join(dir, "q.sock")); err == nil {
			t.Errorf("serve %v left its socket behind", tc.args)
		}
	}
}

func TestDoctorCommand(t *testing.T) {
	r := redistest.Start(t)
	if err := r.Do(t, "HSET", "quotad:fw:{p:login:alice}", "used", "5", "policy", "5:900000", "ids", "0").Error(); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := runCLI(t, "doctor"); code != exitError || !strings.Contains(stderr, "--redis-url") {
		t.Fatalf("doctor without --redis-url: code %d, stderr %q", code, stderr)
	}
	out, _, code := runCLI(t, "doctor", "--redis-url", r.URL())
	if code != exitDoctor || !strings.Contains(out, "quotad:fw:{p:login:alice}") || !strings.Contains(out, "1 problems found") {
		t.Fatalf("doctor: code %d, out:\n%s", code, out)
	}
	out, _, code = runCLI(t, "doctor", "--redis-url", r.URL(), "--json", "--fix")
	var rep struct {
		Problems int `json:"problems"`
		NoTTL    []struct {
			Key   string `json:"key"`
			Fixed bool   `json:"fixed"`
			TTLMS int64  `json:"ttl_ms"`
		} `json:"no_ttl"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != exitDoctor || rep.Problems != 1 || len(rep.NoTTL) != 1 || !rep.NoTTL[0].Fixed || rep.NoTTL[0].TTLMS != 900000 {
		t.Fatalf("doctor --json --fix: code %d, %v, out:\n%s", code, err, out)
	}
	out, _, code = runCLI(t, "doctor", "--redis-url", r.URL())
	if code != exitOK || !strings.Contains(out, "no problems found") {
		t.Fatalf("doctor after --fix: code %d, out:\n%s", code, out)
	}
}
