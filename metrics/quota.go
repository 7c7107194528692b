package metrics

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of NewQuotaUsage, used by New.
const (
	// DefaultQuotaThreshold is the fraction of its quota a tenant must have
	// used to be exported.
	DefaultQuotaThreshold = 0.8
	// DefaultQuotaMaxTenants is the most tenants exported at once.
	DefaultQuotaMaxTenants = 100
)

// ErrQuotaOptions means NewQuotaUsage was given a threshold outside (0, 1]
// or a maximum below 1.
var ErrQuotaOptions = errors.New("metrics: quota usage needs 0 < threshold <= 1 and max >= 1")

// QuotaUsage exports the monthly usage of the tenants nearest their quota,
// as mcpgate_tenant_quota_used and mcpgate_tenant_quota{tenant} (cost
// units), so that an alert can fire before a tenant's calls start being
// denied.
//
// Cardinality is bounded twice: only tenants that have used at least the
// threshold of their quota are exported (a tenant without quota never is),
// and at most max of them, keeping the highest ratios: a tenant above the
// threshold finding the set full replaces the lowest one if its ratio is
// higher, and is left out otherwise; every tenant left out or replaced
// counts in mcpgate_tenant_quota_overflow_total, the sign that max is too
// small. So each instance exports at most 2·max series, whatever the number
// of tenants.
//
// Values are what this instance last saw on a tenant's meter (the shared
// meter, so all instances agree up to the calls since): aggregate with max
// by (tenant). An entry is dropped when its period ends, and when the
// tenant is seen below the threshold again (a new period, a refund) or
// without a quota (a reload removed it).
//
// The zero value is not usable; a QuotaUsage is safe for concurrent use.
type QuotaUsage struct {
	threshold float64
	max       int
	now       func() time.Time

	used, quota, overflow *prometheus.Desc

	mu        sync.RWMutex
	tenants   map[string]quotaEntry
	overflows uint64
	size      atomic.Int64 // len(tenants), read without mu
}

type quotaEntry struct {
	used, quota int64
	end         time.Time // end of the period the values belong to
}

func (e quotaEntry) ratio() float64 { return float64(e.used) / float64(e.quota) }

// NewQuotaUsage returns a QuotaUsage exporting tenants at or above
// threshold of their quota, at most max of them. now is the clock that
// expires entries (nil: time.Now).
func NewQuotaUsage(threshold float64, max int, now func() time.Time) (*QuotaUsage, error) {
	if !(threshold > 0 && threshold <= 1) || max < 1 {
		return nil, ErrQuotaOptions
	}
	if now == nil {
		now = time.Now
	}
	return &QuotaUsage{
		threshold: threshold, max: max, now: now,
		used: prometheus.NewDesc("mcpgate_tenant_quota_used",
			"Net cost units used this period by a tenant near its quota (only tenants above the export threshold, at most a fixed number).",
			[]string{"tenant"}, nil),
		quota: prometheus.NewDesc("mcpgate_tenant_quota",
			"Monthly quota in cost units of a tenant exported in mcpgate_tenant_quota_used.",
			[]string{"tenant"}, nil),
		overflow: prometheus.NewDesc("mcpgate_tenant_quota_overflow_total",
			"Tenants above the quota export threshold left out (or replaced by a tenant nearer its quota) because the exported set was full.",
			nil, nil),
		tenants: make(map[string]quotaEntry),
	}, nil
}

// Observe records that tenant has used used of its quota in the period
// ending at periodEnd. A quota of 0 or less (none) is Forget.
func (q *QuotaUsage) Observe(tenant string, used, quota int64, periodEnd time.Time) {
	if quota <= 0 {
		q.Forget(tenant)
		return
	}
	e := quotaEntry{used: used, quota: quota, end: periodEnd}
	q.mu.Lock()
	defer q.unlock()
	if e.ratio() < q.threshold {
		if old, ok := q.tenants[tenant]; ok && !periodEnd.Before(old.end) {
			delete(q.tenants, tenant)
		}
		return
	}
	if old, ok := q.tenants[tenant]; ok {
		if !periodEnd.Before(old.end) { // a late answer of the last period changes nothing
			q.tenants[tenant] = e
		}
		return
	}
	if len(q.tenants) >= q.max {
		q.expireLocked()
	}
	if len(q.tenants) >= q.max {
		q.overflows++
		low, lowRatio := "", e.ratio()
		for t, o := range q.tenants {
			if r := o.ratio(); r < lowRatio {
				low, lowRatio = t, r
			}
		}
		if low == "" {
			return
		}
		delete(q.tenants, low)
	}
	q.tenants[tenant] = e
}

// Forget stops exporting tenant: it has no quota any more (a reload
// removed it, or its tier has none). It takes no lock while nothing is
// exported, so calling it for every call of a tenant without quota is cheap.
func (q *QuotaUsage) Forget(tenant string) {
	if q.size.Load() == 0 {
		return
	}
	// Tenants without quota call this on every metered call: only a
	// shared lock unless the tenant is exported.
	q.mu.RLock()
	_, ok := q.tenants[tenant]
	q.mu.RUnlock()
	if !ok {
		return
	}
	q.mu.Lock()
	defer q.unlock()
	delete(q.tenants, tenant)
}

// unlock publishes the number of entries and releases mu.
func (q *QuotaUsage) unlock() {
	q.size.Store(int64(len(q.tenants)))
	q.mu.Unlock()
}

// expireLocked drops the entries of periods that have ended.
func (q *QuotaUsage) expireLocked() {
	now := q.now()
	for t, e := range q.tenants {
		if !now.Before(e.end) {
			delete(q.tenants, t)
		}
	}
}

// Describe implements prometheus.Collector.
func (q *QuotaUsage) Describe(ch chan<- *prometheus.Desc) {
	ch <- q.used
	ch <- q.quota
	ch <- q.overflow
}

// Collect implements prometheus.Collector.
func (q *QuotaUsage) Collect(ch chan<- prometheus.Metric) {
	q.mu.Lock()
	q.expireLocked()
	entries := make(map[string]quotaEntry, len(q.tenants))
	for t, e := range q.tenants {
		entries[t] = e
	}
	overflows := q.overflows
	q.unlock()
	for t, e := range entries {
		ch <- prometheus.MustNewConstMetric(q.used, prometheus.GaugeValue, float64(e.used), t)
		ch <- prometheus.MustNewConstMetric(q.quota, prometheus.GaugeValue, float64(e.quota), t)
	}
	ch <- prometheus.MustNewConstMetric(q.overflow, prometheus.CounterValue, float64(overflows))
}
