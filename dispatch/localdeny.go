package dispatch

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"quotad/limits"
	"quotad/policy"
)

// DefaultLocalDenyEntries bounds the exhausted keys remembered at once
// (about 150 bytes each with a short key).
const DefaultLocalDenyEntries = 65_536

// localDeny remembers takes that Redis denied, so that a flood of takes on
// one exhausted subject is denied here instead of costing Redis one call
// per take.
//
// It only ever answers "denied", and only when Redis would: an algorithm's
// DeniedFor says how long a denial holds, and from which cost on (a fixed
// window until it ends, for any cost that exceeds what is left; a token
// bucket until its retry_after_ms, for the cost denied or more). An entry applies only to takes without a request_id (one
// with an id may be a replay of an accepted take, which only Redis knows),
// only under the same limits, and only under the same config: a reload
// starts afresh. Peeks and releases never look here. An entry's time is
// counted from before the call that found the denial, so it never outlives
// what Redis said.
//
// A settle (settle.go) may give back what a denial found taken, so it
// drops the denial of its key, and a take that ran before it on the same
// shard is not remembered as denied.
//
// What it cannot see is a key deleted behind quotad's back (an operator's
// DEL or FLUSHALL), or a settle made through another sidecar: such a
// subject stays denied here until the entry ends.
type localDeny struct {
	seed   maphash.Seed
	shards [16]denyShard
	max    int // entries per shard
}

type denyShard struct {
	mu sync.Mutex
	m  map[string]denyEntry
	// settles counts the settles on the shard's keys: a take that ran
	// before one is not remembered as denied (record). Written under mu,
	// read without it when a take starts (generation).
	settles atomic.Uint64
}

type denyEntry struct {
	cfg   *policy.Config // the config the decision was made under
	shape limits.Shape
	need  int64 // the least cost known to be denied until then
	used  int64
	reset time.Time // when the key's state ends, for reset_ms
	until time.Time // monotonic: the denial holds until then
}

// localStater is an algorithm whose state recovers with time while a
// denial holds (a token bucket refills): the local denial reports used and
// remaining as they are at now, from the instant the state is whole again
// (reset, the denial's reset_ms from before its call).
type localStater interface {
	localState(shape limits.Shape, reset, now time.Time) (used, remaining int64)
}

func newLocalDeny(entries int) *localDeny {
	if entries <= 0 {
		entries = DefaultLocalDenyEntries
	}
	d := &localDeny{seed: maphash.MakeSeed(), max: max(entries/16, 1)}
	for i := range d.shards {
		d.shards[i].m = make(map[string]denyEntry)
	}
	return d
}

func (d *localDeny) shard(key string) *denyShard {
	return &d.shards[maphash.String(d.seed, key)%uint64(len(d.shards))]
}

// check answers check i of dec, a take without request_id, from memory
// when its key is known to deny its cost under its config and limits.
func (d *localDeny) answer(dec *Decision, i int, now time.Time) bool {
	c := &dec.checks[i]
	sh := d.shard(c.key)
	sh.mu.Lock()
	e, ok := sh.m[c.key]
	if ok && !now.Before(e.until) {
		delete(sh.m, c.key)
		ok = false
	}
	sh.mu.Unlock()
	if !ok || e.cfg != dec.cfg || e.shape != c.limit.Shape || c.req.Cost < e.need {
		return false
	}
	o := dec.out(i)
	o.Allowed, o.Local, o.Used, o.Remaining = false, true, e.used, max(o.Limit-e.used, 0)
	if ls, ok := c.limit.Algorithm.(localStater); ok {
		// A state that recovers with time is reported as it is now.
		o.Used, o.Remaining = ls.localState(e.shape, e.reset, now)
	}
	// Rounded up, so that a client that waits retry_after_ms finds room.
	o.RetryAfterMS = ms(e.until.Sub(now))
	o.ResetMS = max(ms(e.reset.Sub(now)), o.RetryAfterMS)
	return true
}

// record notes Redis's answer to check i of a take, sent at its sent,
// before shadow mode: a denial that holds for hold, for costs of at least
// need, is remembered; an acceptance forgets the key, whose remembered
// state is now behind.
func (d *localDeny) record(dec *Decision, i int, hold time.Duration, need int64) {
	c, o := &dec.checks[i], dec.out(i)
	sh := d.shard(c.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if o.Allowed || hold <= 0 {
		delete(sh.m, c.key)
		return
	}
	if sh.settles.Load() != c.denyGen {
		// A settle on the shard ran meanwhile and may have freed what
		// this denial found taken.
		return
	}
	if _, ok := sh.m[c.key]; !ok && len(sh.m) >= d.max {
		sh.evict(time.Now(), d.max)
	}
	sh.m[c.key] = denyEntry{
		cfg: dec.cfg, shape: c.limit.Shape, need: need, used: o.Used,
		reset: c.sent.Add(time.Duration(o.ResetMS) * time.Millisecond), until: c.sent.Add(hold),
	}
}

// forget drops the denial of key: a settle may free what it found taken,
// so a take it made possible is never denied from memory. Takes of the
// shard that ran before it are not remembered as denied either.
func (d *localDeny) forget(key string) {
	sh := d.shard(key)
	sh.mu.Lock()
	delete(sh.m, key)
	sh.settles.Add(1)
	sh.mu.Unlock()
}

// generation is the count of settles on key's shard, taken when a take
// runs, for record.
func (d *localDeny) generation(key string) uint64 {
	return d.shard(key).settles.Load()
}

// evict makes room: ended entries first, else an arbitrary quarter, so
// memory stays bounded whatever the subjects.
func (sh *denyShard) evict(now time.Time, limit int) {
	for k, e := range sh.m {
		if !now.Before(e.until) {
			delete(sh.m, k)
		}
	}
	if n := len(sh.m); n >= limit {
		drop := max(n/4, 1)
		for k := range sh.m {
			delete(sh.m, k)
			if drop--; drop == 0 {
				break
			}
		}
	}
}
