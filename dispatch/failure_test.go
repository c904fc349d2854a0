package dispatch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/redis/rueidis"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"quotad/integration/redistest"
	"quotad/limits"
	"quotad/luascript"
	"quotad/protocol"
	"quotad/store"
)

// redisRefusals makes a real redis-server refuse a take in each way the
// sidecar maps, and returns the errors FixedWindowTake got, by name.
func redisRefusals(t *testing.T) map[string]error {
	t.Helper()
	r := redistest.Start(t, redistest.WithArgs("--enable-debug-command", "local"))
	c := r.Client(t)
	take := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		_, err := luascript.Take(ctx, c, limits.FixedWindow, luascript.Args{Key: "refused", Limit: 5, WindowMS: 60000, Cost: 1, MaxRequestIDs: 10})
		return err
	}
	do := func(args ...string) {
		t.Helper()
		if err := r.Do(t, args...).Error(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	isReply := func(err error, prefix string) bool {
		var re *rueidis.RedisError
		return errors.As(err, &re) && strings.HasPrefix(re.Error(), prefix)
	}
	refusal := func(what, prefix string) error {
		t.Helper()
		err := take()
		if !isReply(err, prefix) {
			t.Fatalf("take with %s = %v, want a %s error reply", what, err, prefix)
		}
		return err
	}
	if err := take(); err != nil {
		t.Fatalf("take: %v", err)
	}
	errs := map[string]error{}

	do("CONFIG", "SET", "maxmemory", "1")
	errs["OOM"] = refusal("maxmemory 1", "OOM")
	do("CONFIG", "SET", "maxmemory", "0")

	// A replica of a master that does not exist keeps refusing writes.
	do("REPLICAOF", "127.0.0.1", "1")
	errs["READONLY"] = refusal("a read-only replica", "READONLY")
	do("REPLICAOF", "NO", "ONE")

	// A script that never ends makes Redis answer BUSY until SCRIPT KILL.
	do("CONFIG", "SET", "busy-reply-threshold", "10")
	busy := r.Client(t)
	looped := make(chan error, 1)
	go func() {
		looped <- busy.Do(context.Background(), busy.B().Eval().Script("while true do end").Numkeys(0).Build()).Error()
	}()
	waitFor(t, "Redis to answer BUSY", func() bool {
		err := take()
		if err != nil && !isReply(err, "BUSY") {
			t.Fatalf("take while a script runs = %v, want BUSY", err)
		}
		errs["BUSY"] = err
		return err != nil
	})
	killer := r.Client(t)
	waitFor(t, "SCRIPT KILL to stop the script", func() bool {
		return killer.Do(t.Context(), killer.B().ScriptKill().Build()).Error() == nil
	})
	if err := <-looped; err == nil {
		t.Fatal("the endless script returned without an error")
	}
	waitFor(t, "Redis to run takes again after the script", func() bool { return take() == nil })

	// While DEBUG RELOAD loads the dataset back, slowed down per key,
	// Redis answers LOADING between batches of keys.
	do("DEBUG", "POPULATE", "500", "filler")
	do("CONFIG", "SET", "loading-process-events-interval-bytes", "1024")
	loader := r.Client(t)
	for delayUS := 1000; errs["LOADING"] == nil; delayUS *= 2 {
		if delayUS > 16000 {
			t.Fatal("DEBUG RELOAD kept finishing before a take saw LOADING")
		}
		do("CONFIG", "SET", "key-load-delay", fmt.Sprint(delayUS))
		reloaded := make(chan error, 1)
		go func() {
			reloaded <- loader.Do(context.Background(), loader.B().Arbitrary("DEBUG", "RELOAD").Build()).Error()
		}()
	poll:
		for {
			select {
			case err := <-reloaded:
				if err != nil {
					t.Fatalf("DEBUG RELOAD: %v", err)
				}
				break poll // too quick for this machine: slow the next one down
			default:
			}
			if err := take(); err != nil {
				if !isReply(err, "LOADING") {
					t.Fatalf("take during DEBUG RELOAD = %v, want LOADING", err)
				}
				errs["LOADING"] = err
				if err := <-reloaded; err != nil {
					t.Fatalf("DEBUG RELOAD: %v", err)
				}
				break poll
			}
		}
	}
	do("CONFIG", "SET", "key-load-delay", "0")

	// A user without the right to run scripts: an operator's mistake.
	do("ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "+@all", "-@scripting")
	limited, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{r.Addr()}, Username: "noscripts", Password: "pw",
		DisableCache: true, ForceSingleClient: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer limited.Close()
	_, err = luascript.Take(t.Context(), limited, limits.FixedWindow, luascript.Args{Key: "refused", Limit: 5, WindowMS: 60000, Cost: 1, MaxRequestIDs: 10})
	if !isReply(err, "NOPERM") {
		t.Fatalf("take as a user without scripting = %v, want NOPERM", err)
	}
	errs["NOPERM"] = err
	return errs
}

func TestFailMapsErrorsToCodes(t *testing.T) {
	refused := redisRefusals(t)
	core, logs := observer.New(zapcore.ErrorLevel)
	srv := New(Options{Logger: zap.New(core)})
	defer srv.Close()
	draining := New(Options{Logger: zap.NewNop(), Draining: func() bool { return true }})
	draining.Close()

	const unknown = "outcome is unknown"
	for _, tc := range []struct {
		name string
		srv  *Dispatcher
		err  error
		want protocol.Code
		// takeMsg must be in the message of a take's reply ("" for no check).
		takeMsg string
	}{
		{"script INVALID", srv, &luascript.Error{Code: luascript.CodeInvalid, Message: "limit must be a decimal"}, protocol.CodeInvalid, "limit must be"},
		{"script CONFLICT", srv, &luascript.Error{Code: luascript.CodeConflict, Message: "request_id r1 was accepted with cost 2, not 1"}, protocol.CodeConflict, "cost 2"},
		{"script POLICY", srv, &luascript.Error{Code: luascript.CodePolicy, Message: "the live window has limit 2"}, protocol.CodePolicy, "limit 2"},
		{"script WRONGTYPE", srv, &luascript.Error{Code: luascript.CodeWrongType, Message: "key is not a quotad window"}, protocol.CodeWrongType, "not a quotad window"},
		{"script REQUEST_IDS_FULL", srv, &luascript.Error{Code: luascript.CodeRequestIDsFull, Message: "10000 request ids"}, protocol.CodeRequestIDsFull, "10000"},
		{"malformed script reply", srv, &luascript.Error{Code: luascript.CodeMalformedReply, Message: "fixed window take: want 5 integers"}, protocol.CodeInternal, "want 5 integers"},
		{"script code from a newer script", srv, &luascript.Error{Code: "SOMETHING_NEW", Message: "x"}, protocol.CodeInternal, ""},
		{"redis timeout", srv, fmt.Errorf("fixed window take: %w", context.DeadlineExceeded), protocol.CodeUnavailable, unknown},
		{"cancelled by shutdown", draining, fmt.Errorf("fixed window take: %w", context.Canceled), protocol.CodeShuttingDown, unknown},
		{"not connected yet", srv, store.ErrNotConnected, protocol.CodeUnavailable, "not connected"},
		{"breaker open", srv, store.ErrBreakerOpen, protocol.CodeUnavailable, "breaker open"},
		{"redis OOM says nothing was written", srv, refused["OOM"], protocol.CodeUnavailable, "nothing was written"},
		{"connection refused", srv, fmt.Errorf("fixed window take: %w", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}), protocol.CodeUnavailable, unknown},
		{"redis OOM", srv, refused["OOM"], protocol.CodeUnavailable, "OOM"},
		{"redis READONLY", srv, refused["READONLY"], protocol.CodeUnavailable, "READONLY"},
		{"redis BUSY", srv, refused["BUSY"], protocol.CodeUnavailable, "BUSY"},
		{"redis LOADING", srv, refused["LOADING"], protocol.CodeUnavailable, "LOADING"},
		{"redis NOPERM", srv, refused["NOPERM"], protocol.CodeInternal, "NOPERM"},
	} {
		for _, op := range []protocol.Op{protocol.OpTake, protocol.OpPeek} {
			before := logs.Len()
			o := Outcome{Op: op}
			tc.srv.fail(&o, tc.err)
			line := o.AppendReply(nil, []byte(`7`))
			if !strings.HasPrefix(string(line), `{"id":7,"ok":false,`) || !strings.HasSuffix(string(line), "}\n") || strings.Count(string(line), "\n") != 1 {
				t.Errorf("%s, %s: reply %q is not one error line echoing the id", tc.name, op, line)
				continue
			}
			got := decodeReply(t, string(line))
			if got.Error != tc.want {
				t.Errorf("%s, %s: code %s (%q), want %s", tc.name, op, got.Error, got.Message, tc.want)
			}
			if op == protocol.OpTake && !strings.Contains(got.Message, tc.takeMsg) {
				t.Errorf("%s, take: message %q does not contain %q", tc.name, got.Message, tc.takeMsg)
			}
			if op == protocol.OpPeek && strings.Contains(got.Message, unknown) {
				t.Errorf("%s, peek: message %q says the outcome is unknown, but a peek writes nothing", tc.name, got.Message)
			}
			// An operator learns of INTERNAL from the log; the rest are the
			// client's business.
			if logged := logs.Len() > before; logged != (tc.want == protocol.CodeInternal) {
				t.Errorf("%s, %s: logged an error: %v, want %v", tc.name, op, logged, tc.want == protocol.CodeInternal)
			}
		}
	}
}
