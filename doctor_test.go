package main

import (
	"encoding/json"
	"strings"
	"testing"

	"quotad/integration/redistest"
)

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
