package metrics

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeNow is a settable clock for entry expiry.
type fakeNow struct{ t time.Time }

func (c *fakeNow) now() time.Time { return c.t }

func exported(t *testing.T, q *QuotaUsage) string {
	t.Helper()
	r := prometheus.NewPedanticRegistry()
	r.MustRegister(q)
	mfs, err := r.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			b.WriteString(mf.GetName())
			for _, l := range m.GetLabel() {
				b.WriteString(" " + l.GetName() + "=" + l.GetValue())
			}
			switch {
			case m.GetGauge() != nil:
				b.WriteString(" " + trimFloat(m.GetGauge().GetValue()))
			case m.GetCounter() != nil:
				b.WriteString(" " + trimFloat(m.GetCounter().GetValue()))
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

func trimFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func TestQuotaUsageExportsOnlyTenantsNearTheirQuota(t *testing.T) {
	clock := &fakeNow{t: time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC)}
	end := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	q, err := NewQuotaUsage(0.8, 2, clock.now)
	if err != nil {
		t.Fatal(err)
	}
	q.Observe("none", 5000, 0, end)  // no quota: never exported
	q.Observe("low", 79, 100, end)   // below the threshold
	q.Observe("acme", 80, 100, end)  // at it
	q.Observe("beta", 95, 100, end)  // above it
	q.Observe("gamma", 81, 100, end) // set full; 0.81 > acme's 0.80: replaces acme
	q.Observe("delta", 80, 100, end) // set full; 0.80 < gamma's 0.81: left out
	want := `mcpgate_tenant_quota tenant=beta 100
mcpgate_tenant_quota tenant=gamma 100
mcpgate_tenant_quota_overflow_total 2
mcpgate_tenant_quota_used tenant=beta 95
mcpgate_tenant_quota_used tenant=gamma 81
`
	if got := exported(t, q); got != want {
		t.Fatalf("exported:\n%s\nwant:\n%s", got, want)
	}

	// A late answer of an earlier period changes nothing; a refund below
	// the threshold removes the tenant.
	q.Observe("beta", 10, 100, end.AddDate(0, -1, 0))
	q.Observe("gamma", 50, 100, end)
	want = `mcpgate_tenant_quota tenant=beta 100
mcpgate_tenant_quota_overflow_total 2
mcpgate_tenant_quota_used tenant=beta 95
`
	if got := exported(t, q); got != want {
		t.Fatalf("after refund:\n%s\nwant:\n%s", got, want)
	}

	// A quota removed (a reload, another tier) takes the tenant out.
	q.Observe("beta", 95, 0, end)
	want = "mcpgate_tenant_quota_overflow_total 2\n"
	if got := exported(t, q); got != want {
		t.Fatalf("after beta's quota was removed:\n%s\nwant:\n%s", got, want)
	}

	// The period ends: its entries go, whether or not the tenant is seen again.
	clock.t = end
	if got := exported(t, q); got != "mcpgate_tenant_quota_overflow_total 2\n" {
		t.Fatalf("after the period ended:\n%s", got)
	}
}

func TestNewQuotaUsageValidates(t *testing.T) {
	for _, c := range []struct {
		threshold float64
		max       int
	}{{0, 1}, {1.5, 1}, {0.8, 0}} {
		if _, err := NewQuotaUsage(c.threshold, c.max, nil); !errors.Is(err, ErrQuotaOptions) {
			t.Errorf("NewQuotaUsage(%v, %d) = %v, want ErrQuotaOptions", c.threshold, c.max, err)
		}
	}
}

// New exports the alerted counters at zero before anything happened, so
// that increase() sees their first increment.
func TestNewPresetsAlertedCounters(t *testing.T) {
	m := New()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]int{}
	for _, mf := range mfs {
		series[mf.GetName()] = len(mf.GetMetric())
	}
	for name, want := range map[string]int{
		"mcpgate_breakers_opened_total":      4,
		"mcpgate_degraded_decisions_total":   3,
		"mcpgate_usage_flush_failures_total": 2,
	} {
		if got := series[name]; got != want {
			t.Errorf("%s: %d series, want %d", name, got, want)
		}
	}
}
