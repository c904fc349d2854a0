package luascript_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"testing"

	"quotad/integration/redistest"
	"quotad/luascript"
)

func TestLoadPutsEveryScriptInRedis(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if err := e.c.Do(ctx, e.c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	var shas []string
	for _, src := range luascript.Sources() {
		sum := sha1.Sum([]byte(src))
		shas = append(shas, hex.EncodeToString(sum[:]))
	}
	if len(shas) < 2 {
		t.Fatalf("want the take and peek scripts at least, got %d scripts", len(shas))
	}
	exists := func() []int64 {
		v, err := e.c.Do(ctx, e.c.B().ScriptExists().Sha1(shas...).Build()).AsIntSlice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for i, v := range exists() {
		if v != 0 {
			t.Fatalf("script %d exists after SCRIPT FLUSH", i)
		}
	}
	if err := luascript.Load(ctx, e.c); err != nil {
		t.Fatal(err)
	}
	for i, v := range exists() {
		if v != 1 {
			t.Fatalf("script %d not loaded by Load", i)
		}
	}
}

func TestLoadFailsWhenRedisRefusesScripts(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	// An ACL user that may not load scripts, as a locked-down Redis has.
	if err := e.c.Do(ctx, e.c.B().Arbitrary("ACL", "SETUSER", "default", "-script").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.c.Do(context.Background(), e.c.B().Arbitrary("ACL", "SETUSER", "default", "+@all").Build()).Error()
	})
	if err := luascript.Load(ctx, e.c); err == nil {
		t.Fatal("Load succeeded although the user may not run SCRIPT")
	}
}

// The embedded store cannot compile a shebang's flags: Load loads those
// scripts without them, as the calls run them there.
func TestLoadOnTheEmbeddedStore(t *testing.T) {
	_, c := startMiniredis(t)
	if err := luascript.Load(context.Background(), c); err != nil {
		t.Fatalf("Load on miniredis: %v", err)
	}
}

// Load asks which scripts a node holds (SCRIPT EXISTS) and loads only the
// missing ones: none when it holds them all, so that a health check polled
// over a slow link sends no script's text.
func TestLoadLoadsOnlyWhatIsMissing(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	if err := luascript.Load(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	srv.ResetStats(t)
	if err := luascript.Load(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	if n := srv.CommandCalls(t, "script|load"); n != 0 {
		t.Fatalf("%d SCRIPT LOADs on a Redis that holds every script, want none", n)
	}
	srcs := luascript.Sources()
	if err := c.Do(t.Context(), c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for _, src := range srcs[1:] {
		if err := c.Do(t.Context(), c.B().ScriptLoad().Script(src).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	srv.ResetStats(t)
	if err := luascript.Load(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	if n := srv.CommandCalls(t, "script|load"); n != 1 {
		t.Fatalf("%d SCRIPT LOADs for one missing script, want 1", n)
	}
	if !allLoaded(t, c) {
		t.Fatal("a script is missing after Load")
	}
}
