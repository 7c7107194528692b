package enforce_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/usage"
)

// One tenant whose meter reaches limit.MaxUsage (a tool whose results
// report the largest cost the engine accepts, 2^40 units, 1024 times)
// has every later call refused: its meter can count no more. That is the
// meter's state, not the store's health: the store breaker must stay
// closed, and another tenant's calls be decided by the store (they used
// to be counted as store failures: three of them opened the breaker, and
// every tenant's calls were then decided by on_error, unmetered and
// unlimited under on_error: open).
func TestOneTenantsMeterOverflowIsNoStoreOutage(t *testing.T) {
	us := openSQLite(t)
	e := newEngine(t, `upstream: {url: "http://127.0.0.1:1/mcp"}
store: {timeout: 1s, on_error: open}
usage: {flush_interval: 1h}
tiers:
  free: {}
tools:
  llm: {cost: {estimate: 1, from_result: "_meta.tokens"}}
`, enforce.Options{Usage: us, Shared: newSwappable(t), Probe: func(context.Context) error { return nil }})
	ctx := context.Background()
	big := enforce.Call{Tenant: "big", Subject: "a", Name: "llm"}
	full := false
	for range 1030 {
		tk, d := e.Admit(ctx, big)
		tk.Done(ctx, enforce.Outcome{Cost: 1 << 40})
		if !d.Allowed || d.Degraded != "" {
			full = true
			break
		}
	}
	if !full {
		t.Fatalf("the meter never reached limit.MaxUsage (%d)", int64(limit.MaxUsage))
	}
	// The overflowing tenant keeps calling: refused, not admitted by on_error.
	for i := range 3 {
		tk, d := e.Admit(ctx, big)
		tk.Done(ctx, enforce.Outcome{})
		if d.Allowed || !d.Unavailable || d.Degraded != "" {
			t.Errorf("overflowing tenant's call %d: %+v, want refused as unavailable, no failure policy", i, d)
		}
	}
	other := enforce.Call{Tenant: "other", Subject: "b", Name: "llm"}
	tk, d := e.Admit(ctx, other)
	tk.Done(ctx, enforce.Outcome{})
	if !d.Allowed || d.Degraded != "" || !e.StoreAvailable() {
		t.Errorf("another tenant's call: %+v, store available %v; want admitted by the store: one tenant's meter overflow opened the store breaker for everyone",
			d, e.StoreAvailable())
	}
}

// A cost correction the meter cannot take (it would pass limit.MaxUsage)
// is dropped: Done must return what the call was charged in the end (the
// estimate), and the dropped usage be counted in
// mcpgate_unmetered_calls_total as its one call, as the log says.
func TestDroppedCorrectionIsNotCharged(t *testing.T) {
	sq := openSQLite(t)
	m := metrics.New()
	e := newEngine(t, `upstream: {url: "http://127.0.0.1:1/mcp"}
usage: {flush_interval: 1h}
tools:
  llm: {cost: {estimate: 1, from_result: "_meta.tokens"}}
`, enforce.Options{Usage: sq, Metrics: m})
	ctx := context.Background()
	for range 1023 {
		mustAdmit(t, e, acmeCall).Done(ctx, enforce.Outcome{Cost: 1 << 40})
	}
	mustAdmit(t, e, acmeCall).Done(ctx, enforce.Outcome{Cost: 1<<40 - 2}) // meter at MaxUsage-2
	tk := mustAdmit(t, e, acmeCall)                                       // MaxUsage-1
	appliedBefore := testutil.ToFloat64(m.CostCorrections.WithLabelValues("applied"))
	charged := tk.Done(ctx, enforce.Outcome{Cost: 5}) // +4 would pass MaxUsage
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	rec, _, err := sq.Get(ctx, "acme", usage.Period(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Used() != limit.MaxUsage-1 {
		t.Fatalf("durable %d, want MaxUsage-1 (the correction dropped)", rec.Used())
	}
	if charged != 1 {
		t.Errorf("Done returned %d charged; the usage store holds the estimate (1) for it, the correction having been dropped", charged)
	}
	if lost := testutil.ToFloat64(m.Unmetered); lost != 1 {
		t.Errorf("unmetered calls = %v, want 1: the dropped correction counts as its call", lost)
	}
	applied := testutil.ToFloat64(m.CostCorrections.WithLabelValues("applied")) - appliedBefore
	if dropped := testutil.ToFloat64(m.CostCorrections.WithLabelValues("dropped")); applied != 0 || dropped != 1 {
		t.Errorf("the last correction: applied %v, dropped %v; want 0 and 1", applied, dropped)
	}
}
