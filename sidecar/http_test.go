package sidecar

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"quotad/integration/redistest"
	"quotad/luascript"
)

// httpGet runs one GET against h.
func httpGet(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, err := io.ReadAll(rec.Result().Body)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Code, string(body)
}

func wantHTTP(t *testing.T, h http.Handler, path string, code int, body string) {
	t.Helper()
	if c, b := httpGet(t, h, path); c != code || !strings.Contains(b, body) {
		t.Fatalf("GET %s: %d %q; want %d and %q", path, c, b, code, body)
	}
}

// scriptsLoaded reports whether Redis holds every decision script.
func scriptsLoaded(t *testing.T, r *redistest.Server) bool {
	t.Helper()
	rc := r.Client(t)
	var shas []string
	for _, src := range luascript.Sources() {
		sum := sha1.Sum([]byte(src))
		shas = append(shas, hex.EncodeToString(sum[:]))
	}
	n, err := rc.Do(context.Background(), rc.B().ScriptExists().Sha1(shas...).Build()).AsIntSlice()
	if err != nil {
		t.Fatalf("SCRIPT EXISTS: %v", err)
	}
	for _, v := range n {
		if v != 1 {
			return false
		}
	}
	return len(n) == len(shas)
}

// A Redis outage must not take the pod out of its Service: /readyz and
// ping's "ready" stay true, while /redisz, redis_ok and quotad_redis_up
// report the outage.
func TestReadyzStaysReadyWhileRedisIsDown(t *testing.T) {
	r := redistest.Start(t)
	st := openStore(t, r.URL())
	ts := startServer(t, Options{Store: st})
	c := ts.dial(t)
	waitRedisOK(t, c)
	h := ts.HTTPHandler()

	wantHTTP(t, h, "/healthz", http.StatusOK, "ok")
	wantHTTP(t, h, "/readyz", http.StatusOK, "ready")
	wantHTTP(t, h, "/redisz", http.StatusOK, "redis ok")
	if p := c.call(`{"op":"ping"}`); !p.Ready || !p.RedisOK {
		t.Fatalf("ping with redis up: %+v, want ready and redis_ok", p)
	}

	// Scripts flushed from Redis (as by a restart): /redisz loads them.
	if err := r.Do(t, "SCRIPT", "FLUSH").Error(); err != nil {
		t.Fatal(err)
	}
	if scriptsLoaded(t, r) {
		t.Fatal("the scripts are still there after SCRIPT FLUSH")
	}
	wantHTTP(t, h, "/redisz", http.StatusOK, "redis ok")
	if !scriptsLoaded(t, r) {
		t.Fatal("/redisz answered 200 but did not load the scripts")
	}
	// Redis holds them: the next check asks (SCRIPT EXISTS) and sends no
	// script's text.
	r.ResetStats(t)
	wantHTTP(t, h, "/redisz", http.StatusOK, "redis ok")
	if stats, err := r.Do(t, "INFO", "commandstats").ToString(); err != nil || strings.Contains(stats, "cmdstat_script|load:") {
		t.Fatalf("/redisz of a Redis that holds every script loaded one: %v\n%s", err, stats)
	}

	r.Stop(t)
	waitFor(t, "/redisz to report redis down", func() bool {
		code, body := httpGet(t, h, "/redisz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "redis is not answering")
	})
	wantHTTP(t, h, "/readyz", http.StatusOK, "ready")
	wantHTTP(t, h, "/healthz", http.StatusOK, "ok")
	if _, body := httpGet(t, h, "/metrics"); !strings.Contains(body, "\nquotad_redis_up 0\n") {
		t.Fatalf("/metrics with redis stopped lacks quotad_redis_up 0:\n%s", body)
	}
	p := c.call(`{"op":"ping"}`)
	if !p.OK || !p.Ready || p.RedisOK || p.RedisError == "" {
		t.Fatalf("ping with redis stopped: %+v; want ready, redis_ok false and a redis_error", p)
	}
}

// Ready means serving the socket: a server that has not started serving
// is not ready, and one that drains is not either; /healthz answers
// throughout.
func TestReadyzFollowsServingAndDraining(t *testing.T) {
	st := openStore(t, "")
	idle := NewServer(Options{Store: st, Logger: zaptest.NewLogger(t)})
	h := idle.HTTPHandler()
	wantHTTP(t, h, "/readyz", http.StatusServiceUnavailable, "not serving its socket")
	wantHTTP(t, h, "/healthz", http.StatusOK, "ok")
	idle.Close()

	ts := startServer(t, Options{Store: st})
	c := ts.dial(t)
	h = ts.HTTPHandler()
	waitFor(t, "/readyz once serving", func() bool {
		code, _ := httpGet(t, h, "/readyz")
		return code == http.StatusOK
	})
	// The embedded store is Redis enough: once it is up (it starts in the
	// background, as a Redis is connected to), its health is ok.
	waitRedisOK(t, c)
	wantHTTP(t, h, "/redisz", http.StatusOK, "redis ok")
	if p := c.call(`{"op":"ping"}`); !p.Ready {
		t.Fatalf("ping on a serving embedded store: %+v, want ready", p)
	}

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	c.nc.Close()
	if err := ts.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	wantHTTP(t, h, "/readyz", http.StatusServiceUnavailable, "draining")
	wantHTTP(t, h, "/healthz", http.StatusOK, "ok")
}
