package enforce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/internal/storeguard"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/usage"
)

// DefaultMeterGrace keeps a period's live counter this long after the period
// ends, so that the last flush (or a sweep finding a dead instance's counter)
// still finds it.
const DefaultMeterGrace = 7 * 24 * time.Hour

// meterer is the usage stage. A call's usage is charged on the meter in the
// same atomic step that admits it (see limiter); meterer builds meters,
// seeds them from the durable total, applies cost corrections, and keeps in
// process what could not be placed on the meter (the shared store or the
// usage store was down), placing it as soon as both answer.
//
// Exactly once. Every write to a meter is an op (limit.Meter.Op): a write
// whose answer was lost (a timeout, a broken connection) is kept pending
// with its op and placed again with the same op, which the store applies
// only if the first attempt did not land. Every write that landed is kept
// in a journal until a flush shows the durable store holds it; when the
// store loses the meter (Redis restarted empty), the journal's entries are
// placed again as replays (limit.Replay), which the store applies only when
// the new meter's seed does not hold them. See docs/design.md, "Usage and
// quotas".
type meterer struct {
	store limit.MeteredStore // where meters live: the shared store, or the in-process one
	// guard is store when it is the shared store (nil: the in-process
	// one, whose counters end with the process, no other instance's sweep
	// finding them, and which has no breaker to wait for at shutdown).
	guard   *guardedStore
	durable usage.Store
	flusher *usage.Flusher
	log     *slog.Logger
	stats   *metrics.Metrics
	every   time.Duration

	// wake asks run to place pending usage now rather than at its next
	// tick: an op just lost its answer (addOp). Buffered (1): wakes that
	// come while a placement runs make one more.
	wake chan struct{}
	// storeUp, when not nil, is told when the store breaker closes again
	// (its probe found the store answering): the ops the breaker held
	// back are placed at once.
	storeUp <-chan struct{}

	// closed is set when the shutdown's final flush starts: usage recorded
	// from then on (a call settled after Engine.Close) is written at once
	// (settleClosed), for no flush is coming.
	closed atomic.Bool

	mu      sync.Mutex
	pending map[string]*pendingUsage
	journal map[string]*journal
	// reported and placing are what the local fallback decides a quota on
	// (see known): the usage the store last reported for a meter with a
	// quota, and the pending usage placeKey has taken out of pending and
	// not yet resolved (nil until a placement).
	reported aging[limit.Usage]
	placing  map[string]limit.Usage
	// journaled counts the entries of every journal; past sweepAt
	// (at least maxJournaled) the stalled journals are trimmed together.
	journaled, sweepAt int
}

// pendingUsage is usage admitted but not yet on its meter.
type pendingUsage struct {
	meter limit.Meter // the key's meter, without op
	// delta was never sent to the store: placed with a new op.
	delta limit.Usage
	// ops were sent (or are replays) and may have landed: each is placed
	// again with its own op.
	ops []pendingOp
}

// pendingOp is one op whose outcome is unknown.
type pendingOp struct {
	op     string
	replay *limit.Replay
	delta  limit.Usage
	// sent is when the op was first sent (zero: never sent). Its marker
	// lives limit.OpTTL from its execution: an op placed again later may
	// count twice (counted in Unmetered, once: doubt).
	sent  time.Time
	doubt bool
}

// inDoubt reports whether op was sent as a plain op (not a replay) and its
// answer lost: it may have landed, and its marker is the only thing that
// keeps it from counting twice. Should the store lose the meter (and the
// marker with it) after a flush read the op into the durable total, the
// op placed again on the meter re-created from that total counts twice
// (docs/design.md, "Bounds" (2)): such an op must be placed again as soon
// as the store answers. A replay needs no such haste: it is judged
// against the new meter's seed.
func (op pendingOp) inDoubt() bool { return !op.sent.IsZero() && op.replay == nil }

// journal is what this instance wrote to one meter and the durable store
// is not yet known to hold. Its entries are all of one generation of the
// meter, gen: an answer of another generation sends them to be placed
// again first (see record), so a call compares one generation, not one per
// entry (a hot tenant's journal holds every call of a flush interval).
type journal struct {
	meter   limit.Meter
	gen     string
	entries []journalEntry
	// drained is when a flush last showed the usage store holding some of
	// the entries (or when the journal was made): the trim's clock.
	drained time.Time
}

// journalEntry is one op that landed, leaving the meter at after.
type journalEntry struct {
	op           string
	delta, after limit.Usage
}

func newMeterer(store limit.MeteredStore, us usage.Store, every time.Duration, log *slog.Logger, stats *metrics.Metrics) *meterer {
	m := &meterer{
		store:   store,
		durable: us,
		log:     log,
		stats:   stats,
		every:   every,
		wake:    make(chan struct{}, 1),
		pending: make(map[string]*pendingUsage),
		journal: make(map[string]*journal),
	}
	m.flusher = usage.NewFlusher(store, us, &usage.FlusherOptions{Interval: every, Logger: log,
		OnFailure: func(op string) { stats.UsageFlushFailures.WithLabelValues(op).Inc() },
		Observe:   m.observe})
	return m
}

// run flushes meters and places pending usage until ctx ends, then flushes
// a last time (see shutdown).
func (m *meterer) run(ctx context.Context) {
	// The flusher stops (and makes its final flush) only after the last
	// placement of pending usage: a meter placed after the final flush
	// had drained the tracked keys would miss it.
	fctx, stopFlusher := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFlusher()
	final := make(chan error, 1)
	go func() { final <- m.flusher.Run(fctx) }()
	t := time.NewTicker(m.every)
	defer t.Stop()
	// retry places in-doubt ops again sooner than the tick while any is
	// pending (see pendingOp.inDoubt): nil when none is.
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			m.shutdown(ctx, func() error {
				stopFlusher()
				return <-final
			})
			return
		case <-m.wake:
		case <-retry:
		case <-m.storeUp:
			// The probe tells before the breaker lets calls through:
			// wait for that (a moment) so that every kind of pending
			// usage goes, not only the in-doubt ops placed past it.
			m.guard.awaitUp(time.Now().Add(time.Second))
		case <-t.C:
			if h := m.flusher.Health(); !h.LastSuccess.IsZero() {
				m.stats.UsageLastFlush.Set(float64(h.LastSuccess.UnixMilli()) / 1000)
			}
		}
		m.placePending(ctx)
		retry = nil
		if m.every > inDoubtRetry && m.hasInDoubt() {
			retry = time.After(inDoubtRetry)
		}
	}
}

// inDoubtRetry is how often in-doubt ops still pending are placed again
// (when the flush interval is longer): the store breaker's probe interval,
// so that a store answering this instance again resolves them that soon,
// whether or not the breaker had opened. A store still not answering costs
// one write a round, in the background (see placing).
const inDoubtRetry = storeguard.DefaultProbeInterval

// hasInDoubt reports whether an in-doubt op is pending.
func (m *meterer) hasInDoubt() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.pending {
		for _, op := range p.ops {
			if op.inDoubt() {
				return true
			}
		}
	}
	return false
}

// meterFor is the meter of tenant for the period containing now, with a
// new op.
func meterFor(tenant string, quota int64, now time.Time) *limit.Meter {
	period := usage.Period(now)
	end, _ := usage.PeriodEnd(period)
	return &limit.Meter{
		Key: keyspace.Usage(tenant, period), Tenant: tenant, Period: period,
		Quota: quota, ExpireAt: end.Add(DefaultMeterGrace), Op: limit.NewOp(),
	}
}

// seedTimeout bounds the read of the durable total that re-creates a missing
// meter. The read is on the request path (the first call of a tenant in a
// period, every call after Redis lost its data), and a usage store that hangs
// (a network partition, a locked SQLite file) must not hold calls: past the
// deadline the call is decided without its meter, and its usage waits in
// process until the meter can be rebuilt.
const seedTimeout = 500 * time.Millisecond

// seed returns meter with its Seed set to the durable total of its period.
func (m *meterer) seed(ctx context.Context, meter limit.Meter) (limit.Meter, error) {
	ctx, cancel := context.WithTimeout(ctx, seedTimeout)
	defer cancel()
	u, err := m.flusher.Seed(ctx, meter.Tenant, meter.Period)
	if err != nil {
		return meter, err
	}
	meter.Seed, meter.Seeded = u, true
	return meter, nil
}

// charged records that the store applied meter's op, delta, with answer mr
// (the flusher writes it; the journal keeps it until it is durable).
func (m *meterer) charged(meter limit.Meter, delta limit.Usage, mr limit.MeterResult) {
	m.saw(meter, mr.Usage)
	m.record(meter, meter.Op, delta, mr)
	m.flusher.Track(meter.Key)
}

// record journals an op that landed, and has every entry of another
// generation of the meter placed again: the store lost it (or, when mr
// is the older answer, the replays find their generation live, apply
// nothing and are journaled again in it: see tryAdjust).
func (m *meterer) record(meter limit.Meter, op string, delta limit.Usage, mr limit.MeterResult) {
	if mr.Gen.ID == "" {
		return // a meter without generation (written by an older version): nothing to compare
	}
	m.mu.Lock()
	j := m.journal[meter.Key]
	if j == nil {
		j = &journal{meter: bare(meter), drained: time.Now()}
		m.journal[meter.Key] = j
	}
	m.lostLocked(j, mr.Gen.ID)
	j.gen = mr.Gen.ID
	j.entries = append(j.entries, journalEntry{op: op, delta: delta, after: mr.Usage})
	m.journaled++
	if len(j.entries) > maxJournal && time.Since(j.drained) > m.journalStall() {
		m.trimLocked(j)
	}
	if m.journaled > max(m.sweepAt, maxJournaled) {
		m.trimStalledLocked()
	}
	m.mu.Unlock()
}

// maxJournal bounds one meter's journal once the usage store has stopped
// draining it (journalStall). It holds a flush interval of the meter's
// charges while the usage store answers, but every charge while it is
// down: without a bound, hours of outage at thousands of calls a second
// would exhaust the process's memory (about 110 bytes an entry), losing
// its pending usage with it.
const maxJournal = 1 << 17

// maxJournaled bounds the entries of all journals together, for the same
// reason: an outage spread over many tenants fills no one journal up to
// maxJournal, but can fill memory all the same.
const maxJournaled = 1 << 20

// journalStall is how long a journal goes without a flush draining it
// before it may be trimmed: a few flush intervals, so that a hot tenant's
// journal under a long flush_interval is never trimmed while the usage
// store keeps up.
func (m *meterer) journalStall() time.Duration { return max(3*m.every, time.Minute) }

// trimLocked drops the oldest quarter of j's entries. Their usage is on
// the meter, but should the store lose the meter before the usage store
// holds it, it could no longer be placed again: their calls are counted in
// mcpgate_unmetered_calls_total. Call with mu held.
func (m *meterer) trimLocked(j *journal) {
	n := len(j.entries) / 4
	m.dropOldestLocked(j, n)
	m.log.Warn("usage journal full: the usage store has not held this meter's charges for a long time; the oldest could not be placed again should the limit store lose the meter",
		"tenant", j.meter.Tenant, "period", j.meter.Period, "dropped", n)
}

// trimStalledLocked drops the oldest quarter (at least one entry) of every
// journal not drained for journalStall, as trimLocked does for one, once
// the journals together hold more than maxJournaled entries. The next sweep
// waits until they grew by another quarter of the bound, so that journals
// still drained (kept whole) do not make every charge sweep. Call with mu
// held.
func (m *meterer) trimStalledLocked() {
	stall := m.journalStall()
	var meters, dropped int
	for _, j := range m.journal {
		if len(j.entries) == 0 || time.Since(j.drained) <= stall {
			continue
		}
		n := (len(j.entries) + 3) / 4
		m.dropOldestLocked(j, n)
		meters++
		dropped += n
	}
	m.sweepAt = m.journaled + maxJournaled/4
	if dropped > 0 {
		m.log.Warn("usage journals full: the usage store has not held these meters' charges for a long time; the oldest could not be placed again should the limit store lose the meters",
			"meters", meters, "dropped", dropped)
	}
}

// dropOldestLocked drops j's n oldest entries and counts their calls in
// mcpgate_unmetered_calls_total (see trimLocked). Call with mu held.
func (m *meterer) dropOldestLocked(j *journal, n int) {
	var calls int64
	for _, e := range j.entries[:n] {
		calls += e.delta.Calls
	}
	clear(j.entries[:n])
	j.entries = j.entries[n:]
	m.journaled -= n
	m.stats.Unmetered.Add(float64(calls))
}

// bare is meter without its op, seed and quota: the template of the key's
// later writes.
func bare(meter limit.Meter) limit.Meter {
	meter.Op, meter.Replay, meter.Seed, meter.Seeded, meter.Quota, meter.Cost = "", nil, limit.Usage{}, false, 0, 0
	return meter
}

// lostLocked moves the entries of j to the pending replays of its key
// unless they are of generation gen (every entry when gen is ""). Call with
// mu held.
func (m *meterer) lostLocked(j *journal, gen string) {
	if len(j.entries) == 0 || gen != "" && j.gen == gen {
		return
	}
	lost := make([]pendingOp, len(j.entries))
	for i, e := range j.entries {
		lost[i] = pendingOp{op: e.op + "-r", replay: &limit.Replay{Gen: j.gen, After: e.after}, delta: e.delta}
	}
	m.journaled -= len(j.entries)
	clear(j.entries)
	j.entries = j.entries[:0]
	p := m.pendingLocked(j.meter)
	p.ops = append(p.ops, lost...)
	m.log.Warn("usage meter lost by its store: this instance's writes the durable store may not hold are placed again",
		"tenant", j.meter.Tenant, "period", j.meter.Period, "ops", len(lost))
}

// observe is the flusher's report on a meter (usage.FlusherOptions.Observe):
// the journal forgets what the durable store holds, and places again what a
// lost meter held.
func (m *meterer) observe(key string, found bool, gen limit.Generation, durable limit.Usage) {
	m.mu.Lock()
	defer m.mu.Unlock()
	j := m.journal[key]
	if j == nil || !found && len(j.entries) == 0 {
		return
	}
	if !found {
		m.lostLocked(j, "")
	} else if gen.ID != "" {
		m.lostLocked(j, gen.ID)
		kept := j.entries[:0]
		for _, e := range j.entries {
			if !limit.Holds(durable, e.after, e.delta) {
				kept = append(kept, e)
			}
		}
		if len(kept) < len(j.entries) {
			j.drained = time.Now()
		}
		m.journaled -= len(j.entries) - len(kept)
		clear(j.entries[len(kept):])
		j.entries = kept
	}
	if len(j.entries) == 0 {
		delete(m.journal, key)
	} else {
		m.flusher.Track(key) // until the durable store holds them
	}
	m.stats.UsagePending.Set(float64(len(m.pending)))
}

// adjust adds delta to meter as a new op, keeping it pending when it
// cannot be placed. Any seed meter carries is dropped: it was read at the
// call's admission, and a meter lost since must be re-created from the
// durable total as it is now (tryAdjust seeds it on NeedSeed). It reports
// false when delta was dropped, never to be placed (the meter is full):
// the caller must not report it charged.
func (m *meterer) adjust(ctx context.Context, meter limit.Meter, delta limit.Usage) (kept bool) {
	meter.Op, meter.Replay, meter.Seed, meter.Seeded = limit.NewOp(), nil, limit.Usage{}, false
	_, _, err := m.tryAdjust(ctx, m.store, meter, delta)
	switch {
	case err == nil:
		if m.closed.Load() {
			m.settleClosed(ctx, meter, delta)
		}
	case neverPlaced(err):
		// The store answered and applied nothing (the meter is full): no
		// answer was lost, and placing it again would fail the same way.
		m.dropUnplaceable(meter, delta, err)
		return false
	default:
		m.addOp(meter, pendingOp{op: meter.Op, delta: delta, sent: sentAt(err)}, err)
	}
	return true
}

// sentAt is the time an op that failed with err was sent: now, unless err
// says it never left (the store breaker was open) or the store applied
// nothing (errNotApplied).
func sentAt(err error) time.Time {
	if errors.Is(err, ErrStoreDown) || errors.Is(err, errNotApplied) {
		return time.Time{}
	}
	return time.Now()
}

// errNotApplied wraps the failure of a meter write whose store answered
// that it lacks the meter (NeedSeed: nothing applied, no op marker left)
// and whose seeded write never went out, its durable total unreadable. It
// is kept as never sent: placed again however much later, it cannot count
// twice, and must not be flagged as if it could.
var errNotApplied = errors.New("enforce: usage write not applied: the meter is missing and could not be re-created")

// tryAdjust places delta on meter (with its op) in store (m.store, or
// past its breaker: see placeKey), seeding the meter when the store lost
// it. A placed op is journaled, and so is a replay the live generation
// already counts (its own: see below); covered reports a replay that found
// its usage already counted, reseeded that the meter had to be re-created.
func (m *meterer) tryAdjust(ctx context.Context, store limit.MeteredStore, meter limit.Meter, delta limit.Usage) (covered, reseeded bool, err error) {
	r, err := store.Adjust(ctx, meter, delta)
	if err == nil && r.NeedSeed {
		reseeded = true
		if meter, err = m.seed(ctx, meter); err != nil {
			return false, reseeded, fmt.Errorf("%w: durable total unreadable: %w", errNotApplied, err)
		}
		r, err = store.Adjust(ctx, meter, delta)
		if err == nil && r.NeedSeed {
			return false, reseeded, fmt.Errorf("%w: still missing after seeding", errNotApplied)
		}
	}
	if err != nil {
		return false, reseeded, err
	}
	if r.Covered {
		if meter.Replay != nil && r.Gen.ID != "" && r.Gen.ID == meter.Replay.Gen {
			// Covered because its generation is the live one: that meter
			// is all that holds it, so it stays journaled there (at its
			// after in that generation) until a flush shows the durable
			// store holding it; dropped, it would be placed again by no
			// one should the store lose the meter. Only a replay the new
			// generation's seed holds is done with.
			m.charged(meter, delta, limit.MeterResult{Usage: meter.Replay.After, Gen: r.Gen})
		}
		return true, reseeded, nil
	}
	m.charged(meter, delta, r)
	return false, reseeded, nil
}

// addPending keeps usage that never reached its meter (the store breaker
// was open, or the meter could not be seeded): it is placed later as a new
// op. It lives in this process only until placed: a crash before then
// loses it (see docs).
func (m *meterer) addPending(meter limit.Meter, delta limit.Usage, cause error) {
	m.mu.Lock()
	p, fresh := m.pending[meter.Key], false
	if p == nil {
		p, fresh = m.pendingLocked(meter), true
	}
	p.delta = add(p.delta, delta)
	n := len(m.pending)
	m.mu.Unlock()
	m.stats.UsagePending.Set(float64(n))
	if m.closed.Load() {
		m.settleClosed(context.Background(), meter, delta)
		return
	}
	if fresh {
		m.log.Warn("usage kept in process until its meter can be reached", "tenant", meter.Tenant, "period", meter.Period, "err", cause)
	}
}

// takeBack cancels the charge delta of a call that was refused after the
// charge got no answer: the op is placed again (it lands once, whether or
// not it had) and delta placed as refunded, so the call nets nothing.
func (m *meterer) takeBack(meter limit.Meter, delta limit.Usage) {
	m.addOp(meter, pendingOp{op: meter.Op, delta: delta, sent: time.Now()}, errors.New("refused after a meter charge that got no answer"))
	m.addPending(meter, limit.Usage{Refunded: delta.Charged, RefundedCalls: delta.Calls}, errors.New("the refund of a refused call"))
}

// addOp keeps an op whose outcome is unknown, to be placed again with the
// same op.
func (m *meterer) addOp(meter limit.Meter, op pendingOp, cause error) {
	m.mu.Lock()
	p := m.pendingLocked(meter)
	p.ops = append(p.ops, op)
	n := len(m.pending)
	m.mu.Unlock()
	m.stats.UsagePending.Set(float64(n))
	m.log.Warn("a usage write got no answer: it is kept and placed again with the same op (applied once)",
		"tenant", meter.Tenant, "period", meter.Period, "op", op.op, "err", cause)
	if m.closed.Load() {
		m.settleClosed(context.Background(), meter, op.delta)
		return
	}
	// At once, not at the next tick: until it is placed again, a flush
	// reading the op into the durable total followed by the store losing
	// the meter makes it count twice (see pendingOp.inDoubt).
	m.placeSoon()
}

// placeSoon has run place the pending usage now (without waiting, on the
// meterer's goroutine: the caller is a request, which must not wait for a
// store that just failed to answer it).
func (m *meterer) placeSoon() {
	select {
	case m.wake <- struct{}{}:
	default: // a placement is already due
	}
}

// settleClosed writes, after the shutdown's final flush began, the usage
// of meter's key just recorded (delta, on the meter or pending): its
// pending usage is placed and the meter flushed at once, each step bounded
// by releaseTimeout, for nothing would place or flush it later. What is
// still pending then, and on the in-process store what the flush could
// not write, is lost with the process: its calls are counted in
// mcpgate_unmetered_calls_total (a correction, which adds no call, as its
// call) and logged. On the shared store a failed flush loses nothing: the
// live counter keeps it for another instance's sweep.
func (m *meterer) settleClosed(ctx context.Context, meter limit.Meter, delta limit.Usage) {
	ctx = context.WithoutCancel(ctx)
	step := func(f func(context.Context)) {
		sctx, cancel := context.WithTimeout(ctx, releaseTimeout)
		defer cancel()
		f(sctx)
	}
	step(func(ctx context.Context) { m.placeKey(ctx, meter.Key, nil, nil) })
	var err error
	step(func(ctx context.Context) { err = m.flusher.Flush(ctx) })
	left := m.takePending(meter.Key)
	switch {
	case left != nil:
		calls := lostCalls(left.delta)
		for _, op := range left.ops {
			calls += lostCalls(op.delta)
		}
		m.stats.Unmetered.Add(float64(calls))
		m.log.Error("usage recorded after the engine closed could not be placed on its meter: lost with this process; its calls are counted in mcpgate_unmetered_calls_total",
			"tenant", meter.Tenant, "period", meter.Period, "calls", calls)
	case err != nil && m.guard == nil:
		calls := lostCalls(delta)
		m.stats.Unmetered.Add(float64(calls))
		m.log.Error("usage recorded after the engine closed could not be flushed: the in-process counter's usage is lost with this process; its calls are counted in mcpgate_unmetered_calls_total",
			"tenant", meter.Tenant, "period", meter.Period, "calls", calls, "err", err)
	case err != nil:
		m.log.Error("usage recorded after the engine closed could not be flushed: the shared store's live counter keeps it for another instance's sweep",
			"tenant", meter.Tenant, "period", meter.Period, "err", err)
	default:
		m.log.Info("usage recorded after the engine closed written at once", "tenant", meter.Tenant, "period", meter.Period, "usage", delta)
	}
}

// lostCalls is how many calls usage u lost stands for: its calls, or the
// one call of a correction (which adds none); 0 for no usage.
func lostCalls(u limit.Usage) int64 {
	if u.Calls > 0 || u == (limit.Usage{}) {
		return u.Calls
	}
	return 1
}

// takePending removes and returns the pending usage of key (nil if none):
// whoever takes it accounts for it.
func (m *meterer) takePending(key string) *pendingUsage {
	m.mu.Lock()
	p := m.pending[key]
	delete(m.pending, key)
	n := len(m.pending)
	m.mu.Unlock()
	m.stats.UsagePending.Set(float64(n))
	return p
}

// pendingLocked returns the pending usage of meter's key, made if needed.
// Call with mu held.
func (m *meterer) pendingLocked(meter limit.Meter) *pendingUsage {
	p := m.pending[meter.Key]
	if p == nil {
		p = &pendingUsage{meter: bare(meter)}
		m.pending[meter.Key] = p
	}
	return p
}

func add(a, b limit.Usage) limit.Usage {
	return limit.Usage{Charged: a.Charged + b.Charged, Refunded: a.Refunded + b.Refunded,
		Calls: a.Calls + b.Calls, RefundedCalls: a.RefundedCalls + b.RefundedCalls}
}

func sub(a, b limit.Usage) limit.Usage {
	return limit.Usage{Charged: a.Charged - b.Charged, Refunded: a.Refunded - b.Refunded,
		Calls: a.Calls - b.Calls, RefundedCalls: a.RefundedCalls - b.RefundedCalls}
}

func (m *meterer) pendingCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pending)
}

// opHorizon is how long after its first sending an op may be placed again
// with the certainty that its marker, had it landed, is still there: the
// marker lives limit.OpTTL from the op's execution, which is after its
// sending; the margin covers the time the new attempt takes to run.
const opHorizon = limit.OpTTL - 30*time.Second

// neverPlaced reports whether a placement failed for a reason no retry
// changes: the meter's period ended longer than its grace ago
// (ErrMeterExpired), a field would pass MaxUsage, or the op is one no
// store accepts (ErrInvalidMeter, such as a replay of replays whose id
// grew past MaxOpLen).
func neverPlaced(err error) bool {
	return meterFull(err) || errors.Is(err, limit.ErrInvalidMeter)
}

// meterFull reports whether a meter could take no write for its own sake:
// a field would pass MaxUsage (ErrUsageOverflow) or its period ended
// longer than its grace ago (ErrMeterExpired). The store answered and
// changed nothing; it says nothing of the store's health.
func meterFull(err error) bool {
	return errors.Is(err, limit.ErrMeterExpired) || errors.Is(err, limit.ErrUsageOverflow)
}

// dropUnplaceable drops usage that failed to be placed on meter for a
// reason no retry changes (neverPlaced): tried again it would fail again,
// for ever, and the process would hold it. It is counted and said: its
// calls, or the one call of a correction, which adds none (lostCalls), so
// that a dropped correction shows in mcpgate_unmetered_calls_total too.
func (m *meterer) dropUnplaceable(meter limit.Meter, delta limit.Usage, err error) {
	calls := lostCalls(delta)
	m.stats.Unmetered.Add(float64(calls))
	m.log.Error("usage that can never be placed on its meter is dropped; its calls are counted in mcpgate_unmetered_calls_total",
		"tenant", meter.Tenant, "period", meter.Period, "op", meter.Op, "usage", delta, "calls", calls, "err", err)
}

// placePending moves pending usage onto its meters. It runs in the
// background (run's tick or wake, the shutdown), so in-doubt ops may go
// past an open store breaker (see placeKey).
func (m *meterer) placePending(ctx context.Context) {
	m.mu.Lock()
	keys := slices.Collect(maps.Keys(m.pending))
	m.mu.Unlock()
	pass := &placing{pastBreaker: m.guard != nil}
	for _, k := range keys {
		m.placeKey(ctx, k, nil, pass)
	}
	m.stats.UsagePending.Set(float64(m.pendingCount()))
}

// placing is the state of one round of placements.
//
// pastBreaker: an in-doubt op (pendingOp.inDoubt) the open store breaker
// would refuse is sent to the store all the same. The breaker keeps
// requests from waiting on a store that does not answer; this placement
// is no request, and what it resolves cannot wait: while the breaker of
// this instance stays open (until its probe answers, which under load can
// be many flush intervals), another instance whose breaker is closed
// keeps flushing the meter holding the op, and a data loss then makes the
// op count twice. The store's answer is what it would be with the breaker
// closed (the op applies once), so going past the breaker changes no
// count, only how soon the doubt ends. The cost stays small: the first
// op that gets no answer past the breaker ends it for the round, so a
// store really down costs one store.timeout a round, in the background.
type placing struct {
	pastBreaker bool
}

// placeKey places the pending usage of key, with seed (when not nil) as
// the meter's seed; what cannot be placed stays pending. pass, when not
// nil, lets in-doubt ops go past an open store breaker (see placing).
func (m *meterer) placeKey(ctx context.Context, key string, seed *limit.Usage, pass *placing) {
	m.mu.Lock()
	p := m.pending[key]
	delete(m.pending, key)
	if p != nil {
		if m.placing == nil {
			m.placing = make(map[string]limit.Usage)
		}
		m.placing[key] = add(m.placing[key], p.total())
	}
	m.mu.Unlock()
	if p == nil {
		return
	}
	ops := p.ops
	if p.delta != (limit.Usage{}) {
		ops = append(ops, pendingOp{op: limit.NewOp(), delta: p.delta})
	}
	for _, op := range ops {
		m.placeOp(ctx, p, op, seed, pass)
	}
}

// placeOp places one op of p, taken out of pending by placeKey: it is
// kept pending again when it cannot be placed, and leaves placing either
// way (after the store's answer is recorded: see known).
func (m *meterer) placeOp(ctx context.Context, p *pendingUsage, op pendingOp, seed *limit.Usage, pass *placing) {
	defer m.placed(p.meter.Key, op.delta)
	meter := p.meter
	meter.Op, meter.Replay = op.op, op.replay
	if seed != nil {
		meter.Seed, meter.Seeded = *seed, true
	}
	if !op.sent.IsZero() && !op.doubt && time.Since(op.sent) > opHorizon {
		// Its marker may be gone: placed all the same (the call ran),
		// it may count twice.
		op.doubt = true
		m.stats.Unmetered.Add(float64(lostCalls(op.delta)))
		m.log.Error("a usage write left unanswered longer than its op is remembered is placed again: it may count twice",
			"tenant", meter.Tenant, "period", meter.Period, "op", op.op, "sent", op.sent)
	}
	store, past := m.store, false
	if pass != nil && pass.pastBreaker && op.inDoubt() && !m.guard.Available() {
		store, past = pastBreaker{m.guard}, true
	}
	covered, reseeded, err := m.tryAdjust(ctx, store, meter, op.delta)
	if past && err != nil && !neverPlaced(err) && !errors.Is(err, errNotApplied) {
		pass.pastBreaker = false // the store does not answer: the probe will tell
	}
	if err == nil && op.inDoubt() && (seed != nil || reseeded) {
		// Its marker went with the lost meter: had it landed there and
		// been flushed before the loss, it now counts twice (docs/design.md,
		// "Bounds" (2)).
		m.log.Warn("a usage write that got no answer was placed on its meter re-created after a loss: it counts twice if it had landed and been flushed before the loss",
			"tenant", meter.Tenant, "period", meter.Period, "op", op.op, "sent", op.sent)
	}
	if err != nil && neverPlaced(err) {
		if op.doubt {
			// counted unmetered when it passed its op's horizon
			m.log.Error("usage that can never be placed on its meter is dropped (already counted in mcpgate_unmetered_calls_total)",
				"tenant", meter.Tenant, "period", meter.Period, "op", op.op, "usage", op.delta, "err", err)
			return
		}
		m.dropUnplaceable(meter, op.delta, err)
		return
	}
	if err != nil {
		if op.sent.IsZero() {
			op.sent = sentAt(err)
		}
		m.mu.Lock()
		q := m.pendingLocked(p.meter)
		q.ops = append(q.ops, op)
		m.mu.Unlock()
		return
	}
	m.log.Info("pending usage recorded", "tenant", meter.Tenant, "period", meter.Period,
		"cost", op.delta.Used(), "calls", op.delta.NetCalls(), "replay", op.replay != nil, "already_counted", covered)
}

// replayLost places, before a call is decided on a meter its store lost
// (NeedSeed), every write of this instance the durable store may not hold
// and every pending op of that meter, on the meter re-created from seed.
// Another instance may have re-created the meter since the NeedSeed, and
// this one charged it: those entries, replays of the live generation, stay
// journaled (see tryAdjust).
func (m *meterer) replayLost(ctx context.Context, meter limit.Meter) {
	m.mu.Lock()
	if j := m.journal[meter.Key]; j != nil {
		m.lostLocked(j, "")
		delete(m.journal, meter.Key)
	}
	m.mu.Unlock()
	seed := meter.Seed
	m.placeKey(ctx, meter.Key, &seed, nil)
}

// correction is the usage delta that turns an estimated charge into the
// cost a tool reported, and whether there is one.
func correction(estimate, actual int64) (limit.Usage, bool) {
	switch {
	case actual > estimate:
		return limit.Usage{Charged: actual - estimate}, true
	case actual < estimate:
		return limit.Usage{Refunded: estimate - actual}, true
	}
	return limit.Usage{}, false
}

// maxReportedCost bounds a cost read from a tool result.
const maxReportedCost = 1 << 40

// reportedCost reads the non-negative integer at the dotted path (for
// example "_meta.usage.tokens") of a JSON-RPC result.
func reportedCost(result json.RawMessage, path string) (int64, error) {
	var v any
	if err := json.Unmarshal(result, &v); err != nil {
		return 0, fmt.Errorf("result is not JSON: %w", err)
	}
	for _, part := range strings.Split(path, ".") {
		obj, ok := v.(map[string]any)
		if !ok {
			return 0, fmt.Errorf("%s: not found", path)
		}
		if v, ok = obj[part]; !ok {
			return 0, fmt.Errorf("%s: not found", path)
		}
	}
	f, ok := v.(float64)
	if !ok || f < 0 || f > maxReportedCost || f != math.Trunc(f) {
		return 0, fmt.Errorf("%s: %v is not a non-negative integer", path, v)
	}
	return int64(f), nil
}

// ErrNoMetering means the Engine has no usage store (Options.Usage).
var ErrNoMetering = errors.New("enforce: usage metering is not configured")

// Usage reads tenant's usage in period: the live meter where the store
// holds one ahead of the durable total (live is then true; it is ahead by at
// most one flush), else the durable total with the time it was written
// (nil when the durable store has no record).
func (e *Engine) Usage(ctx context.Context, tenant, period string) (u limit.Usage, updated *time.Time, live bool, err error) {
	m := e.lim.meters
	if m == nil {
		return limit.Usage{}, nil, false, ErrNoMetering
	}
	rec, found, err := m.durable.Get(ctx, tenant, period)
	if err != nil {
		return limit.Usage{}, nil, false, err
	}
	if found {
		updated = &rec.UpdatedAt
	}
	if st, ok, err := m.store.ReadMeter(ctx, keyspace.Usage(tenant, period)); err == nil && ok && !rec.Usage.Covers(st.Live) {
		return st.Live.Max(rec.Usage), updated, true, nil
	}
	return rec.Usage, updated, false, nil
}

// Metered reports whether the Engine meters usage (Options.Usage is set).
func (e *Engine) Metered() bool { return e.lim.meters != nil }

// Flusher is the usage flusher that writes the live meters to the durable
// store (nil without metering): for operations that flush or sweep on
// demand. The Engine runs it on its own; Close flushes a last time.
func (e *Engine) Flusher() *usage.Flusher {
	if e.lim.meters == nil {
		return nil
	}
	return e.lim.meters.flusher
}

// PendingUsage is how many meters have usage waiting in process because
// their store could not be reached (0 without metering). It is placed on
// the next flush tick that reaches the store, or sooner: a write whose
// answer was lost is placed again at once, and everything pending when
// the store breaker closes again.
func (e *Engine) PendingUsage() int {
	if e.lim.meters == nil {
		return 0
	}
	return e.lim.meters.pendingCount()
}

// UsageHealth reports the state of the durable usage writes: how many
// flushes failed in a row (0: the last one worked) and when one last
// succeeded. metered is false without a usage store. A failing usage store
// does not stop calls: their usage waits in the live counters (see
// docs/design.md, "Usage and quotas").
func (e *Engine) UsageHealth() (h usage.Health, metered bool) {
	if e.lim.meters == nil {
		return usage.Health{}, false
	}
	return e.lim.meters.flusher.Health(), true
}
