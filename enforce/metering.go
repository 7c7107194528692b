package enforce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

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
type meterer struct {
	store   limit.MeteredStore // where meters live: the shared store, or the in-process one
	durable usage.Store
	flusher *usage.Flusher
	log     *slog.Logger
	stats   *metrics.Metrics
	every   time.Duration

	mu      sync.Mutex
	pending map[string]*pendingUsage
}

// pendingUsage is usage admitted but not yet on its meter.
type pendingUsage struct {
	meter limit.Meter
	delta limit.Usage
}

func newMeterer(store limit.MeteredStore, us usage.Store, every time.Duration, log *slog.Logger, stats *metrics.Metrics) *meterer {
	return &meterer{
		store:   store,
		durable: us,
		flusher: usage.NewFlusher(store, us, &usage.FlusherOptions{Interval: every, Logger: log,
			OnFailure: func(op string) { stats.UsageFlushFailures.WithLabelValues(op).Inc() }}),
		log:     log,
		stats:   stats,
		every:   every,
		pending: make(map[string]*pendingUsage),
	}
}

// run flushes meters and places pending usage until ctx ends, then flushes
// a last time.
func (m *meterer) run(ctx context.Context) {
	// The flusher stops (and makes its final flush) only after the last
	// placement of pending usage: a meter placed after the final flush
	// had drained the tracked keys would miss it.
	fctx, stopFlusher := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFlusher()
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := m.flusher.Run(fctx); err != nil {
			m.log.Error("final usage flush failed: the live counters keep the totals", "err", err)
		}
	})
	t := time.NewTicker(m.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			// One last try, bounded, so that a clean shutdown places what it can.
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			m.placePending(pctx)
			cancel()
			stopFlusher()
			wg.Wait()
			if n := m.pendingCount(); n > 0 {
				m.log.Error("usage could not be recorded before shutdown", "meters", n)
			}
			return
		case <-t.C:
			m.placePending(ctx)
		}
	}
}

// meterFor is the meter of tenant for the period containing now.
func meterFor(tenant string, quota int64, now time.Time) *limit.Meter {
	period := usage.Period(now)
	end, _ := usage.PeriodEnd(period)
	return &limit.Meter{
		Key: keyspace.Usage(tenant, period), Tenant: tenant, Period: period,
		Quota: quota, ExpireAt: end.Add(DefaultMeterGrace),
	}
}

// seedTimeout bounds the read of the durable total that re-creates a missing
// meter. The read is on the request path (the first call of a tenant in a
// period, every call after Redis lost its data), and a usage store that hangs
// (a network partition, a locked SQLite file) must not hold calls: past the
// deadline the call is decided without its meter, and its usage waits in
// process until the meter can be rebuilt.
const seedTimeout = 500 * time.Millisecond

// seed fills meter.Seed with the durable total of its period.
func (m *meterer) seed(ctx context.Context, meter *limit.Meter) error {
	ctx, cancel := context.WithTimeout(ctx, seedTimeout)
	defer cancel()
	u, err := m.flusher.Seed(ctx, meter.Tenant, meter.Period)
	if err != nil {
		return err
	}
	meter.Seed, meter.Seeded = u, true
	return nil
}

// charged records that the store charged meter (the flusher writes it).
func (m *meterer) charged(meter *limit.Meter) { m.flusher.Track(meter.Key) }

// adjust adds delta to meter, keeping it pending when it cannot be placed.
func (m *meterer) adjust(ctx context.Context, meter limit.Meter, delta limit.Usage) {
	if maybe, err := m.tryAdjust(ctx, meter, delta); err != nil {
		m.failed(meter, delta, maybe, err)
	}
}

// tryAdjust places delta on meter, seeding the meter when the store lost it.
// On failure, maybe reports whether the write may have landed all the same
// (see chargeMayHaveApplied).
func (m *meterer) tryAdjust(ctx context.Context, meter limit.Meter, delta limit.Usage) (maybe bool, err error) {
	r, err := m.store.Adjust(ctx, meter, delta)
	if err == nil && r.NeedSeed {
		if err := m.seed(ctx, &meter); err != nil {
			return false, err
		}
		r, err = m.store.Adjust(ctx, meter, delta)
		if err == nil && r.NeedSeed {
			return false, errors.New("meter still missing after seeding")
		}
	}
	if err != nil {
		maybe = chargeMayHaveApplied(err)
		if maybe {
			m.flusher.Track(meter.Key) // flushed if it did land
		}
		return maybe, err
	}
	m.flusher.Track(meter.Key)
	return false, nil
}

// failed handles usage that could not be placed: kept pending for another
// try, unless the failed write may have landed, in which case another try
// could count it twice: it is dropped and logged, as a timed-out script is
// never replayed.
func (m *meterer) failed(meter limit.Meter, delta limit.Usage, maybe bool, err error) {
	if !maybe {
		m.addPending(meter, delta, err)
		return
	}
	// The calls it admitted may have no record (a refund's delta admits none).
	m.stats.Unmetered.Add(float64(delta.Calls))
	m.log.Error("a usage write got no answer and may have landed: it is not written again (it could count twice)",
		"tenant", meter.Tenant, "period", meter.Period, "delta", fmt.Sprintf("%+v", delta), "err", err)
}

// addPending keeps usage that could not reach its meter. It lives in this
// process only until placed: a crash before then loses it (see docs).
func (m *meterer) addPending(meter limit.Meter, delta limit.Usage, cause error) {
	m.mu.Lock()
	p, ok := m.pending[meter.Key]
	if !ok {
		p = &pendingUsage{meter: meter}
		m.pending[meter.Key] = p
	}
	p.delta = limit.Usage{
		Charged: p.delta.Charged + delta.Charged, Refunded: p.delta.Refunded + delta.Refunded,
		Calls: p.delta.Calls + delta.Calls, RefundedCalls: p.delta.RefundedCalls + delta.RefundedCalls,
	}
	n := len(m.pending)
	m.mu.Unlock()
	m.stats.UsagePending.Set(float64(n))
	if !ok {
		m.log.Warn("usage kept in process until its meter can be reached", "tenant", meter.Tenant, "period", meter.Period, "err", cause)
	}
}

func (m *meterer) pendingCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pending)
}

// placePending moves pending usage onto its meters.
func (m *meterer) placePending(ctx context.Context) {
	m.mu.Lock()
	batch := make([]*pendingUsage, 0, len(m.pending))
	for k, p := range m.pending {
		batch = append(batch, p)
		delete(m.pending, k)
	}
	m.mu.Unlock()
	for _, p := range batch {
		if maybe, err := m.tryAdjust(ctx, p.meter, p.delta); err != nil {
			m.failed(p.meter, p.delta, maybe, err)
			continue
		}
		m.log.Info("pending usage recorded", "tenant", p.meter.Tenant, "period", p.meter.Period, "cost", p.delta.Used(), "calls", p.delta.NetCalls())
	}
	m.stats.UsagePending.Set(float64(m.pendingCount()))
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
// the next flush tick that reaches the store.
func (e *Engine) PendingUsage() int {
	if e.lim.meters == nil {
		return 0
	}
	return e.lim.meters.pendingCount()
}
