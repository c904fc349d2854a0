package dispatch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"hash/maphash"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"go.uber.org/zap"

	"quotad/limits"
	"quotad/luascript"
	"quotad/protocol"
)

// Allotments (docs/allotments.md): a take without a request_id of a
// policy with an allotment is answered from units this sidecar reserved
// in Redis when they cover its cost. Every unit handed out was taken in
// Redis first, by one atomic reservation (luascript.ReserveCall), so the
// limit holds across sidecars exactly as it does for takes; what is not
// handed out goes back to the window it was taken in
// (luascript.ReturnCall), once.
//
// The control law, per key: a key whose recent rate brings fewer than
// allotHotUnits in allotHorizon is cold, and its takes go to Redis as any
// take (a cold key without units held has no allot: a counter per hash,
// heat, tells when it turns hot, once that rate lasted a second). Otherwise a reservation wants
// allotHorizon of the rate plus the costs of the takes waiting for it,
// at least the take's cost (allotWant); the script caps it by max_share
// of what Redis says is left and by what is left, and grants at least
// the take's cost or denies it. Near the limit what is left is small, so
// a reservation shrinks to the take itself and every decision is Redis's
// again.
//
// Per key, one reservation or return is in flight at a time (single
// flight): takes that come meanwhile wait for it and are then answered
// from what it granted. Units are handed out only while the window they
// count in lasts (the reply's valid_ms, counted from before the call was
// sent, so never past Redis's end of it); units left when it ends need
// no return, and are counted lost, but for a sliding window's, which
// count in the previous period for a window more and go back to it. Units
// not used for idle without a take on their key go back; a drain gives
// back everything held (ReturnAllotments). A return Redis may not have
// applied stays pending until Redis answers again (giveBack).

// allotHorizon is how much of the recent rate a reservation asks for.
const allotHorizon = 100 * time.Millisecond

// allotShards spread the keys over locks, so that takes of different hot
// keys do not queue behind one mutex.
const allotShards = 64

// allotments holds the units this sidecar reserved, per key.
type allotments struct {
	d *Dispatcher
	// holder names this process's reservations in Redis (a:<holder>): a
	// restarted sidecar is another holder.
	holder string
	seed   maphash.Seed
	shards [allotShards]allotShard
	// running counts the reservations and returns in flight, for Close.
	running sync.WaitGroup
	m       allotMetrics
	// returning counts the returns in flight (retMu), and settled, when
	// a drain waits for them, is closed once none is; giveUp closes stop
	// (once), and returns waiting for Redis then stop.
	retMu     sync.Mutex
	returning int
	settled   chan struct{}
	stop      chan struct{}
	stopOnce  sync.Once
}

type allotShard struct {
	mu     sync.Mutex
	m      map[string]*allot
	closed bool
	// heat counts the recent units of keys that have no allot yet, a
	// slot per hash: a key gets an allot, and a timer, only once it is
	// hot, so a cold key costs a counter, not an entry.
	heat [heatSlots]heat
}

// heatSlots are a shard's counters of cold keys: 16,384 in all, so that
// keys sharing one seldom add up to a hot one.
const heatSlots = 256

// heat is the units taken on the keys of one slot since from, ns.
type heat struct {
	from  int64
	units int64
}

// allotHeatWindow is how long a heat counter counts before it starts
// again.
const allotHeatWindow = time.Second

// allotHeatUnits is how many units the keys of a heat counter must bring
// within one allotHeatWindow for the key of a take to turn hot: the hot
// rate (allotHotUnits in allotHorizon) kept up for a whole window. A
// rate measured over less would make keys hot by chance: of 10,000 keys
// taken a few times a second each, some see four takes within 100ms
// every second, and each would pay a reservation and its return for a
// handful of takes.
const allotHeatUnits = allotHotUnits * int64(allotHeatWindow/allotHorizon)

// warm counts a take of cost at now. It reports whether the units before
// it in the window make the key hot (allotHeatUnits), and their rate in
// units a second over at least allotHorizon: a new allot's first
// estimate.
func (h *heat) warm(cost int64, now time.Time) (rate float64, hot bool) {
	t := now.UnixNano()
	if t-h.from >= int64(allotHeatWindow) {
		h.from, h.units = t, 0
	}
	before := h.units
	h.units += cost
	return float64(before) / max(time.Duration(t-h.from), allotHorizon).Seconds(), before >= allotHeatUnits
}

// allot is what the sidecar holds of one key. Its fields are guarded by
// its shard's mutex.
type allot struct {
	key    string
	policy string // its metrics label
	limit  Limit  // the limits of its latest reservation
	idle   time.Duration
	// held units may be handed out until validUntil and given back until
	// returnUntil (a sliding window's count for a period more); they are
	// recorded in Redis under seq, at retKey (a calendar period's own key).
	held        int64
	seq         int64
	retKey      string
	validUntil  time.Time
	returnUntil time.Time
	// What Redis said right after the latest reservation: the reply of a
	// local answer is made from it (answer).
	used, remaining int64
	resetAt         time.Time
	// busy: a reservation or return of the key is in flight; waiting are
	// the takes it will answer.
	busy    bool
	waiting []*Decision
	// retrying: busy with a return that waits for Redis to be sent again;
	// takes meanwhile go to Redis as any take, not waiting for it.
	retrying bool
	// The recent rate: units taken since rateFrom, and the estimate in
	// units a second.
	lastTake  time.Time
	rateFrom  time.Time
	rateUnits int64
	rate      float64
	timer     *time.Timer
	// The series of policy, looked up once, not at each local answer.
	local prometheus.Counter
	gauge prometheus.Gauge
}

func newAllotments(d *Dispatcher, reg *prometheus.Registry) *allotments {
	var b [8]byte
	_, _ = rand.Read(b[:])
	a := &allotments{d: d, holder: hex.EncodeToString(b[:]), seed: maphash.MakeSeed(), m: newAllotMetrics(reg),
		stop: make(chan struct{})}
	for i := range a.shards {
		a.shards[i].m = map[string]*allot{}
	}
	return a
}

// shard is key's shard, and its heat counter there.
func (as *allotments) shard(key string) (*allotShard, *heat) {
	h := maphash.String(as.seed, key)
	sh := &as.shards[h%allotShards]
	return sh, &sh.heat[(h/allotShards)%heatSlots]
}

// allotted answers dec from the allotment of its key when it can, or
// queues it for the key's reservation; false when dec is not a take
// allotments answer (the caller sends it to Redis as any take).
func (d *Dispatcher) allotted(dec *Decision) bool {
	c := &dec.checks[0]
	l := &c.limit
	if l.Allotment == nil || dec.listed() || l.Shadow || dec.req.RequestID != "" || !luascript.HasAllotments(l.Algorithm.Name()) {
		return false
	}
	return d.allot.take(dec)
}

// take answers dec from what its key holds, or queues it and starts a
// reservation when none is in flight.
func (as *allotments) take(dec *Decision) bool {
	c := &dec.checks[0]
	cost, now := c.req.Cost, time.Now()
	sh, heat := as.shard(c.key)
	sh.mu.Lock()
	if sh.closed {
		sh.mu.Unlock()
		return false
	}
	a := sh.m[c.key]
	if a != nil && a.retrying {
		sh.mu.Unlock()
		return false
	}
	fresh := a == nil
	if fresh {
		rate, hot := heat.warm(cost, now)
		if !hot {
			// A cold key: a reservation would cover too few takes to pay
			// for itself (and for the return of what it did not use).
			// The take goes to Redis as any take, in the shared batch.
			sh.mu.Unlock()
			return false
		}
		a = &allot{key: c.key, rateFrom: now, rateUnits: cost, rate: rate}
		sh.m[c.key] = a
	}
	if a.policy != c.limit.Policy || a.local == nil {
		a.policy = c.limit.Policy
		a.local, a.gauge = as.m.local.WithLabelValues(a.policy), as.m.held.WithLabelValues(a.policy)
	}
	a.limit, a.idle = c.limit, time.Duration(c.limit.Allotment.IdleMS)*time.Millisecond
	if fresh {
		// The key is forgotten once idle without units held.
		a.timer = time.AfterFunc(a.idle, func() { as.idle(sh, a) })
	}
	a.lastTake = now
	if !fresh {
		a.observe(cost, now)
	}
	if as.fromHeld(sh, a, dec, cost, now) {
		return true
	}
	if !a.busy && a.rate*allotHorizon.Seconds() < allotHotUnits {
		// Cooled down: as a cold key's, until idle forgets it.
		sh.mu.Unlock()
		return false
	}
	if !a.busy {
		// Not covered: a take the local denial knows Redis would deny
		// needs no reservation. Checked with the lock released, and the
		// units held looked at again after.
		sh.mu.Unlock()
		if as.d.localDenied(dec) {
			as.d.metrics.localDenials.Inc()
			as.d.finish(dec)
			return true
		}
		sh.mu.Lock()
		if sh.closed {
			sh.mu.Unlock()
			return false
		}
		if as.fromHeld(sh, a, dec, cost, now) {
			return true
		}
	}
	a.waiting = append(a.waiting, dec)
	if a.busy {
		sh.mu.Unlock()
		return true
	}
	if as.returnsFirst(a, now) {
		as.launchReturn(context.Background(), sh, a)
		sh.mu.Unlock()
		return true
	}
	r := as.startReserve(a, now)
	sh.mu.Unlock()
	as.launch(func() { as.reserve(sh, a, r) })
	return true
}

// returnsFirst reports whether a holds units of a sliding window's
// period that ended: they still count in the previous period, so they go
// back there before the next reservation, and the takes waiting get that
// reservation after (returned). A reservation would lose them (see
// startReserve).
func (as *allotments) returnsFirst(a *allot, now time.Time) bool {
	return a.held > 0 && !now.Before(a.validUntil) && now.Before(a.returnUntil)
}

// fromHeld answers dec, of cost, from the units a holds when they cover
// it and no reservation or return of a is in flight (takes waiting for it
// come first). It is called with sh locked, and unlocks it when it
// answered.
func (as *allotments) fromHeld(sh *allotShard, a *allot, dec *Decision, cost int64, now time.Time) bool {
	if a.busy || a.held < cost || !now.Before(a.validUntil) {
		return false
	}
	a.held -= cost
	a.answer(&dec.Out, now)
	local, gauge := a.local, a.gauge
	sh.mu.Unlock()
	local.Inc()
	gauge.Sub(float64(cost))
	as.d.finish(dec)
	return true
}

// answer makes o a take allowed from what a holds (after the take):
// used and remaining are what Redis said at the latest reservation, with
// the units this sidecar still holds counted as left.
func (a *allot) answer(o *Outcome, now time.Time) {
	o.Allowed, o.Allotted = true, true
	o.Remaining = min(a.remaining+a.held, max(o.Limit, a.remaining))
	o.Used = max(a.used-a.held, 0)
	o.ResetMS = max(ms(a.resetAt.Sub(now)), 0)
}

// reservation is one reservation's call, built under the shard's lock:
// what it needs of its allot is copied here.
type reservation struct {
	args      luascript.Args
	algorithm string
	policy    string
	want      int64
	sent      time.Time
}

// startReserve marks a busy and builds its next reservation: the
// control law (see the top of the file).
func (as *allotments) startReserve(a *allot, now time.Time) reservation {
	a.busy = true
	// Units that may no longer be handed out cannot be kept under the new
	// reservation's record: their return would go to another period (take
	// gives them back first while they still count).
	if a.held > 0 && !now.Before(a.validUntil) {
		as.lose(a, a.held)
	}
	var waiting int64
	for _, w := range a.waiting {
		waiting += w.checks[0].req.Cost
	}
	first := a.waiting[0].checks[0].req
	want := allotWant(a.rate, waiting, first.Cost, a.limit.Shape.Quota())
	a.seq++
	args := allotArgs(&a.limit, first, a.key, want, as.holder, a.seq)
	args.Kept = a.held
	return reservation{args: args, want: want,
		algorithm: a.limit.Algorithm.Name(), policy: a.policy}
}

// allotHotUnits is the least a key's rate must bring in allotHorizon for
// its takes to be answered from an allotment: below it (40 units a
// second), a reservation would cover too few takes to pay for itself.
const allotHotUnits = 4

// observe counts a take of cost at now into a's rate. The rate is
// folded every allotHorizon; between, once allotHotUnits came since the
// last fold, their rate over the time since raises it at once, so that a
// key turns hot within a few takes of a burst, and two takes close
// together do not make it so.
func (a *allot) observe(cost int64, now time.Time) {
	elapsed := max(now.Sub(a.rateFrom), time.Millisecond)
	if elapsed >= allotHorizon {
		a.rate = nextRate(a.rate, a.rateUnits, elapsed)
		a.rateFrom, a.rateUnits = now, 0
	} else if a.rateUnits >= allotHotUnits {
		a.rate = max(a.rate, float64(a.rateUnits)/elapsed.Seconds())
	}
	a.rateUnits += cost
}

// nextRate is the key's rate, in units a second, once units were taken
// in the elapsed time since the last estimate: the mean of the last
// estimate and this sample, so that a burst moves it at once and a lull
// halves it at each reservation.
func nextRate(rate float64, units int64, elapsed time.Duration) float64 {
	sample := float64(units) / elapsed.Seconds()
	if rate == 0 {
		return sample
	}
	return (rate + sample) / 2
}

// allotWant is what a reservation asks for: the costs of the takes
// waiting for it and allotHorizon of the rate, at least the take's cost
// and at most the limit's quota. Redis caps it by max_share of what is
// left (luascript's allot_grant).
func allotWant(rate float64, waiting, cost, quota int64) int64 {
	want := waiting + int64(math.Ceil(rate*allotHorizon.Seconds()))
	return min(max(want, cost), quota)
}

// drop forgets units whose window ended: Redis needs no return of them,
// and they were not handed out.
func (as *allotments) drop(a *allot, now time.Time) {
	if a.held > 0 && !now.Before(a.returnUntil) {
		as.lose(a, a.held)
	}
}

// lose forgets n units a holds, counted lost.
func (as *allotments) lose(a *allot, n int64) {
	as.m.lost.WithLabelValues(a.policy).Add(float64(n))
	as.m.held.WithLabelValues(a.policy).Sub(float64(n))
	a.held -= n
}

// allotArgs are the arguments of a reservation on key under l, for the
// take req.
func allotArgs(l *Limit, req *protocol.Request, key string, want int64, holder string, seq int64) luascript.Args {
	a := luascript.Args{Key: key, Cost: req.Cost, Want: want, SharePPM: l.Allotment.SharePPM, RequestID: holder, Seq: seq}
	switch s := l.Shape.(type) {
	case limits.Window:
		a.Limit, a.WindowMS = s.Limit, s.WindowMS
	case limits.CalendarWindow:
		a.Limit, a.Spec = s.Limit, s.Spec()
		a.Periods = luascript.CalendarAround(s, s.Offset(req.Subject), calendarClock())
	case limits.Sliding:
		a.Limit, a.WindowMS = s.Limit, s.WindowMS
	case limits.Bucket:
		a.TokenBucket = luascript.TokenBucket(s)
		a.DedupeMS = l.DedupeMS
	}
	return a
}

// launch runs f in a goroutine that Close waits for.
func (as *allotments) launch(f func()) {
	as.running.Add(1)
	go func() {
		defer as.running.Done()
		f()
	}()
}

// reserve sends r for a and answers the takes waiting for it.
func (as *allotments) reserve(sh *allotShard, a *allot, r reservation) {
	d := as.d
	r.sent = time.Now()
	var res luascript.Reservation
	call, err := luascript.ReserveCall(r.algorithm, r.args)
	if err == nil {
		err = d.allotCall(a.key, r.sent, func(ctx context.Context, client rueidis.Client) (err error) {
			res, err = luascript.ParseReserve(call.Exec(ctx, client))
			return err
		})
	}
	if res.Healed {
		d.log.Warn("restored the TTL of a quota key that had none", zap.String(keyPolicy, r.policy),
			zap.String(keyKey, r.args.Key), zap.Int64(keyHealedTotal, d.healed.Add(1)))
	}

	sh.mu.Lock()
	a.busy = false
	waiting := a.waiting
	a.waiting = nil
	if err == nil {
		as.m.reservations.WithLabelValues(r.policy).Inc()
		a.used, a.remaining = res.Used, res.Remaining
		a.resetAt = r.sent.Add(time.Duration(res.ResetMS) * time.Millisecond)
	}
	if err == nil && res.Granted > 0 {
		as.m.reserved.WithLabelValues(r.policy).Add(float64(res.Granted))
		as.m.held.WithLabelValues(r.policy).Add(float64(res.Granted))
		a.held += res.Granted
		a.seq = r.args.Seq
		a.validUntil = r.sent.Add(time.Duration(res.ValidMS) * time.Millisecond)
		a.returnUntil = a.validUntil
		if w, ok := a.limit.Shape.(limits.Sliding); ok {
			a.returnUntil = a.returnUntil.Add(time.Duration(w.WindowMS) * time.Millisecond)
		}
		a.retKey = a.key
		if res.Period > 0 {
			a.retKey = luascript.CalendarPeriodKey(a.key, r.args.Periods.Starts[res.Period-1])
		}
	}
	// Every key gets its idle timer once it has had a reservation, granted
	// or not: the timer forgets the key once it holds nothing.
	if a.timer == nil && !sh.closed {
		a.timer = time.AfterFunc(a.idle, func() { as.idle(sh, a) })
	}
	now := time.Now()
	var answered, rest []*Decision
	for _, w := range waiting {
		cost := w.checks[0].req.Cost
		if err == nil && a.held >= cost && now.Before(a.validUntil) {
			a.held -= cost
			a.answer(&w.Out, now)
			answered = append(answered, w)
			continue
		}
		rest = append(rest, w)
	}
	// A reservation granted in full may have been too small for the takes
	// that came while it was in flight: those wait for the next. After a
	// capped grant or a denial, they go to Redis as takes, each decided
	// exactly there. A reply that came after its units' period ended
	// (granted just before the end) leaves a sliding window's units to go
	// back first.
	var next *reservation
	if len(rest) > 0 && err == nil && res.Granted == r.want && !sh.closed {
		a.waiting, rest = rest, nil
		if as.returnsFirst(a, now) {
			as.launchReturn(context.Background(), sh, a)
		} else {
			n := as.startReserve(a, now)
			next = &n
		}
	}
	sh.mu.Unlock()

	for _, w := range answered {
		as.m.local.WithLabelValues(r.policy).Inc()
		as.m.held.WithLabelValues(r.policy).Sub(float64(w.checks[0].req.Cost))
		d.finish(w)
	}
	if next != nil {
		as.reserve(sh, a, *next)
		return
	}
	for _, w := range rest {
		if err != nil {
			d.end(w, err)
			continue
		}
		d.send(w)
	}
}

// allotCall runs call, a reservation or return on key sent at sent,
// under --redis-timeout and through the breaker of key's Redis, and feeds
// its result to the store's health as a take's.
func (d *Dispatcher) allotCall(key string, sent time.Time, call func(context.Context, rueidis.Client) error) error {
	client, err := d.store.Client()
	if err != nil {
		return err
	}
	if err := d.store.Admit(key); err != nil {
		return err
	}
	deadline := sent.Add(d.opts.RedisTimeout)
	ctx, cancel := context.WithDeadline(d.opts.Context, deadline)
	defer cancel()
	err = call(ctx, d.client(client))
	d.observe(key, err, &trip{queued: sent, sent: sent, deadline: deadline})
	return err
}

// idle gives back what a holds once idle passed without a take on its
// key, and forgets the key once it holds nothing.
func (as *allotments) idle(sh *allotShard, a *allot) {
	sh.mu.Lock()
	if sh.closed {
		sh.mu.Unlock()
		return
	}
	now := time.Now()
	if wait := a.idle - now.Sub(a.lastTake); a.busy || wait > 0 {
		a.timer.Reset(max(wait, a.idle/4))
		sh.mu.Unlock()
		return
	}
	as.drop(a, now)
	if a.held == 0 {
		a.timer = nil
		delete(sh.m, a.key)
		sh.mu.Unlock()
		return
	}
	as.launchReturn(context.Background(), sh, a)
	a.timer.Reset(a.idle)
	sh.mu.Unlock()
}

// launchReturn gives back what a holds, kept pending while Redis is
// unavailable until parent ends; then the takes waiting get a
// reservation. It is called with sh locked.
func (as *allotments) launchReturn(parent context.Context, sh *allotShard, a *allot) {
	r := as.startReturn(a)
	as.returnStarted()
	as.launch(func() {
		defer as.returnEnded()
		as.giveBack(parent, r, func() { as.retry(sh, a) })
		as.returned(sh, a)
	})
}

// giveBackCall is one return: units of a's reservation seq, to retKey.
type giveBackCall struct {
	algorithm string
	policy    string
	args      luascript.Args
	units     int64
	// until is when the units stop counting in Redis: a return after it
	// applies nothing.
	until time.Time
}

// startReturn marks a busy and takes what it holds for a return.
func (as *allotments) startReturn(a *allot) giveBackCall {
	a.busy = true
	r := giveBackCall{algorithm: a.limit.Algorithm.Name(), policy: a.policy, units: a.held, until: a.returnUntil,
		args: allotReturnArgs(&a.limit, a.retKey, a.held, as.holder, a.seq)}
	as.m.held.WithLabelValues(a.policy).Sub(float64(a.held))
	a.held = 0
	return r
}

func allotReturnArgs(l *Limit, key string, units int64, holder string, seq int64) luascript.Args {
	a := luascript.Args{Key: key, Cost: units, RequestID: holder, Seq: seq}
	if b, ok := l.Shape.(limits.Bucket); ok {
		a.TokenBucket = luascript.TokenBucket(b)
	}
	return a
}

// giveBack sends a return, and again while Redis is unavailable: a
// return is applied once however often it is sent. A return whose first
// attempt failed is sent again at once when the breaker lets calls
// through (a reset connection), else it waits for the breaker (looked at
// every probe interval), until its units stop counting (r.until), parent
// ends or the sidecar gives up (giveUp); pending is called once, after
// the first attempt failed. Units not given back are counted lost.
func (as *allotments) giveBack(parent context.Context, r giveBackCall, pending func()) {
	d := as.d
	call, err := luascript.ReturnCall(r.algorithm, r.args)
	var n int64
	unknown := false
	for attempt := 1; err == nil; attempt++ {
		err = d.allotCall(r.args.Key, time.Now(), func(ctx context.Context, client rueidis.Client) (err error) {
			ctx, cancel := mergeDeadline(ctx, parent)
			defer cancel()
			n, err = luascript.ParseReturn(call.Exec(ctx, client))
			return err
		})
		if err == nil {
			break
		}
		f := d.classify(err, nil)
		unknown = unknown || f.unknown
		if f.code != protocol.CodeUnavailable {
			break
		}
		if attempt == 1 {
			pending()
		}
		if !as.retryWait(parent, r, attempt) {
			break
		}
		err = nil
	}
	if err != nil {
		d.log.Warn("could not give back the units of an allotment", zap.String(keyPolicy, r.policy),
			zap.String(keyKey, r.args.Key), zap.Int64("units", r.units), zap.Error(err))
		n = 0
	} else if n == 0 && unknown && time.Now().Before(r.until) {
		// Sent again after an attempt whose outcome is unknown, and
		// nothing applied while the units still count: only that attempt
		// can have removed the reservation's record, so it gave them back.
		n = r.units
	}
	as.m.returned.WithLabelValues(r.policy).Add(float64(n))
	as.m.lost.WithLabelValues(r.policy).Add(float64(r.units - n))
}

// retryWait waits before attempt+1 of the return r: not at all after a
// first attempt when the breaker lets calls through (a reset connection),
// else a probe interval, the breaker's pace. False when r's units stop
// counting first, or parent ends, or the sidecar gives up.
func (as *allotments) retryWait(parent context.Context, r giveBackCall, attempt int) bool {
	if attempt == 1 && as.d.store.Admit(r.args.Key) == nil {
		return true
	}
	wait := max(as.d.store.ProbeInterval(), 10*time.Millisecond)
	left := time.Until(r.until)
	if left <= 0 {
		return false
	}
	t := time.NewTimer(min(wait, left))
	defer t.Stop()
	select {
	case <-t.C:
		return time.Now().Before(r.until)
	case <-parent.Done():
	case <-as.stop:
	}
	return false
}

// returnStarted and returnEnded count a return in flight, for a drain to
// wait for (waitReturns).
func (as *allotments) returnStarted() {
	as.retMu.Lock()
	as.returning++
	as.retMu.Unlock()
}

func (as *allotments) returnEnded() {
	as.retMu.Lock()
	as.returning--
	if as.returning == 0 && as.settled != nil {
		close(as.settled)
		as.settled = nil
	}
	as.retMu.Unlock()
}

// waitReturns waits until no return is in flight; false when ctx ended
// first.
func (as *allotments) waitReturns(ctx context.Context) bool {
	for {
		as.retMu.Lock()
		if as.returning == 0 {
			as.retMu.Unlock()
			return true
		}
		if as.settled == nil {
			as.settled = make(chan struct{})
		}
		settled := as.settled
		as.retMu.Unlock()
		select {
		case <-settled:
		case <-ctx.Done():
			return false
		}
	}
}

// giveUp ends the waits of the returns pending: their units are lost.
func (as *allotments) giveUp() {
	as.stopOnce.Do(func() { close(as.stop) })
}

// retry marks a's return as waiting to be sent again: the takes waiting
// for it, and those that come until it ends, go to Redis as any take.
func (as *allotments) retry(sh *allotShard, a *allot) {
	sh.mu.Lock()
	a.retrying = true
	waiting := a.waiting
	a.waiting = nil
	sh.mu.Unlock()
	for _, w := range waiting {
		as.d.send(w)
	}
}

// returned ends a's return: takes that came meanwhile get a reservation.
func (as *allotments) returned(sh *allotShard, a *allot) {
	sh.mu.Lock()
	a.busy, a.retrying = false, false
	if len(a.waiting) == 0 || sh.closed {
		waiting := a.waiting
		a.waiting = nil
		sh.mu.Unlock()
		for _, w := range waiting {
			as.d.send(w)
		}
		return
	}
	r := as.startReserve(a, time.Now())
	sh.mu.Unlock()
	as.reserve(sh, a, r)
}

// ReturnAllotments gives back every unit this sidecar holds, for a
// drain: the takes are answered by then. It waits for the returns in
// flight too, those after idle included; units it cannot give back
// before ctx ends are counted lost.
func (d *Dispatcher) ReturnAllotments(ctx context.Context) {
	as := d.allot
	for i := range as.shards {
		sh := &as.shards[i]
		sh.mu.Lock()
		if sh.closed {
			sh.mu.Unlock()
			continue
		}
		now := time.Now()
		for _, a := range sh.m {
			as.drop(a, now)
			if a.held == 0 || a.busy {
				continue
			}
			as.launchReturn(ctx, sh, a)
		}
		sh.mu.Unlock()
	}
	if !as.waitReturns(ctx) {
		as.giveUp()
	}
}

// close stops the idle timers and waits for the reservations and returns
// in flight; what is still held is lost (a drain returned it before).
func (as *allotments) close() {
	for i := range as.shards {
		sh := &as.shards[i]
		sh.mu.Lock()
		sh.closed = true
		for _, a := range sh.m {
			if a.timer != nil {
				a.timer.Stop()
			}
		}
		sh.mu.Unlock()
	}
	as.giveUp()
	as.running.Wait()
}

// mergeDeadline ends ctx at parent's deadline too, when it is sooner.
func mergeDeadline(ctx, parent context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := parent.Deadline(); ok {
		return context.WithDeadline(ctx, dl)
	}
	return context.WithCancel(ctx)
}

// allotMetrics are the allotments' series, by policy.
type allotMetrics struct {
	local, reservations, reserved, returned, lost *prometheus.CounterVec
	held                                          *prometheus.GaugeVec
}

func newAllotMetrics(reg *prometheus.Registry) allotMetrics {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"policy"})
	}
	m := allotMetrics{
		local:        counter("quotad_allotment_local_decisions_total", "Takes answered from units the sidecar reserved, without a Redis call of their own."),
		reservations: counter("quotad_allotment_reservations_total", "Reservations Redis answered, granted or denied."),
		reserved:     counter("quotad_allotment_units_reserved_total", "Units reserved in Redis for local answers."),
		returned:     counter("quotad_allotment_units_returned_total", "Units given back to Redis unused (after idle, or at a drain)."),
		lost:         counter("quotad_allotment_units_lost_total", "Units reserved but neither handed out nor given back: their window ended first, or their return failed. A killed sidecar cannot count what it held: at most that, until its window ends."),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quotad_allotment_units_held",
			Help: "Units the sidecar holds, reserved in Redis and not yet handed out.",
		}, []string{"policy"}),
	}
	if reg != nil {
		reg.MustRegister(m.local, m.reservations, m.reserved, m.returned, m.lost, m.held)
	}
	return m
}
