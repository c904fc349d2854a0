package dispatch

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"quotad/integration/redistest"
	"quotad/limits"
	"quotad/policy"
	"quotad/protocol"
)

func render(o *Outcome) string { return string(o.AppendReply(nil, nil)) }

func TestSettleEveryAlgorithm(t *testing.T) {
	r := redistest.Start(t)
	d := newDispatcher(t, openStore(t, r), nil, nil)
	for _, tc := range []struct {
		name, limits string
	}{
		{"fixed window", `"limit":10,"window_ms":60000`},
		{"sliding window", `"algorithm":"sliding_window","limit":10,"window_ms":2678400000`},
		{"calendar", `"algorithm":"calendar","limit":10,"period":"month"`},
		{"token bucket", `"algorithm":"token_bucket","rate":1,"period_ms":3600000,"burst":10`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := `{"subject":"s-` + strings.ReplaceAll(tc.name, " ", "-") + `",` + tc.limits + `,"request_id":"job-1"}`
			if o := decide(t, d, `{"op":"take","cost":6,`+at[1:]); !o.Allowed || o.Used != 6 {
				t.Fatalf("take = %+v", o)
			}
			o := decide(t, d, `{"op":"settle","cost":2,`+at[1:])
			if o.Failed() || !o.Settled || o.Replay || o.Reserved != 6 || o.Used != 2 || o.Remaining != 8 || o.Result() != ResultSettled {
				t.Fatalf("settle = %+v", o)
			}
			line := render(&o)
			if !strings.HasPrefix(line, `{"ok":true,"settled":true,"replay":false,"reserved":6,"limit":10,"used":2,"remaining":8,`) {
				t.Fatalf("reply %s", line)
			}
			if o := decide(t, d, `{"op":"settle","cost":2,`+at[1:]); !o.Replay || o.Used != 2 || o.Result() != ResultReplay {
				t.Fatalf("settle again = %+v", o)
			}
			if o := decide(t, d, `{"op":"settle","cost":3,`+at[1:]); o.Code != protocol.CodeConflict {
				t.Fatalf("settle at another cost = %+v, want CONFLICT", o)
			}
			other := strings.Replace(at, "job-1", "job-9", 1)
			if o := decide(t, d, `{"op":"settle","cost":0,`+other[1:]); o.Failed() || o.Settled || o.Used != 2 || o.Result() != ResultNotSettled {
				t.Fatalf("settle of a take never accepted = %+v, want settled false", o)
			}
			if o := decide(t, d, `{"op":"settle","cost":2,"headers":true,`+at[1:]); o.headerFields() == nil || o.headerFields().RetryAfter != "" {
				t.Fatalf("settle with headers = %+v", o.headerFields())
			}
		})
	}
}

func TestSettleOfALeaseIsInvalid(t *testing.T) {
	r := redistest.Start(t)
	d := newDispatcher(t, openStore(t, r), nil, nil)
	o := decide(t, d, `{"op":"settle","subject":"j","algorithm":"concurrency","limit":1,"lease_ms":1000,"request_id":"l","cost":1}`)
	if o.Code != protocol.CodeInvalid || !strings.Contains(o.Message, "release") {
		t.Fatalf("settle of a lease = %+v, want INVALID pointing at release", o)
	}
}

func TestSettleUnderANamedPolicy(t *testing.T) {
	r := redistest.Start(t)
	cfg, err := policy.ParseConfig([]byte("policies:\n  llm:\n    limit: 100\n    window: 1m\n"))
	if err != nil {
		t.Fatal(err)
	}
	d := newDispatcher(t, openStore(t, r), cfg, nil)
	decide(t, d, `{"op":"take","subject":"u","policy":"llm","cost":50,"request_id":"c1"}`)
	o := decide(t, d, `{"op":"settle","subject":"u","policy":"llm","cost":120,"request_id":"c1"}`)
	if !o.Settled || o.Used != 120 || o.Remaining != 0 || o.RetryAfterMS <= 0 || o.Policy != "llm" {
		t.Fatalf("settle past the limit = %+v", o)
	}
	if o := decide(t, d, `{"op":"take","subject":"u","policy":"llm"}`); o.Allowed {
		t.Fatalf("take after the overrun = %+v, want denied", o)
	}
}

// A settle that gives quota back drops the local denial of its key: the
// take it made possible is decided by Redis, and accepted.
func TestSettleDropsTheLocalDenial(t *testing.T) {
	r := redistest.Start(t)
	d := newDispatcher(t, openStore(t, r), nil, nil)
	const w = `"subject":"x","limit":3,"window_ms":60000`
	decide(t, d, `{"op":"take",`+w+`,"cost":3,"request_id":"big"}`)
	if o := decide(t, d, `{"op":"take",`+w+`}`); o.Allowed || o.Local {
		t.Fatalf("take on a full window = %+v, want denied by Redis", o)
	}
	if o := decide(t, d, `{"op":"take",`+w+`}`); o.Allowed || !o.Local {
		t.Fatalf("take again = %+v, want denied from memory", o)
	}
	if o := decide(t, d, `{"op":"settle",`+w+`,"cost":1,"request_id":"big"}`); !o.Settled || o.Used != 1 {
		t.Fatalf("settle = %+v", o)
	}
	if o := decide(t, d, `{"op":"take",`+w+`}`); !o.Allowed || o.Local {
		t.Fatalf("take after the settle = %+v, want allowed by Redis", o)
	}
}

// A take that ran before a settle on its shard is not remembered as
// denied: what it found taken may have been given back since.
func TestADenialFromBeforeASettleIsNotRemembered(t *testing.T) {
	d := newLocalDeny(64)
	cfg := &policy.Config{}
	dec := takeOfOne(cfg, time.Now(), "k", limits.Window{Limit: 1, WindowMS: 60000},
		Outcome{Op: protocol.OpTake, Limit: 1, Used: 1, ResetMS: 60000})
	dec.checks[0].denyGen = d.generation("k")
	d.forget("k") // a settle on k finished while the take was at Redis
	hold, need := fixedWindow{}.DeniedFor(&dec.Out, 1)
	d.record(dec, 0, hold, need)
	if d.answer(dec, 0, time.Now()) {
		t.Fatal("a denial found before a settle was remembered")
	}
	dec.checks[0].denyGen = d.generation("k")
	d.record(dec, 0, hold, need)
	if !d.answer(dec, 0, time.Now()) {
		t.Fatal("a denial after the settle was not remembered")
	}
	d.forget("k")
	if d.answer(dec, 0, time.Now()) {
		t.Fatal("a settle left the denial of its key")
	}
}

// 50 callers each take 5 and settle lower, on one subject: no take is
// accepted past the limit, and the final use is the sum of the costs
// settled.
func TestConcurrentTakeThenSettleLower(t *testing.T) {
	r := redistest.Start(t)
	d := newDispatcher(t, openStore(t, r), nil, nil)
	const w = `"subject":"race","limit":60,"window_ms":60000`
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		settled int64
		bad     []string
	)
	for i := range 50 {
		wg.Go(func() {
			id := fmt.Sprintf(`"request_id":"r%d"`, i)
			o := decide(t, d, `{"op":"take",`+w+`,"cost":5,`+id+`}`)
			if o.Failed() || !o.Allowed {
				return
			}
			cost := int64(i % 5)
			s := decide(t, d, fmt.Sprintf(`{"op":"settle",%s,"cost":%d,%s}`, w, cost, id))
			mu.Lock()
			defer mu.Unlock()
			if o.Used > 60 {
				bad = append(bad, fmt.Sprintf("take %d accepted at used %d", i, o.Used))
			}
			if !s.Settled || s.Failed() {
				bad = append(bad, fmt.Sprintf("settle %d = %+v", i, s))
				return
			}
			settled += cost
		})
	}
	wg.Wait()
	for _, b := range bad {
		t.Error(b)
	}
	if p := decide(t, d, `{"op":"peek",`+w+`}`); p.Used != settled {
		t.Fatalf("used %d after all settles, want the sum of the settled costs %d", p.Used, settled)
	}
}

// A take of several limits is settled per check: one settle per check,
// with that check's addressing and the take's request_id, each of which
// settles, replays and conflicts on its own.
func TestSettleATakeOfSeveralLimitsPerCheck(t *testing.T) {
	r := redistest.Start(t)
	d := newDispatcher(t, openStore(t, r), nil, nil)
	const (
		user   = `"subject":"user-1","limit":1000,"window_ms":60000`
		tenant = `"subject":"tenant-1","algorithm":"token_bucket","rate":5000,"period_ms":2678400000,"burst":5000`
	)
	o := decide(t, d, `{"op":"take","cost":800,"request_id":"chat-1","checks":[{`+user+`},{`+tenant+`}]}`)
	if o.Failed() || !o.Allowed || len(o.Checks) != 2 || o.Checks[0].Used != 800 || o.Checks[1].Used != 800 {
		t.Fatalf("take of two limits = %+v", o)
	}
	u := decide(t, d, `{"op":"settle",`+user+`,"request_id":"chat-1","cost":300}`)
	if !u.Settled || u.Reserved != 800 || u.Used != 300 {
		t.Fatalf("settle of the user's check = %+v", u)
	}
	tn := decide(t, d, `{"op":"settle",`+tenant+`,"request_id":"chat-1","cost":300}`)
	if !tn.Settled || tn.Reserved != 800 || tn.Remaining != 4700 {
		t.Fatalf("settle of the tenant's check = %+v", tn)
	}
	if again := decide(t, d, `{"op":"settle",`+user+`,"request_id":"chat-1","cost":300}`); !again.Replay || again.Used != 300 {
		t.Fatalf("the user's settle again = %+v", again)
	}
	if other := decide(t, d, `{"op":"settle",`+tenant+`,"request_id":"chat-1","cost":301}`); other.Code != protocol.CodeConflict {
		t.Fatalf("the tenant's settle at another cost = %+v, want CONFLICT", other)
	}
	// The take itself is still a replay of both checks.
	if o := decide(t, d, `{"op":"take","cost":800,"request_id":"chat-1","checks":[{`+user+`},{`+tenant+`}]}`); !o.Replay {
		t.Fatalf("the take again = %+v, want a replay", o)
	}
	var req protocol.Request
	if err := protocol.Decode([]byte(`{"op":"settle","request_id":"chat-1","cost":1,"checks":[{`+user+`}]}`), &req); !errors.Is(err, protocol.ErrInvalid) {
		t.Fatalf("a settle of checks decodes with %v, want INVALID: a settle names one check", err)
	}
}
