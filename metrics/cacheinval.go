package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// InvalidationCounts are a result cache's counters of invalidations that
// did not reach its store when asked (cache.Stats): Failed were remembered
// for replay, Replayed were replayed by the store's probe, Lost were over
// the cache's bound and not remembered, Pending wait for their replay now.
type InvalidationCounts struct {
	Failed, Replayed, Lost, Pending int64
}

// CacheInvalidations exports the invalidation counters of the result
// caches added to it, summed, as mcpgate_cache_invalidations_total{outcome}
// (failed, replayed, lost) and mcpgate_cache_invalidations_pending. A lost
// invalidation means a cached result the tool's mutation made stale may be
// served until its TTL ends: alert on it.
//
// The counters are read at scrape time, so the cache keeps a single source
// of truth; a source removed takes its counts with it (a counter reset to
// Prometheus). The zero value is not usable; a CacheInvalidations is safe
// for concurrent use.
type CacheInvalidations struct {
	total, pending *prometheus.Desc

	mu      sync.Mutex
	next    int
	sources map[int]func() InvalidationCounts
}

func newCacheInvalidations() *CacheInvalidations {
	return &CacheInvalidations{
		total: prometheus.NewDesc("mcpgate_cache_invalidations_total",
			"Cache invalidations that did not reach the cache store when asked, by outcome: failed (remembered and replayed when the store answers again), replayed, lost (not remembered: a stale result may be served until its TTL).",
			[]string{"outcome"}, nil),
		pending: prometheus.NewDesc("mcpgate_cache_invalidations_pending",
			"Failed cache invalidations waiting for the cache store to answer again.", nil, nil),
		sources: make(map[int]func() InvalidationCounts),
	}
}

// Add makes the counters that read returns part of the export until the
// returned remove is called (any number of times).
func (c *CacheInvalidations) Add(read func() InvalidationCounts) (remove func()) {
	c.mu.Lock()
	id := c.next
	c.next++
	c.sources[id] = read
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.sources, id)
		c.mu.Unlock()
	}
}

// Describe implements prometheus.Collector.
func (c *CacheInvalidations) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.total
	ch <- c.pending
}

// Collect implements prometheus.Collector. Every series is exported, at 0
// without a source, so that rules reading them always find them.
func (c *CacheInvalidations) Collect(ch chan<- prometheus.Metric) {
	var sum InvalidationCounts
	c.mu.Lock()
	for _, read := range c.sources {
		n := read()
		sum.Failed += n.Failed
		sum.Replayed += n.Replayed
		sum.Lost += n.Lost
		sum.Pending += n.Pending
	}
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.total, prometheus.CounterValue, float64(sum.Failed), "failed")
	ch <- prometheus.MustNewConstMetric(c.total, prometheus.CounterValue, float64(sum.Replayed), "replayed")
	ch <- prometheus.MustNewConstMetric(c.total, prometheus.CounterValue, float64(sum.Lost), "lost")
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(sum.Pending))
}
