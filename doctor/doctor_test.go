package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"quotad/integration/redistest"
)

// seedBrokenKeys writes what a doctor must find: healthy windows, windows
// that lost their TTL (fixed window, token bucket), a key of the wrong
// type, a large request-id set, and keys outside the prefix.
func seedBrokenKeys(t *testing.T, r *redistest.Server, prefix string) {
	t.Helper()
	do := func(args ...string) {
		t.Helper()
		if err := r.Do(t, args...).Error(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	for i := range 5 {
		k := prefix + "fw:{p:api:user-" + strconv.Itoa(i) + "}"
		do("HSET", k, "used", "1", "policy", "10:60000", "ids", "0")
		do("PEXPIRE", k, "60000")
	}
	k := prefix + "fw:{i:inline-user}"
	do("HSET", k, "used", "1", "policy", "5:1000", "ids", "0")
	do("PEXPIRE", k, "1000000")
	// Lost its TTL: the window records 30000 ms.
	do("HSET", prefix+"fw:{p:login:locked-out}", "used", "5", "policy", "5:30000", "ids", "0")
	// Lost its TTL, another algorithm: no window length doctor knows.
	do("HSET", prefix+"tb:{p:burst:x}", "tokens", "3", "ts", "123")
	// Not a hash.
	do("SET", prefix+"fw:{p:api:tampered}", "1", "PX", "60000")
	// A large request-id set.
	big := []string{"HSET", prefix + "fw:{p:api:busy}", "used", "300", "policy", "1000:60000", "ids", "300"}
	for i := range 300 {
		big = append(big, "r:req-"+strconv.Itoa(i), "1:"+strconv.Itoa(i+1))
	}
	do(big...)
	do("PEXPIRE", prefix+"fw:{p:api:busy}", "60000")
	// Outside the prefix: never looked at, never touched.
	do("SET", "other:fw:{p:api:x}", "1")
	do("SET", strings.TrimSuffix(prefix, ":")+"x", "1")
}

func TestDoctorFindsAndFixesBrokenKeys(t *testing.T) {
	r := redistest.Start(t)
	prefix := "q[1]*:" // glob characters must match literally
	seedBrokenKeys(t, r, prefix)
	c := r.Client(t)
	ctx := context.Background()

	rep, err := Run(ctx, c, Options{KeyPrefix: prefix, ScanCount: 3, Top: 2})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Keys != 10 || rep.Problems != 3 {
		t.Fatalf("keys %d, problems %d; want 10 keys and 3 problems: %+v", rep.Keys, rep.Problems, rep)
	}
	if len(rep.NoTTL) != 2 || rep.NoTTL[0].Key != prefix+"fw:{p:login:locked-out}" || rep.NoTTL[0].Algorithm != "fixed_window" ||
		rep.NoTTL[1].Key != prefix+"tb:{p:burst:x}" || rep.NoTTL[1].Algorithm != "token_bucket" || rep.NoTTL[0].Fixed {
		t.Fatalf("no TTL = %+v", rep.NoTTL)
	}
	if len(rep.WrongType) != 1 || rep.WrongType[0].Key != prefix+"fw:{p:api:tampered}" || rep.WrongType[0].Type != "string" {
		t.Fatalf("wrong type = %+v", rep.WrongType)
	}
	if len(rep.Largest) != 1 || rep.Largest[0].RequestIDs != 300 || rep.Largest[0].Fields != 303 {
		t.Fatalf("largest = %+v, want the busy window with 300 request ids", rep.Largest)
	}
	counts := map[string]int64{}
	for _, p := range rep.Policies {
		name := p.Algorithm + "/" + p.Policy
		if p.Inline {
			name += "(inline)"
		}
		counts[name] = p.Keys
	}
	want := map[string]int64{"fixed_window/api": 7, "fixed_window/login": 1, "fixed_window/(inline)": 1, "token_bucket/burst": 1}
	if len(counts) != len(want) {
		t.Fatalf("per policy = %v, want %v", counts, want)
	}
	for k, n := range want {
		if counts[k] != n {
			t.Fatalf("per policy = %v, want %v", counts, want)
		}
	}
	// Without --fix nothing was written.
	if pttl(t, r, prefix+"fw:{p:login:locked-out}") != -1 {
		t.Fatal("a TTL was set without Fix")
	}

	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"10 keys under", "keys without a TTL: 2", "run with --fix", "wrong type", "300 request ids", "(inline)", "3 problems found"} {
		if !strings.Contains(text.String(), s) {
			t.Errorf("text report lacks %q:\n%s", s, text.String())
		}
	}

	rep, err = Run(ctx, c, Options{KeyPrefix: prefix, Fix: true, DefaultTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Problems != 3 || !rep.NoTTL[0].Fixed || rep.NoTTL[0].TTLMS != 30000 || !rep.NoTTL[1].Fixed || rep.NoTTL[1].TTLMS != 3600000 {
		t.Fatalf("fix: %+v; want the window's own 30000 ms, and the default 1h for the token bucket", rep.NoTTL)
	}
	for key, max := range map[string]int64{prefix + "fw:{p:login:locked-out}": 30000, prefix + "tb:{p:burst:x}": 3600000} {
		if ttl := pttl(t, r, key); ttl < 1 || ttl > max {
			t.Fatalf("PTTL %s = %d after fix, want 1..%d", key, ttl, max)
		}
	}
	if typ, _ := r.Do(t, "TYPE", prefix+"fw:{p:api:tampered}").ToString(); typ != "string" {
		t.Fatal("the key of the wrong type was touched")
	}
	if ttl := pttl(t, r, "other:fw:{p:api:x}"); ttl != -1 {
		t.Fatal("a key outside the prefix was touched")
	}

	rep, err = Run(ctx, c, Options{KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.NoTTL) != 0 || rep.Problems != 1 {
		t.Fatalf("after fix: %+v, want only the wrong-type key left", rep)
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Problems != 1 || back.Keys != 10 {
		t.Fatalf("JSON report %s: %v", js.String(), err)
	}
}

func TestDoctorOnACleanPrefix(t *testing.T) {
	r := redistest.Start(t)
	rep, err := Run(context.Background(), r.Client(t), Options{KeyPrefix: "quotad:"})
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if rep.Keys != 0 || rep.Problems != 0 || !strings.Contains(text.String(), "no problems found") {
		t.Fatalf("empty redis: %+v\n%s", rep, text.String())
	}
}

func TestParseKey(t *testing.T) {
	for rest, want := range map[string]PolicyKeys{
		"fw:{p:api:alice}":      {Algorithm: "fixed_window", Policy: "api"},
		"fw:{p:api:a:b:c}":      {Algorithm: "fixed_window", Policy: "api"},
		"fw:{i:alice}":          {Algorithm: "fixed_window", Inline: true},
		"cc:{p:jobs.v2:worker}": {Algorithm: "concurrency", Policy: "jobs.v2"},
		"zz:{p:api:x}":          {Algorithm: "unknown", Policy: "api"},
		"fw:alice":              {Algorithm: "fixed_window", Other: true},
		"fw:p:api:{t-42}:alice": {Algorithm: "fixed_window", Policy: "api"},
		"tb:i:{t-42}":           {Algorithm: "token_bucket", Inline: true},
		"stray":                 {Algorithm: "unknown", Other: true},
	} {
		if got := parseKey(rest); got != want {
			t.Errorf("parseKey(%q) = %+v, want %+v", rest, got, want)
		}
	}
}

func pttl(t *testing.T, r *redistest.Server, key string) int64 {
	t.Helper()
	v, err := r.Do(t, "PTTL", key).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The records reservations of allotments write are state, not problems:
// doctor counts them and reports nothing wrong.
func TestDoctorKnowsReservations(t *testing.T) {
	r := redistest.Start(t)
	key := "quotad:fw:{p:api:alice}"
	r.Do(t, "HSET", key, "used", "40", "policy", "100:60000", "ids", "1", "r:x", "1:1", "a:0123456789abcdef", "3:39")
	r.Do(t, "PEXPIRE", key, "60000")
	rep, err := Run(context.Background(), r.Client(t), Options{KeyPrefix: "quotad:"})
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if rep.Problems != 0 || len(rep.WrongType) != 0 || rep.Reservations != 1 || len(rep.Largest) != 1 || rep.Largest[0].RequestIDs != 1 {
		t.Fatalf("a window with a reservation: %+v\n%s", rep, text.String())
	}
	if !strings.Contains(text.String(), "allotment reservations held by sidecars: 1") {
		t.Fatalf("text report:\n%s", text.String())
	}
}
