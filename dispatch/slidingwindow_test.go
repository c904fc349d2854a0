package dispatch

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"quotad/integration/redistest"
	"quotad/policy"
	"quotad/protocol"
)

// The longest window: its periods, aligned to Redis's clock, end every 31
// days, so no test here crosses a boundary.
const swInline = `"algorithm":"sliding_window","limit":3,"window_ms":2678400000`

func TestSlidingWindowThroughTheDispatcher(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r)
	d := newDispatcher(t, st, nil, nil)
	c := r.Client(t)
	t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, c, "qt:") })

	o := decide(t, d, `{"op":"take","subject":"u",`+swInline+`,"cost":2,"request_id":"a"}`)
	if o.Failed() || !o.Allowed || o.Algorithm != "sliding_window" || o.Limit != 3 || o.Used != 2 || o.Remaining != 1 ||
		o.ResetMS <= 2678400000 || o.ResetMS > 2*2678400000 {
		t.Fatalf("first take = %+v", o)
	}
	rep := decodeReply(t, string(o.AppendReply(nil, nil)))
	if !rep.Allowed || rep.Used != 2 || rep.Remaining != 1 || rep.Limit != 3 {
		t.Fatalf("reply = %+v", rep)
	}
	if o := decide(t, d, `{"op":"take","subject":"u",`+swInline+`,"cost":2,"request_id":"a"}`); !o.Replay || o.Used != 2 {
		t.Fatalf("replay = %+v", o)
	}
	if o := decide(t, d, `{"op":"take","subject":"u",`+swInline+`,"cost":1,"request_id":"a"}`); o.Code != protocol.CodeConflict {
		t.Fatalf("same id, other cost = %+v, want CONFLICT", o)
	}
	if o := decide(t, d, `{"op":"take","subject":"u","algorithm":"sliding_window","limit":4,"window_ms":2678400000}`); o.Code != protocol.CodePolicy {
		t.Fatalf("other inline limits on a live window = %+v, want POLICY", o)
	}
	if o := decide(t, d, `{"op":"take","subject":"u",`+swInline+`,"cost":4}`); o.Code != protocol.CodeInvalid {
		t.Fatalf("cost above the limit = %+v, want INVALID", o)
	}

	// Redis denies, and says until when; a denial is never answered from
	// memory, since the estimate falls while it holds.
	o = decide(t, d, `{"op":"take","subject":"u",`+swInline+`,"cost":2}`)
	// 2 of 3 used: a take of 2 fits once the 2, weighted in the next
	// period, fall to 1: half-way through it.
	if end := o.ResetMS - 2678400000; o.Allowed || o.Local || o.Used != 2 || o.RetryAfterMS != end+2678400000/2 {
		t.Fatalf("take over the limit = %+v, want denied until half-way through the next period", o)
	}
	o = decide(t, d, `{"op":"take","subject":"u",`+swInline+`,"cost":3}`)
	if o.Allowed || o.Local || o.RetryAfterMS <= 0 {
		t.Fatalf("a larger take after a denial = %+v, want denied by Redis", o)
	}
	if o := decide(t, d, `{"op":"take","subject":"u",`+swInline+`,"cost":1}`); !o.Allowed || o.Local || o.Used != 3 {
		t.Fatalf("a smaller take = %+v, want Redis to accept it", o)
	}
	if o := decide(t, d, `{"op":"peek","subject":"u",`+swInline+`}`); o.Failed() || o.Used != 3 || o.Remaining != 0 || o.ResetMS <= 0 {
		t.Fatalf("peek = %+v", o)
	}
}

func TestSlidingWindowPolicy(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r)
	parse := func(src string) *policy.Config {
		t.Helper()
		cfg, err := policy.ParseConfig([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	d := newDispatcher(t, st, parse("policies:\n  api:\n    algorithm: sliding_window\n    limit: 2\n    window: 744h\n    max_request_ids: 1\n"), nil)
	c := r.Client(t)
	t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, c, "qt:") })

	if o := decide(t, d, `{"op":"take","subject":"u","policy":"api","request_id":"a"}`); !o.Allowed || o.Algorithm != "sliding_window" || o.Policy != "api" {
		t.Fatalf("take = %+v", o)
	}
	if o := decide(t, d, `{"op":"take","subject":"u","policy":"api","request_id":"b"}`); o.Code != protocol.CodeRequestIDsFull {
		t.Fatalf("second id under max_request_ids 1 = %+v, want REQUEST_IDS_FULL", o)
	}
	decide(t, d, `{"op":"take","subject":"u","policy":"api"}`)
	if o := decide(t, d, `{"op":"take","subject":"u","policy":"api"}`); o.Allowed {
		t.Fatalf("take over the limit = %+v", o)
	}
	if o := decide(t, d, `{"op":"take","subject":"u","policy":"api"}`); o.Allowed || o.Local {
		t.Fatalf("repeat = %+v, want denied by Redis", o)
	}
	// The operator raises the limit: it applies at once, to the same counts.
	d.SetConfig(parse("policies:\n  api:\n    algorithm: sliding_window\n    limit: 3\n    window: 744h\n"))
	if o := decide(t, d, `{"op":"take","subject":"u","policy":"api"}`); !o.Allowed || o.Used != 3 {
		t.Fatalf("take under the raised limit = %+v, want allowed, used 3", o)
	}

}

func TestSlidingWindowShadow(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r)
	cfg, err := policy.ParseConfig([]byte("policies:\n  watch:\n    algorithm: sliding_window\n    limit: 1\n    window: 744h\n    mode: shadow\n"))
	if err != nil {
		t.Fatal(err)
	}
	d := newDispatcher(t, st, cfg, nil)
	c := r.Client(t)
	t.Cleanup(func() { redistest.AssertAllKeysHaveTTL(t, c, "qt:") })
	if o := decide(t, d, `{"op":"take","subject":"s","policy":"watch"}`); !o.Allowed || !o.ShadowAllowed {
		t.Fatalf("first take = %+v", o)
	}
	if o := decide(t, d, `{"op":"take","subject":"s","policy":"watch"}`); !o.Allowed || !o.Shadow || o.ShadowAllowed || o.RetryAfterMS != 0 {
		t.Fatalf("take over the limit in shadow mode = %+v, want allowed, shadow denied", o)
	}
}

func TestSlidingWindowDeniedForHoldsNothing(t *testing.T) {
	for _, retry := range []int64{0, 1, 2, 1000} {
		if hold, _ := (slidingWindow{}).DeniedFor(&Outcome{RetryAfterMS: retry}, 7); hold != 0 {
			t.Errorf("DeniedFor(retry_after_ms %d) holds %v, want 0: the estimate falls while it would hold", retry, hold)
		}
	}
}

// The decision metrics are labelled by algorithm.
func TestSlidingWindowMetrics(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r)
	reg := prometheus.NewRegistry()
	d := New(Options{Store: st, AllowInline: true, Logger: zap.NewNop(), Registry: reg})
	t.Cleanup(d.Close)
	decide(t, d, `{"op":"take","subject":"m",`+swInline+`,"cost":3}`)
	decide(t, d, `{"op":"take","subject":"m",`+swInline+`}`)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "quotad_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got[labels["algorithm"]+"/"+labels["result"]] += m.GetCounter().GetValue()
		}
	}
	if got["sliding_window/allowed"] != 1 || got["sliding_window/denied"] != 1 {
		t.Fatalf("takes by algorithm and result = %v, want one allowed and one denied sliding_window take", got)
	}
}
