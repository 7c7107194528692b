package gateway

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
		flusher: usage.NewFlusher(store, us, &usage.FlusherOptions{Interval: every, Logger: log}),
		log:     log,
		stats:   stats,
		every:   every,
		pending: make(map[string]*pendingUsage),
	}
}

// run flushes meters and places pending usage until ctx ends, then flushes
// a last time.
func (m *meterer) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := m.flusher.Run(ctx); err != nil {
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
func (m *meterer) meterFor(tenant string, quota int64, now time.Time) *limit.Meter {
	period := usage.Period(now)
	end, _ := usage.PeriodEnd(period)
	return &limit.Meter{
		Key: keyspace.Usage(tenant, period), Tenant: tenant, Period: period,
		Quota: quota, ExpireAt: end.Add(DefaultMeterGrace),
	}
}

// seed fills meter.Seed with the durable total of its period.
func (m *meterer) seed(ctx context.Context, meter *limit.Meter) error {
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
	if err := m.tryAdjust(ctx, meter, delta); err != nil {
		m.addPending(meter, delta, err)
	}
}

func (m *meterer) tryAdjust(ctx context.Context, meter limit.Meter, delta limit.Usage) error {
	r, err := m.store.Adjust(ctx, meter, delta)
	if err == nil && r.NeedSeed {
		if err = m.seed(ctx, &meter); err == nil {
			r, err = m.store.Adjust(ctx, meter, delta)
			if err == nil && r.NeedSeed {
				err = errors.New("meter still missing after seeding")
			}
		}
	}
	if err != nil {
		return err
	}
	m.flusher.Track(meter.Key)
	return nil
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
		if err := m.tryAdjust(ctx, p.meter, p.delta); err != nil {
			m.addPending(p.meter, p.delta, err)
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
