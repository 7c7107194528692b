package usage

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/internal/fanout"
	"github.com/mcpgate/mcpgate/limit"
)

// Defaults of FlusherOptions.
const (
	DefaultInterval   = time.Second
	DefaultSweepEvery = 10
	DefaultTimeout    = 10 * time.Second
	DefaultMaxBackoff = 30 * time.Second
)

// BatchSize is the most records one Flush or Sweep hands to one Store.Put.
const BatchSize = 100

// workers bounds the concurrent ReadMeter and MarkFlushed calls of one flush:
// enough to overlap the round trips to a remote limit store, few enough not
// to crowd out the calls being admitted.
const workers = 8

// FlusherOptions configure a Flusher. A nil *FlusherOptions, and zero (or
// negative) fields, mean the documented defaults.
type FlusherOptions struct {
	// Interval is how often Run flushes the tracked meters (DefaultInterval).
	// It bounds how far the durable totals lag the live counters, and so how
	// much usage a crash of the limit store itself (memory store, Redis
	// without persistence) can lose.
	Interval time.Duration
	// SweepEvery makes Run sweep (see Sweep) every SweepEvery intervals, and
	// once when it starts (DefaultSweepEvery).
	SweepEvery int
	// Timeout bounds the I/O of each flush and sweep that Run makes,
	// including the final flush after its context ends (DefaultTimeout).
	Timeout time.Duration
	// MaxBackoff caps the wait between Run's attempts after failures: the
	// wait starts at Interval and doubles with each consecutive failure
	// (DefaultMaxBackoff, or Interval if that is longer).
	MaxBackoff time.Duration
	// Logger receives failures (warn), recoveries and the final flush
	// (info); nil means slog.Default().
	Logger *slog.Logger
	// Now stamps Record.UpdatedAt; nil means time.Now. Backoff uses the
	// real clock whatever Now is.
	Now func() time.Time
	// OnFailure, when not nil, is called once after every Flush or Sweep
	// that returns an error (op is "flush" or "sweep"), Run's final flush
	// included: the hook for a failure counter, since Run only logs. It is
	// called on the flushing goroutine with no lock held and must not
	// block.
	OnFailure func(op string)
	// Observe, when not nil, is told what each flush learnt of a meter it
	// read: found false when the limit store no longer holds the key (it
	// expired, or the store lost its data); otherwise the meter's
	// generation and the usage the durable store is known to hold for it
	// (the snapshot written, or the part recorded as flushed). The engine
	// uses it to forget the usage it keeps until it is durable, and to
	// notice a meter its store lost. Called on the flushing goroutine with
	// no lock held; it must not call the Flusher.
	Observe func(key string, found bool, gen limit.Generation, durable limit.Usage)
}

// Flusher writes the usage meters of a limit.MeteredStore to a durable Store.
//
// The gateway calls Track with the key of every meter it charged; Run then
// flushes those keys every interval: it reads each meter (ReadMeter), raises
// the durable totals to the live snapshot (Store.Put, batched) and records the
// snapshot as flushed (MarkFlushed). Because Put never lowers a total, a flush
// that is retried, duplicated or raced by another instance's never counts
// twice. Run also sweeps (ScanMeters): it writes every meter the limit store
// holds unflushed, whichever instance charged it, so usage charged by an
// instance that died before its flush still lands.
//
// When the durable store (or the limit store) fails, the keys stay tracked,
// the totals stay in the live counters, and Run retries with a backoff;
// callers are never blocked. Usage is lost only with the live counter itself
// (a memory store that stops before a flush succeeds, Redis losing data).
//
// A Flusher is safe for concurrent use.
type Flusher struct {
	meters     limit.MeteredStore
	store      Store
	interval   time.Duration
	sweepEvery int
	timeout    time.Duration
	maxBackoff time.Duration
	log        *slog.Logger
	now        func() time.Time
	onFailure  func(op string)
	observe    func(key string, found bool, gen limit.Generation, durable limit.Usage)

	seed   maphash.Seed
	shards [trackShards]trackShard

	mu       sync.Mutex
	failures int       // consecutive failed flushes or sweeps
	retryAt  time.Time // Run attempts nothing before (real clock)
	lastOK   time.Time // the last flush or sweep that succeeded (real clock)

	seedMu  sync.Mutex
	seeding map[seedKey]*seedCall
}

// trackShards spreads Track's lock: every admitted call takes one.
const trackShards = 32

// trackShard is a set of keys under its own lock, padded to a cache line so
// that neighbouring locks do not share one.
type trackShard struct {
	mu   sync.Mutex
	keys map[string]struct{}
	_    [48]byte
}

// NewFlusher returns a Flusher of meters into store. opts may be nil. It
// panics if meters or store is nil.
func NewFlusher(meters limit.MeteredStore, store Store, opts *FlusherOptions) *Flusher {
	if meters == nil || store == nil {
		panic("usage: NewFlusher with a nil limit store or usage store")
	}
	var o FlusherOptions
	if opts != nil {
		o = *opts
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.SweepEvery <= 0 {
		o.SweepEvery = DefaultSweepEvery
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	f := &Flusher{
		meters:     meters,
		store:      store,
		interval:   o.Interval,
		sweepEvery: o.SweepEvery,
		timeout:    o.Timeout,
		maxBackoff: max(o.MaxBackoff, o.Interval),
		log:        o.Logger,
		now:        o.Now,
		onFailure:  o.OnFailure,
		observe:    o.Observe,
		seed:       maphash.MakeSeed(),
		seeding:    make(map[seedKey]*seedCall),
	}
	for i := range f.shards {
		f.shards[i].keys = make(map[string]struct{})
	}
	return f
}

// Track marks the meter key as charged by this instance: the next flush
// writes it. It does no I/O and, when key is already tracked, allocates
// nothing, so it belongs on the request path after every charge or
// adjustment of a meter.
func (f *Flusher) Track(key string) {
	sh := &f.shards[maphash.String(f.seed, key)%trackShards]
	sh.mu.Lock()
	if _, ok := sh.keys[key]; !ok {
		sh.keys[key] = struct{}{}
	}
	sh.mu.Unlock()
}

// Pending returns how many meter keys are tracked and not yet flushed.
func (f *Flusher) Pending() int {
	n := 0
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.Lock()
		n += len(sh.keys)
		sh.mu.Unlock()
	}
	return n
}

// drain takes every tracked key out of the set. A key tracked again from now
// on is flushed by the next flush, so no charge made after its meter is read
// can be missed.
func (f *Flusher) drain() []string {
	var keys []string
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.Lock()
		for k := range sh.keys {
			keys = append(keys, k)
		}
		// clear keeps the buckets: tracking the same tenants again next
		// interval allocates nothing.
		clear(sh.keys)
		sh.mu.Unlock()
	}
	return keys
}

// Flush writes the tracked meters now, whatever the backoff: it reads each
// (ReadMeter), raises the durable totals to the snapshots (Store.Put, in
// batches of BatchSize) and records them as flushed (MarkFlushed). Meters
// already flushed, and keys the limit store no longer holds, are dropped.
// Keys whose read, Put or MarkFlushed failed stay tracked for the next flush;
// the error joins those failures. ctx bounds the I/O.
func (f *Flusher) Flush(ctx context.Context) error {
	keys := f.drain()
	if len(keys) == 0 {
		return nil
	}
	states := make([]limit.MeterState, len(keys))
	found := make([]bool, len(keys))
	errs := make([]error, len(keys))
	fanout.Do(len(keys), workers, func(i int) {
		states[i], found[i], errs[i] = f.meters.ReadMeter(ctx, keys[i])
	})
	var (
		dirty   []limit.MeterState
		readErr error
	)
	for i, key := range keys {
		switch {
		case errs[i] != nil:
			f.Track(key)
			if readErr == nil {
				readErr = fmt.Errorf("usage: read meter %q: %w", key, errs[i])
			}
		case !found[i]:
			f.tell(key, false, limit.MeterState{}, limit.Usage{})
		default:
			if !states[i].Flushed.Covers(states[i].Live) {
				dirty = append(dirty, states[i])
			}
			f.tell(key, true, states[i], states[i].Flushed)
		}
	}
	err := errors.Join(readErr, f.write(ctx, dirty))
	f.note("flush", err)
	return err
}

// Sweep writes every meter the limit store holds unflushed (ScanMeters),
// whichever instance charged it: the backstop for the usage of instances that
// died before flushing. Meters whose write fails become tracked by this
// Flusher, so its next flush retries them. ctx bounds the I/O.
func (f *Flusher) Sweep(ctx context.Context) error {
	// Collected first and written after the scan: a store may call fn with
	// a lock held, and writing marks meters through the same store.
	var dirty []limit.MeterState
	scanErr := f.meters.ScanMeters(ctx, func(st limit.MeterState) error {
		if !st.Flushed.Covers(st.Live) {
			dirty = append(dirty, st)
		}
		return nil
	})
	if scanErr != nil {
		scanErr = fmt.Errorf("usage: scan meters: %w", scanErr)
	}
	// What the scan found before failing is written all the same.
	err := errors.Join(scanErr, f.write(ctx, dirty))
	f.note("sweep", err)
	return err
}

// write puts the snapshots in batches and marks each written one flushed.
// Every meter not known to be flushed when it returns is tracked again, but
// for meters no store could take (see Record.Validate) or the store refused
// (see putBatch): those are logged and left to the limit store, so that one
// bad meter does not hold back the rest, nor the sweeps that Run makes only
// after a flush that worked.
func (f *Flusher) write(ctx context.Context, states []limit.MeterState) error {
	now := f.now()
	recs := make([]Record, 0, len(states))
	valid := states[:0:0]
	for _, st := range states {
		r := Record{Tenant: st.Tenant, Period: st.Period, Usage: st.Live, UpdatedAt: now}
		if err := r.Validate(); err != nil {
			f.log.Error("usage: a meter cannot be stored; its usage stays in the limit store", "key", st.Key, "err", err)
			continue
		}
		recs = append(recs, r)
		valid = append(valid, st)
	}
	var (
		markErr     error
		marksFailed int
	)
	for start := 0; start < len(recs); start += BatchSize {
		end := min(start+BatchSize, len(recs))
		batch, err := f.putBatch(ctx, recs[start:end], valid[start:end])
		if err != nil {
			// The store is most likely down: the remaining batches
			// would fail the same way, so they wait for the retry too.
			for _, st := range valid[start:] {
				f.Track(st.Key)
			}
			return errors.Join(markErr, fmt.Errorf("usage: write %d meters: %w", len(recs)-start, err))
		}
		markErrs := make([]error, len(batch))
		fanout.Do(len(batch), workers, func(i int) {
			markErrs[i] = f.meters.MarkFlushed(ctx, batch[i].Key, batch[i].Gen.ID, batch[i].Live)
		})
		for i, err := range markErrs {
			st := batch[i]
			switch {
			case err == nil:
				f.tell(st.Key, true, st, st.Live)
			case errors.Is(err, limit.ErrMeterMissing):
				// The store lost the meter (or it expired) after it was
				// read. The durable store holds the snapshot, but a meter
				// re-created from a durable total read before this Put
				// committed does not: told not found, the engine places
				// again what it charged in the lost one, as replays that
				// a seed holding them finds counted.
				f.log.Info("usage: meter gone from the limit store while flushed", "key", st.Key)
				f.tell(st.Key, false, limit.MeterState{}, limit.Usage{})
			case errors.Is(err, limit.ErrMeterReplaced):
				// The store lost the meter after it was read and another
				// instance created it anew, from a durable total that
				// may predate this snapshot. Nothing is told: the next
				// flush reads the new generation, and the engine then
				// places again what it charged in the lost one.
				f.log.Info("usage: meter replaced by a new generation while flushed; read again at the next flush", "key", st.Key)
				f.Track(st.Key)
			default:
				// The durable store holds the snapshot and writing it
				// again is harmless: tracked again, the meter gets its
				// mark (and the engine its report) at the next flush
				// instead of at every sweep.
				f.Track(st.Key)
				marksFailed++
				if markErr == nil {
					markErr = fmt.Errorf("usage: mark meter %q flushed: %w", st.Key, err)
				}
			}
		}
	}
	if marksFailed > 1 {
		markErr = fmt.Errorf("%w (and %d more meters)", markErr, marksFailed-1)
	}
	return markErr
}

// putBatch puts recs, the records of states, and returns the states
// written. When the store refuses a record itself (ErrInvalidRecord for a
// record that passed Validate: a key it cannot hold), the records are put
// again one at a time, so that the ones it refuses are logged and left to
// the limit store, as Validate's are, and the rest land. Any other error is
// returned: nothing is then known to be written (a record written twice is
// harmless).
func (f *Flusher) putBatch(ctx context.Context, recs []Record, states []limit.MeterState) ([]limit.MeterState, error) {
	switch err := f.store.Put(ctx, recs); {
	case err == nil:
		return states, nil
	case !errors.Is(err, ErrInvalidRecord):
		return nil, err
	}
	written := states[:0:0]
	for i := range recs {
		err := f.store.Put(ctx, recs[i:i+1])
		switch {
		case err == nil:
			written = append(written, states[i])
		case errors.Is(err, ErrInvalidRecord):
			f.log.Error("usage: the usage store refuses a meter; its usage stays in the limit store", "key", states[i].Key, "err", err)
		default:
			return nil, err
		}
	}
	return written, nil
}

// tell passes what a flush learnt of a meter to FlusherOptions.Observe.
func (f *Flusher) tell(key string, found bool, st limit.MeterState, durable limit.Usage) {
	if f.observe != nil {
		f.observe(key, found, st.Gen, durable)
	}
}

// note records the outcome of a flush or sweep for Run's backoff, logging the
// start and the end of a run of failures.
func (f *Flusher) note(op string, err error) {
	if err != nil && f.onFailure != nil {
		f.onFailure(op)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		if f.failures > 0 {
			f.log.Info("usage: flushing works again", "op", op, "after_failures", f.failures)
		}
		f.failures = 0
		f.retryAt = time.Time{}
		f.lastOK = time.Now()
		return
	}
	f.failures++
	wait := f.maxBackoff
	if f.failures < 30 {
		wait = min(f.interval<<(f.failures-1), f.maxBackoff)
	}
	f.retryAt = time.Now().Add(wait)
	f.log.Warn("usage: flush failed; usage stays in the live counters and is retried",
		"op", op, "err", err, "consecutive_failures", f.failures, "retry_in", wait, "pending", f.Pending())
}

// Health is the state of the durable writes: how many flushes or sweeps
// failed in a row (0: the last one worked), and when one last succeeded
// (zero before the first).
type Health struct {
	ConsecutiveFailures int
	LastSuccess         time.Time
}

// Health reports the state of the durable writes, for readiness pages and
// gauges. It is safe for concurrent use.
func (f *Flusher) Health() Health {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Health{ConsecutiveFailures: f.failures, LastSuccess: f.lastOK}
}

// backingOff reports whether Run should skip this tick.
func (f *Flusher) backingOff() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return time.Now().Before(f.retryAt)
}

// Run flushes the tracked meters every interval and sweeps once at the start
// and every SweepEvery intervals, backing off after failures, until ctx ends.
// It then makes a final flush, bounded by the Timeout option rather than by
// ctx, and returns its error: nil means every tracked meter was written.
// Failures before that are logged, never returned.
func (f *Flusher) Run(ctx context.Context) error {
	f.tick(ctx, true)
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.timeout)
			defer cancel()
			pending := f.Pending()
			err := f.Flush(fctx)
			if err != nil {
				f.log.Error("usage: final flush failed; the usage stays in the live counters",
					"err", err, "pending", f.Pending())
			} else {
				f.log.Info("usage: final flush done", "meters", pending)
			}
			return err
		case <-t.C:
		}
		if f.backingOff() {
			continue
		}
		f.tick(ctx, n%f.sweepEvery == 0)
	}
}

// tick is one round of Run: a flush, then a sweep when due. Errors are logged
// by note.
func (f *Flusher) tick(ctx context.Context, sweep bool) {
	tctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	if f.Flush(tctx) == nil && sweep {
		_ = f.Sweep(tctx)
	}
}

// seedKey names a (tenant, period) being seeded.
type seedKey struct{ tenant, period string }

// seedCall is one Get in flight, shared by every Seed of the same key.
type seedCall struct {
	done chan struct{}
	u    limit.Usage
	err  error
}

// Seed returns the durable total of tenant in period, the value a live meter
// missing from the limit store is re-created from (limit.Meter.Seed); zero
// when the store holds nothing for it. Concurrent calls for the same tenant
// and period share one read, so a limit store that lost its data does not
// send every instance's every call to the durable store at once.
//
// Results are not cached beyond that: the durable total grows with every
// flush, and a meter seeded with a stale (lower) total would lose usage,
// because the durable store ignores snapshots it already covers. For the
// same reason a caller must not seed with a guess (zero) when Seed fails
// (the durable store is down: the error wraps ErrUnavailable); what to do
// with such a call is the caller's failure policy.
func (f *Flusher) Seed(ctx context.Context, tenant, period string) (limit.Usage, error) {
	k := seedKey{tenant, period}
	f.seedMu.Lock()
	if c, ok := f.seeding[k]; ok {
		f.seedMu.Unlock()
		select {
		case <-c.done:
		case <-ctx.Done():
			return limit.Usage{}, ctx.Err()
		}
		// A read cut short by its caller's context says nothing about
		// this caller's: read again.
		if c.err == nil || ctx.Err() != nil || !(errors.Is(c.err, context.Canceled) || errors.Is(c.err, context.DeadlineExceeded)) {
			return c.u, c.err
		}
		return f.get(ctx, tenant, period)
	}
	c := &seedCall{done: make(chan struct{})}
	f.seeding[k] = c
	f.seedMu.Unlock()

	c.u, c.err = f.get(ctx, tenant, period)

	f.seedMu.Lock()
	delete(f.seeding, k)
	f.seedMu.Unlock()
	close(c.done)
	return c.u, c.err
}

func (f *Flusher) get(ctx context.Context, tenant, period string) (limit.Usage, error) {
	rec, ok, err := f.store.Get(ctx, tenant, period)
	if err != nil {
		return limit.Usage{}, fmt.Errorf("usage: seed %q %s: %w", tenant, period, err)
	}
	if !ok {
		return limit.Usage{}, nil
	}
	return rec.Usage, nil
}
