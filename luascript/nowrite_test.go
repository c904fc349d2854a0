package luascript_test

import (
	"strings"
	"testing"

	"quotad/luascript"
)

// A state is the content of a key a refusal finds: the commands that write
// it, with "K" for the key. Each state is given a TTL after.
type state [][]string

var (
	noKey    = state{}
	aString  = state{{"SET", "K", "not ours"}}
	otherMap = state{{"HSET", "K", "name", "bob"}}

	// A window holding 2 of 5 with a record of id a at cost 2, one id
	// recorded of at most 1.
	window = state{{"HSET", "K", "used", "2", "policy", "5:60000", "ids", "1", "r:a", "2:2"}}
	// A window whose record of id a is malformed.
	windowBadRecord = state{{"HSET", "K", "used", "2", "policy", "5:60000", "ids", "1", "r:a", "x"}}

	// A bucket of 5 tokens (rate 1 per second) with five records whose
	// horizon ended in 1970, queued for forgetting, and a live record of id
	// a at cost 1. A take forgets at most three, so a take of a fresh id
	// with max_ids 3 finds the cap full even after forgetting: the path
	// that used to forget before refusing.
	bucket = state{{"HSET", "K", "tat", "0", "rem", "0", "policy", "1:1000:5", "ids", "6", "qh", "0", "qt", "6",
		"q:0", "o0:1", "q:1", "o1:1", "q:2", "o2:1", "q:3", "o3:1", "q:4", "o4:1", "q:5", "a:99999999999999",
		"r:o0", "1:4:1", "r:o1", "1:4:1", "r:o2", "1:4:1", "r:o3", "1:4:1", "r:o4", "1:4:1", "r:a", "1:4:99999999999999"}}
	bucketBadRecord = state{{"HSET", "K", "tat", "0", "rem", "0", "policy", "1:1000:5", "ids", "1", "qh", "0", "qt", "0", "r:a", "x"}}
	bucketBadFields = state{{"HSET", "K", "tat", "x", "rem", "0", "policy", "1:1000:5"}}

	// A lease set of limit 2 holding a live lease a and one that expired in
	// 1970, which a take or release would reclaim.
	leases = state{{"HSET", "K", "policy", "2:60000", "l:a", "99999999999999", "l:old", "1"}}
	// The same with a field no lease set has: refused before reclaiming.
	leasesOtherField = state{{"HSET", "K", "policy", "2:60000", "l:old", "1", "x", "1"}}

	// A window holding 3 of 5, 2 of them reserved by holder h under its
	// reservation 7, and one whose record of h is malformed.
	reserved          = state{{"HSET", "K", "used", "3", "policy", "5:60000", "ids", "0", "a:h", "7:2"}}
	reservedBadRecord = state{{"HSET", "K", "used", "3", "policy", "5:60000", "ids", "0", "a:h", "7"}}
	// A bucket of 5 (1 a second) and a sliding window of 5 a minute, with
	// 2 units reserved by holder h under its reservation 7, or a
	// malformed record of it.
	bucketReserved    = state{{"HSET", "K", "tat", "9000000000000000", "rem", "0", "policy", "1:1000:5", "a:h", "7:2"}}
	bucketBadReserved = state{{"HSET", "K", "tat", "9000000000000000", "rem", "0", "policy", "1:1000:5", "a:h", "x"}}
	// The window's period starts far ahead, so that one healed lives on.
	slidingReserved   = state{{"HSET", "K", "s", "99999999960000", "c", "2", "p", "0", "policy", "5:60000", "ids", "0", "qh", "0", "qt", "0", "a:h", "7:2:99999999960000"}}
	slidingBadReserve = state{{"HSET", "K", "s", "99999999960000", "c", "2", "p", "0", "policy", "5:60000", "ids", "0", "qh", "0", "qt", "0", "a:h", "7:2"}}
)

// Every refusal of every script leaves its key as it found it: the same
// content (DUMP, byte for byte) and no longer a TTL, except that a take on
// a key without TTL restores one and says so (TTL_RESTORED). Each script
// runs as Redis holds it (EVAL of its text), so arguments the Go side would
// refuse reach the script too.
func TestRefusalsWriteNothing(t *testing.T) {
	e := setup(t)
	const (
		fwTake  = "fixed_window_take.lua"
		fwPeek  = "fixed_window_peek.lua"
		tbTake  = "token_bucket_take.lua"
		tbPeek  = "token_bucket_peek.lua"
		ccTake  = "concurrency_take.lua"
		ccPeek  = "concurrency_peek.lua"
		release = "concurrency_release.lua"
		fwRes   = "fixed_window_reserve.lua"
		wRet    = "window_return.lua"
		tbRes   = "token_bucket_reserve.lua"
		tbRet   = "token_bucket_return.lua"
		swRes   = "sliding_window_reserve.lua"
		swRet   = "sliding_window_return.lua"
	)
	cases := []struct {
		name   string
		script string
		state  state
		argv   []string
		code   string
		heals  bool // on a key without TTL, this refusal restores one
	}{
		{"fw take: limit 0", fwTake, window, []string{"0", "60000", "1", "1", "0", ""}, "INVALID", false},
		{"fw take: window too long", fwTake, window, []string{"5", "2678400001", "1", "1", "0", ""}, "INVALID", false},
		{"fw take: cost above limit", fwTake, window, []string{"5", "60000", "6", "1", "0", ""}, "INVALID", false},
		{"fw take: max ids 0", fwTake, window, []string{"5", "60000", "1", "0", "0", ""}, "INVALID", false},
		{"fw take: strict 2", fwTake, window, []string{"5", "60000", "1", "1", "2", ""}, "INVALID", false},
		{"fw take: bad request id", fwTake, window, []string{"5", "60000", "1", "1", "0", "a b"}, "INVALID", false},
		{"fw take: too few arguments", fwTake, window, []string{"5", "60000", "1", "1", "0"}, "INVALID", false},
		{"fw take: invalid on no key", fwTake, noKey, []string{"5", "60000", "9", "1", "0", ""}, "INVALID", false},
		{"fw take: strict, other policy", fwTake, window, []string{"6", "60000", "1", "1", "1", ""}, "POLICY", true},
		{"fw take: same id, other cost", fwTake, window, []string{"5", "60000", "1", "1", "0", "a"}, "CONFLICT", true},
		{"fw take: cap of ids full", fwTake, window, []string{"5", "60000", "1", "1", "0", "b"}, "REQUEST_IDS_FULL", true},
		{"fw take: malformed record", fwTake, windowBadRecord, []string{"5", "60000", "1", "1", "0", "a"}, "WRONGTYPE", true},
		{"fw take: other fields", fwTake, otherMap, []string{"5", "60000", "1", "1", "0", ""}, "WRONGTYPE", false},
		{"fw take: a string", fwTake, aString, []string{"5", "60000", "1", "1", "0", ""}, "WRONGTYPE", false},
		{"fw peek: limit 1.5", fwPeek, window, []string{"1.5", "60000", "0"}, "INVALID", false},
		{"fw peek: strict, other policy", fwPeek, window, []string{"6", "60000", "1"}, "POLICY", false},
		{"fw peek: other fields", fwPeek, otherMap, []string{"5", "60000", "0"}, "WRONGTYPE", false},
		{"fw peek: a string", fwPeek, aString, []string{"5", "60000", "0"}, "WRONGTYPE", false},

		{"tb take: rate 0", tbTake, bucket, []string{"0", "1000", "5", "1", "1000", "3", "0", "c"}, "INVALID", false},
		{"tb take: refill over 31 days", tbTake, bucket, []string{"1", "2678400000", "2", "1", "1000", "3", "0", "c"}, "INVALID", false},
		{"tb take: cost above burst", tbTake, bucket, []string{"1", "1000", "5", "6", "1000", "3", "0", "c"}, "INVALID", false},
		{"tb take: dedupe 0", tbTake, bucket, []string{"1", "1000", "5", "1", "0", "3", "0", "c"}, "INVALID", false},
		{"tb take: max ids too many", tbTake, bucket, []string{"1", "1000", "5", "1", "1000", "1000001", "0", "c"}, "INVALID", false},
		{"tb take: strict 2", tbTake, bucket, []string{"1", "1000", "5", "1", "1000", "3", "2", "c"}, "INVALID", false},
		{"tb take: bad request id", tbTake, bucket, []string{"1", "1000", "5", "1", "1000", "3", "0", "c:"}, "INVALID", false},
		{"tb take: too few arguments", tbTake, bucket, []string{"1", "1000", "5", "1", "1000", "3", "0"}, "INVALID", false},
		{"tb take: strict, other policy", tbTake, bucket, []string{"2", "1000", "5", "1", "1000", "3", "1", "c"}, "POLICY", true},
		{"tb take: same id, other cost", tbTake, bucket, []string{"1", "1000", "5", "2", "1000", "3", "0", "a"}, "CONFLICT", true},
		{"tb take: cap of ids full after forgetting", tbTake, bucket, []string{"1", "1000", "5", "1", "1000", "3", "0", "c"}, "REQUEST_IDS_FULL", true},
		{"tb take: malformed record", tbTake, bucketBadRecord, []string{"1", "1000", "5", "1", "1000", "3", "0", "a"}, "WRONGTYPE", true},
		{"tb take: malformed fields", tbTake, bucketBadFields, []string{"1", "1000", "5", "1", "1000", "3", "0", ""}, "WRONGTYPE", false},
		{"tb take: other fields", tbTake, otherMap, []string{"1", "1000", "5", "1", "1000", "3", "0", ""}, "WRONGTYPE", false},
		{"tb take: a string", tbTake, aString, []string{"1", "1000", "5", "1", "1000", "3", "0", ""}, "WRONGTYPE", false},
		{"tb peek: burst 0", tbPeek, bucket, []string{"1", "1000", "0", "0"}, "INVALID", false},
		{"tb peek: strict, other policy", tbPeek, bucket, []string{"2", "1000", "5", "1"}, "POLICY", false},
		{"tb peek: other fields", tbPeek, otherMap, []string{"1", "1000", "5", "0"}, "WRONGTYPE", false},
		{"tb peek: a string", tbPeek, aString, []string{"1", "1000", "5", "0"}, "WRONGTYPE", false},

		{"cc take: limit too big", ccTake, leases, []string{"100001", "60000", "0", "b"}, "INVALID", false},
		{"cc take: lease 0", ccTake, leases, []string{"2", "0", "0", "b"}, "INVALID", false},
		{"cc take: strict 2", ccTake, leases, []string{"2", "60000", "2", "b"}, "INVALID", false},
		{"cc take: no request id", ccTake, leases, []string{"2", "60000", "0", ""}, "INVALID", false},
		{"cc take: too few arguments", ccTake, leases, []string{"2", "60000", "0"}, "INVALID", false},
		{"cc take: strict, other policy", ccTake, leases, []string{"3", "60000", "1", "b"}, "POLICY", true},
		{"cc take: other fields", ccTake, leasesOtherField, []string{"2", "60000", "0", "b"}, "WRONGTYPE", false},
		{"cc take: a string", ccTake, aString, []string{"2", "60000", "0", "b"}, "WRONGTYPE", false},
		{"cc peek: limit 0", ccPeek, leases, []string{"0", "60000", "0"}, "INVALID", false},
		{"cc peek: strict, other policy", ccPeek, leases, []string{"3", "60000", "1"}, "POLICY", false},
		{"cc peek: other fields", ccPeek, leasesOtherField, []string{"2", "60000", "0"}, "WRONGTYPE", false},
		{"cc peek: a string", ccPeek, aString, []string{"2", "60000", "0"}, "WRONGTYPE", false},
		{"release: bad request id", release, leases, []string{"a b"}, "INVALID", false},
		{"release: no request id", release, leases, []string{""}, "INVALID", false},
		{"release: too many arguments", release, leases, []string{"a", "b"}, "INVALID", false},
		{"release: other fields", release, leasesOtherField, []string{"old"}, "WRONGTYPE", false},
		{"release: a string", release, aString, []string{"a"}, "WRONGTYPE", false},

		{"fw reserve: want below cost", fwRes, reserved, []string{"5", "60000", "2", "1", "50000", "h", "8", "0"}, "INVALID", false},
		{"fw reserve: want above limit", fwRes, reserved, []string{"5", "60000", "1", "6", "50000", "h", "8", "0"}, "INVALID", false},
		{"fw reserve: share 0", fwRes, reserved, []string{"5", "60000", "1", "1", "0", "h", "8", "0"}, "INVALID", false},
		{"fw reserve: share above 1", fwRes, reserved, []string{"5", "60000", "1", "1", "1000001", "h", "8", "0"}, "INVALID", false},
		{"fw reserve: no holder", fwRes, reserved, []string{"5", "60000", "1", "1", "50000", "", "8", "0"}, "INVALID", false},
		{"fw reserve: seq 0", fwRes, reserved, []string{"5", "60000", "1", "1", "50000", "h", "0", "0"}, "INVALID", false},
		{"fw reserve: invalid on no key", fwRes, noKey, []string{"5", "60000", "1", "1", "50000", "h", "x", "0"}, "INVALID", false},
		{"fw reserve: malformed record", fwRes, reservedBadRecord, []string{"5", "60000", "1", "1", "50000", "h", "8", "0"}, "WRONGTYPE", true},
		{"fw reserve: other fields", fwRes, otherMap, []string{"5", "60000", "1", "1", "50000", "h", "8", "0"}, "WRONGTYPE", false},
		{"fw reserve: a string", fwRes, aString, []string{"5", "60000", "1", "1", "50000", "h", "8", "0"}, "WRONGTYPE", false},
		{"return: cost above limit", wRet, reserved, []string{"1000000001", "h", "7"}, "INVALID", false},
		{"return: more than reserved", wRet, reserved, []string{"3", "h", "7"}, "INVALID", false},
		{"return: no holder", wRet, reserved, []string{"1", "", "7"}, "INVALID", false},
		{"return: too few arguments", wRet, reserved, []string{"1", "h"}, "INVALID", false},
		{"return: malformed record", wRet, reservedBadRecord, []string{"1", "h", "7"}, "WRONGTYPE", false},
		{"return: other fields", wRet, state{{"HSET", "K", "used", "x", "a:h", "7:2"}}, []string{"1", "h", "7"}, "WRONGTYPE", false},
		{"return: a string", wRet, aString, []string{"1", "h", "7"}, "WRONGTYPE", false},

		{"tb reserve: want above burst", tbRes, bucketReserved, []string{"1", "1000", "5", "1", "6", "50000", "1000", "h", "8", "0"}, "INVALID", false},
		{"tb reserve: kept negative", tbRes, bucketReserved, []string{"1", "1000", "5", "1", "1", "50000", "1000", "h", "8", "-1"}, "INVALID", false},
		{"tb reserve: malformed record", tbRes, bucketBadReserved, []string{"1", "1000", "5", "1", "1", "50000", "1000", "h", "8", "0"}, "WRONGTYPE", true},
		{"tb reserve: other fields", tbRes, otherMap, []string{"1", "1000", "5", "1", "1", "50000", "1000", "h", "8", "0"}, "WRONGTYPE", false},
		{"tb reserve: a string", tbRes, aString, []string{"1", "1000", "5", "1", "1", "50000", "1000", "h", "8", "0"}, "WRONGTYPE", false},
		{"tb return: more than reserved", tbRet, bucketReserved, []string{"1", "1000", "5", "3", "h", "7"}, "INVALID", false},
		{"tb return: burst 0", tbRet, bucketReserved, []string{"1", "1000", "0", "1", "h", "7"}, "INVALID", false},
		{"tb return: malformed record", tbRet, bucketBadReserved, []string{"1", "1000", "5", "1", "h", "7"}, "WRONGTYPE", false},
		{"tb return: a string", tbRet, aString, []string{"1", "1000", "5", "1", "h", "7"}, "WRONGTYPE", false},
		{"sw reserve: share 0", swRes, slidingReserved, []string{"5", "60000", "1", "1", "0", "h", "8", "0"}, "INVALID", false},
		{"sw reserve: malformed record", swRes, slidingBadReserve, []string{"5", "60000", "1", "1", "50000", "h", "8", "0"}, "WRONGTYPE", true},
		{"sw reserve: other fields", swRes, otherMap, []string{"5", "60000", "1", "1", "50000", "h", "8", "0"}, "WRONGTYPE", false},
		{"sw reserve: a string", swRes, aString, []string{"5", "60000", "1", "1", "50000", "h", "8", "0"}, "WRONGTYPE", false},
		{"sw return: more than reserved", swRet, slidingReserved, []string{"3", "h", "7"}, "INVALID", false},
		{"sw return: malformed record", swRet, slidingBadReserve, []string{"1", "h", "7"}, "WRONGTYPE", false},
		{"sw return: other fields", swRet, state{{"HSET", "K", "name", "bob", "a:h", "7:2:0"}}, []string{"1", "h", "7"}, "WRONGTYPE", false},
		{"sw return: a string", swRet, aString, []string{"1", "h", "7"}, "WRONGTYPE", false},
	}
	for _, tc := range cases {
		for _, persist := range []bool{false, true} {
			if persist && len(tc.state) == 0 {
				continue
			}
			name := tc.name
			if persist {
				name += ", no TTL"
			}
			t.Run(name, func(t *testing.T) {
				k := e.prefix + "k:" + name
				for _, cmd := range tc.state {
					cmd = append([]string(nil), cmd...)
					cmd[1] = k
					e.mustDo(cmd...)
				}
				if len(tc.state) > 0 && !persist {
					e.mustDo("PEXPIRE", k, "600000")
				}
				t.Cleanup(func() { e.mustDo("DEL", k) })
				dump := func() string {
					s, err := e.do("DUMP", k).ToString()
					if err != nil && len(tc.state) > 0 {
						t.Fatalf("DUMP: %v", err)
					}
					return s
				}
				before, ttlBefore := dump(), e.pttl(k)

				src := luascript.ScriptText(tc.script)
				if src == "" {
					t.Fatalf("no script %s", tc.script)
				}
				err := e.c.Do(t.Context(), e.c.B().Eval().Script(src).Numkeys(1).Key(k).Arg(tc.argv...).Build()).Error()
				if err == nil || !strings.HasPrefix(err.Error(), tc.code+" ") {
					t.Fatalf("%s %q = %v, want %s", tc.script, tc.argv, err, tc.code)
				}

				if after := dump(); after != before {
					t.Errorf("%s wrote the key: DUMP before %q, after %q (HGETALL %v)", tc.code, before, after, hgetall(e, k))
				}
				healed := strings.HasSuffix(err.Error(), " TTL_RESTORED")
				switch ttl := e.pttl(k); {
				case len(tc.state) == 0:
					if ttl != -2 {
						t.Errorf("%s created the key: PTTL %d", tc.code, ttl)
					}
				case !persist:
					if ttl <= 0 || ttl > ttlBefore || healed {
						t.Errorf("PTTL %d before, %d after, healed %v; want no longer, not healed", ttlBefore, ttl, healed)
					}
				case tc.heals:
					if ttl <= 0 || !healed {
						t.Errorf("without TTL: PTTL %d after, healed %v (%v); want a TTL restored and said", ttl, healed, err)
					}
				default:
					if ttl != -1 || healed {
						t.Errorf("without TTL: PTTL %d after, healed %v; want none written", ttl, healed)
					}
				}
			})
		}
	}
}

// hgetall is a key's hash for a message, or why it has none.
func hgetall(e *env, k string) any {
	m, err := e.do("HGETALL", k).AsStrMap()
	if err != nil {
		return err
	}
	return m
}
