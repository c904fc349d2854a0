package luascript_test

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"quotad/limits"
	"quotad/luascript"
)

// Redis runs each script as one text: the peeks' flags line first, then the
// prelude with the bounds of quotad/limits, then the script's body.
func TestEveryScriptIsPreludeThenBody(t *testing.T) {
	e := setup(t)
	files, err := filepath.Glob("*.lua")
	if err != nil {
		t.Fatal(err)
	}
	prelude := mustRead(t, "prelude.lua")
	var helpers []string
	for _, m := range regexp.MustCompile(`(?m)^local function (\w+)\(`).FindAllStringSubmatch(prelude, -1) {
		helpers = append(helpers, m[1])
	}
	if len(helpers) < 8 {
		t.Fatalf("found the prelude helpers %v, want dec, num, fail, failed_read, redis_now, quorem, muldiv, gcra and sliding_window", helpers)
	}
	n := 0
	for _, name := range files {
		if name == "prelude.lua" || name == "pieces.lua" || name == "take_checks_redis.lua" {
			continue // joined into scripts, not one of its own
		}
		n++
		body, src := mustRead(t, name), luascript.ScriptText(name)
		if src == "" {
			t.Errorf("%s is not a registered script", name)
			continue
		}
		flagged := strings.HasPrefix(body, "#!lua flags=no-writes\n")
		if flagged != strings.HasPrefix(src, "#!lua flags=no-writes\n") {
			t.Errorf("%s: the flags line is not first in the script Redis runs", name)
		}
		if strings.Count(src, "#!") != strings.Count(body, "#!") {
			t.Errorf("%s: flags lines in the body and the script differ", name)
		}
		if !strings.Contains(src, prelude) || !strings.HasSuffix(src, strings.TrimPrefix(luascript.ScriptBody(name), "#!lua flags=no-writes\n")) {
			t.Errorf("%s: the script is not the prelude then the body", name)
		}
		// The bounds are the prelude's constants, never a script's literals.
		for _, v := range []int64{limits.MaxLimit, limits.MaxWindowMS, limits.MaxLeases, limits.MaxRequestIDs} {
			if regexp.MustCompile(`\b` + strconv.FormatInt(v, 10) + `\b`).MatchString(body) {
				t.Errorf("%s holds the bound %d as a literal", name, v)
			}
		}
		for _, helper := range helpers {
			if strings.Contains(body, "function "+helper+"(") {
				t.Errorf("%s defines its own %s, a prelude helper", name, helper)
			}
		}
		// A script's own error replies go through fail, and a failed read
		// of its key through failed_read; the batch driver, which answers
		// for no script, is the one exception.
		if name != "batch.lua" && strings.Contains(body, "redis.error_reply(") {
			t.Errorf("%s makes an error reply of its own instead of calling fail", name)
		}
	}
	// batch.lua is the driver of every batch script.
	if want := len(luascript.Sources()) + len(luascript.LazySources()) - len(luascript.BatchTexts()) + 1; n != want {
		t.Errorf("%d scripts on disk, %d in Sources and LazySources (the batch scripts as one)", n, want)
	}
	// Its code: its leading comment is for its file's readers.
	_, driver, _ := strings.Cut(mustRead(t, "batch.lua"), "\nlocal header")
	for name, src := range luascript.BatchTexts() {
		if !strings.Contains(src, prelude) || !strings.HasSuffix(src, driver) {
			t.Errorf("%s is not the prelude, its bodies, then batch.lua", name)
		}
	}

	// The constants are quotad/limits' values as Redis reads them.
	text := luascript.ScriptText("concurrency_release.lua")
	_, tail, _ := strings.Cut(text, "\n-- concurrency_release.lua\n")
	probe := strings.TrimSuffix(text, tail) + "return {MAX_LIMIT, MAX_WINDOW_MS, MAX_LEASES, MAX_REQUEST_ID_BYTES, MAX_REQUEST_IDS, MAX_EXACT == 2^53 - 1 and 1 or 0}"
	v, err := e.c.Do(t.Context(), e.c.B().Eval().Script(probe).Numkeys(0).Build()).ToArray()
	if err != nil || len(v) != 6 {
		t.Fatalf("constants: %v, %v", v, err)
	}
	for i, want := range []int64{limits.MaxLimit, limits.MaxWindowMS, limits.MaxLeases, limits.MaxRequestIDBytes, limits.MaxRequestIDs} {
		if got, err := v[i].AsInt64(); err != nil || got != want {
			t.Errorf("constant %d = %d, %v; want %d", i, got, err, want)
		}
	}
	if n, err := v[5].AsInt64(); err != nil || n != 1 {
		t.Errorf("MAX_EXACT is not 2^53 - 1: %d, %v", n, err)
	}
}
