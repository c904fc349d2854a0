package dispatch

import (
	"slices"
	"testing"

	"quotad/integration/redistest"
	"quotad/luascript"
	"quotad/protocol"
)

// inlineOf gives each registered algorithm's inline limits, for
// TestEveryAlgorithmHasEveryPiece. A new algorithm adds its line here.
var inlineOf = map[string]string{
	"fixed_window":   `"limit":2,"window_ms":60000`,
	"token_bucket":   `"algorithm":"token_bucket","rate":1,"period_ms":3600000,"burst":2`,
	"concurrency":    `"algorithm":"concurrency","limit":2,"lease_ms":60000`,
	"sliding_window": `"algorithm":"sliding_window","limit":2,"window_ms":60000`,
	"calendar":       `"algorithm":"calendar","limit":2,"period":"month"`,
}

// Every registered algorithm has the pieces the package comment's
// checklist lists: inline fields, a key, a take and a peek that Redis
// decides and the parser reads, a take body that a take of several checks
// can run beside another algorithm's, and header fields. A settle is
// optional (luascript.Settles), and so is an algorithm's own header item.
func TestEveryAlgorithmHasEveryPiece(t *testing.T) {
	r := redistest.Start(t)
	d := newDispatcher(t, openStore(t, r), nil, nil)
	names := make([]string, 0, len(algorithms))
	for name := range algorithms {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		limits, ok := inlineOf[name]
		if !ok {
			t.Errorf("algorithm %s has no inline limits in inlineOf", name)
			continue
		}
		if algorithms[name].Name() != name {
			t.Errorf("algorithm registered as %s is named %s", name, algorithms[name].Name())
		}
		addr := `"subject":"every-` + name + `",` + limits
		at := addr + `,"request_id":"r1"`
		o := decide(t, d, `{"op":"take","headers":true,`+at+`}`)
		if o.Failed() || !o.Allowed || o.Used != 1 || o.Algorithm != name {
			t.Errorf("%s: take = %+v", name, o)
			continue
		}
		if h := o.headerFields(); h == nil || h.Policy == "" || h.RateLimit == "" {
			t.Errorf("%s: take's header fields = %+v", name, h)
		}
		if p := decide(t, d, `{"op":"peek",`+addr+`}`); p.Failed() || p.Used != 1 {
			t.Errorf("%s: peek = %+v", name, p)
		}
		o = decide(t, d, `{"op":"take","request_id":"r2","checks":[{`+addr+`},{"subject":"other-`+name+`",`+inlineOf["fixed_window"]+`}]}`)
		if o.Failed() || !o.Allowed || len(o.Checks) != 2 || o.Checks[0].Used != 2 || o.Checks[0].Algorithm != name {
			t.Errorf("%s: take of two checks = %+v", name, o)
		}
		if luascript.Settles(name) {
			if s := decide(t, d, `{"op":"settle","cost":0,`+at+`}`); s.Failed() || !s.Settled {
				t.Errorf("%s: settle = %+v", name, s)
			}
		} else if s := decide(t, d, `{"op":"settle","cost":0,`+at+`}`); s.Code != protocol.CodeInvalid {
			t.Errorf("%s: settle of an algorithm that does not settle = %+v, want INVALID", name, s)
		}
	}
}
