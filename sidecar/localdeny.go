package sidecar

import (
	"hash/maphash"
	"sync"
	"time"

	"quotad/protocol"
)

// DefaultLocalDenyEntries bounds the exhausted windows remembered at once
// (about 150 bytes each with a short key).
const DefaultLocalDenyEntries = 65_536

// localDeny remembers fixed windows that Redis found exhausted, so that a
// flood of takes on one exhausted subject is denied here until its window
// ends instead of costing Redis one call per take.
//
// It only ever answers "denied", and only when Redis would: within one
// window a key's use never decreases, so if use u plus cost c exceeded the
// limit when Redis answered, u' + c exceeds it for any later use u' >= u. An
// entry applies only to takes without a request_id (one with an id may be a
// replay of an accepted take, which only Redis knows), only with the same
// limit and window, and only under the same config: a reload starts afresh.
// Peeks never look here. An entry ends at the window's end as seen from
// before the call that found it exhausted, so it never outlives the window.
//
// What it cannot see is a key deleted behind quotad's back (an operator's
// DEL or FLUSHALL): such a subject stays denied here until its window would
// have ended.
type localDeny struct {
	seed   maphash.Seed
	shards [16]denyShard
	max    int // entries per shard
}

type denyShard struct {
	mu sync.Mutex
	m  map[string]denyEntry
}

type denyEntry struct {
	cfg      *Config // the config the decision was made under
	limit    int64
	windowMS int64
	used     int64
	end      time.Time // monotonic: the window ends no earlier
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

// check answers a take without request_id from memory when its window is
// known to be exhausted for this cost under cfg.
func (d *localDeny) check(cfg *Config, key string, l limits, cost int64, now time.Time) (protocol.TakeReply, bool) {
	sh := d.shard(key)
	sh.mu.Lock()
	e, ok := sh.m[key]
	if ok && !now.Before(e.end) {
		delete(sh.m, key)
		ok = false
	}
	sh.mu.Unlock()
	if !ok || e.cfg != cfg || e.limit != l.limit || e.windowMS != l.windowMS || e.used+cost <= l.limit {
		return protocol.TakeReply{}, false
	}
	// Rounded up, so that a client that waits reset_ms finds the window gone.
	reset := int64((e.end.Sub(now) + time.Millisecond - 1) / time.Millisecond)
	return protocol.TakeReply{
		Allowed: false, Limit: l.limit, Used: e.used, Remaining: max(l.limit-e.used, 0),
		ResetMS: reset, RetryAfterMS: reset,
	}, true
}

// record notes Redis's answer to a take sent at sent: a denial is
// remembered until the window ends; an acceptance forgets the key, whose
// remembered use is now behind.
func (d *localDeny) record(cfg *Config, key string, l limits, allowed bool, used, resetMS int64, sent time.Time) {
	sh := d.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if allowed || resetMS <= 0 {
		delete(sh.m, key)
		return
	}
	if _, ok := sh.m[key]; !ok && len(sh.m) >= d.max {
		sh.evict(time.Now(), d.max)
	}
	sh.m[key] = denyEntry{cfg: cfg, limit: l.limit, windowMS: l.windowMS, used: used, end: sent.Add(time.Duration(resetMS) * time.Millisecond)}
}

// evict makes room: ended windows first, else an arbitrary quarter, so
// memory stays bounded whatever the subjects.
func (sh *denyShard) evict(now time.Time, limit int) {
	for k, e := range sh.m {
		if !now.Before(e.end) {
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

// len is the number of entries, ended or not.
func (d *localDeny) len() int {
	n := 0
	for i := range d.shards {
		sh := &d.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}
