// Package metrics holds mcpgate's Prometheus collectors. Every name starts
// with mcpgate_. One Metrics value is created per process and shared by the
// stages; all collectors are safe for concurrent use.
package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics is the set of collectors, registered on its own registry.
type Metrics struct {
	Registry *prometheus.Registry

	// Requests counts MCP requests by method class and outcome
	// (admitted, denied, unauthorized, forbidden, bad_request, unavailable,
	// upstream_error, cancelled: the client cancelled or hung up).
	Requests *prometheus.CounterVec
	// Denials counts 429s by scope and rule.
	Denials *prometheus.CounterVec
	// ShadowDenials counts shadow rules that would have denied, by rule.
	ShadowDenials *prometheus.CounterVec
	// Degraded counts decisions taken without the shared store, by failure policy.
	Degraded *prometheus.CounterVec
	// DenialCacheHits counts denials answered in-process from the denial cache.
	DenialCacheHits prometheus.Counter
	// DecisionSeconds is the latency of one limit-store call.
	DecisionSeconds prometheus.Histogram
	// UpstreamSeconds is the latency of upstream calls (until the answer is relayed).
	UpstreamSeconds prometheus.Histogram
	// StoreUp is 1 while the shared limit store answers, 0 while its breaker is open.
	StoreUp prometheus.Gauge
	// UsagePending is the number of meters with usage admitted but not yet
	// on the meter (the store or the usage store was down).
	UsagePending prometheus.Gauge
	// CostCorrections counts cost corrections from tool results, by outcome
	// (applied, unchanged, invalid, dropped: the meter could never take it,
	// see Unmetered).
	CostCorrections *prometheus.CounterVec
	// Unmetered counts admitted calls whose usage cannot be proved recorded
	// exactly once: a write left unanswered longer than the store remembers
	// its op (limit.OpTTL), placed again all the same, or a charge dropped
	// from a meter's full journal during a long usage-store outage (it could
	// not be placed again should the limit store then lose the meter). 0 in
	// normal operation.
	Unmetered prometheus.Counter
	// BreakersOpened counts loop breakers opening, by reason.
	BreakersOpened *prometheus.CounterVec
	// AlertsFailed counts breaker alerts that could not be delivered.
	AlertsFailed prometheus.Counter
	// CacheRequests counts cacheable calls by outcome (hit, miss, stale, coalesced, bypass).
	CacheRequests *prometheus.CounterVec
	// UpstreamSessions is the number of upstream MCP sessions this instance
	// tracks (renews while used, ends when idle).
	UpstreamSessions prometheus.Gauge
	// UpstreamState is 1 for each federated upstream's current health
	// state (up, open, half_open, down, limited) and 0 for the others.
	UpstreamState *prometheus.GaugeVec
	// UpstreamCalls counts the requests the federation sent (or refused)
	// to each upstream of upstreams:, by outcome (federate.Outcome).
	UpstreamCalls *prometheus.CounterVec
	// SessionsEnded counts upstream sessions the gateway ended itself (idle,
	// or without a slot), by sending the upstream a DELETE.
	SessionsEnded prometheus.Counter
	// NotificationsDropped counts the upstreams' notifications the
	// federation did not relay because their client was not taking them
	// (federate.MaxPending waiting), by method.
	NotificationsDropped *prometheus.CounterVec
	// OpenConnections is the number of client connections accepted and not
	// yet closed (at most server.max_connections).
	OpenConnections prometheus.Gauge
	// CacheDegraded counts cacheable calls answered without the cache
	// store, as if uncached, by reason: skipped (its breaker is open) or
	// error (a store operation failed or timed out).
	CacheDegraded *prometheus.CounterVec
	// CacheInvalidations exports the result caches' failed, replayed and
	// lost invalidations (the engine adds its cache).
	CacheInvalidations *CacheInvalidations
	// AuditDropped counts audit lines lost: the audit buffer was full (a
	// slow disk) or a write failed.
	AuditDropped prometheus.Counter
	// UsageLastFlush is when the durable usage store last took a flush
	// (Unix seconds; 0 before the first): alert on time() minus it.
	UsageLastFlush prometheus.Gauge
	// UsageFlushFailures counts failed writes of usage to the durable store,
	// by op (flush, sweep); the usage stays in the live counters meanwhile.
	UsageFlushFailures *prometheus.CounterVec
	// TenantQuota exports the tenants nearest their monthly quota (bounded
	// cardinality, see QuotaUsage).
	TenantQuota *QuotaUsage
}

// New creates and registers the collectors (plus the Go and process
// collectors, prefixed mcpgate_ as well).
func New() *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{Registry: r}
	// The groups only create their collectors: all are registered below,
	// so a new one must join that list too.
	m.initRequestMetrics()
	m.initStoreMetrics()
	m.initUsageMetrics()
	m.initUpstreamMetrics()
	m.initCacheMetrics()
	m.TenantQuota, _ = NewQuotaUsage(DefaultQuotaThreshold, DefaultQuotaMaxTenants, nil) // valid constants
	r.MustRegister(m.Requests, m.Denials, m.ShadowDenials, m.Degraded, m.DenialCacheHits,
		m.DecisionSeconds, m.UpstreamSeconds, m.StoreUp, m.UsagePending, m.CostCorrections, m.Unmetered,
		m.BreakersOpened, m.AlertsFailed, m.CacheRequests, m.CacheDegraded, m.CacheInvalidations,
		m.UpstreamSessions, m.UpstreamState, m.UpstreamCalls, m.SessionsEnded, m.NotificationsDropped, m.OpenConnections, m.AuditDropped, m.UsageFlushFailures, m.UsageLastFlush, m.TenantQuota)
	presetLabels(m)
	// The runtime collectors too carry the prefix: every name we serve starts
	// with mcpgate_ (mcpgate_go_goroutines, mcpgate_process_cpu_seconds_total).
	prometheus.WrapRegistererWithPrefix("mcpgate_", r).MustRegister(
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// initRequestMetrics sets up the metrics of callers' requests: outcomes,
// denials, loop breakers, connections and audit lines.
func (m *Metrics) initRequestMetrics() {
	m.Requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mcpgate_requests_total", Help: "MCP requests by method class and outcome.",
	}, []string{"method", "outcome"})
	m.Denials = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mcpgate_denials_total", Help: "Calls denied (429 or a deny_as: result answer), by scope and rule.",
	}, []string{"scope", "rule"})
	m.ShadowDenials = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mcpgate_shadow_denials_total", Help: "Calls a shadow rule would have denied, by rule.",
	}, []string{"rule"})
	m.BreakersOpened = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mcpgate_breakers_opened_total", Help: "Loop breakers opened, by reason.",
	}, []string{"reason"})
	m.AlertsFailed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "mcpgate_breaker_alerts_failed_total", Help: "Breaker alerts that could not be delivered.",
	})
	m.OpenConnections = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "mcpgate_open_connections", Help: "Client connections accepted and not yet closed.",
	})
	m.AuditDropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "mcpgate_audit_dropped_total", Help: "Audit log lines lost: the audit buffer was full or a write failed.",
	})
}

// initStoreMetrics sets up the metrics of limit decisions and the shared
// limit store.
func (m *Metrics) initStoreMetrics() {
	m.Degraded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mcpgate_degraded_decisions_total", Help: "Limit decisions taken without the shared store, by failure policy.",
	}, []string{"policy"})
	m.DenialCacheHits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "mcpgate_denial_cache_hits_total", Help: "Denials answered in-process without asking the shared store.",
	})
	m.DecisionSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "mcpgate_limit_decision_seconds", Help: "Latency of one limit-store call.",
		Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05},
	})
	m.StoreUp = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "mcpgate_limit_store_up", Help: "1 while the shared limit store answers, 0 while it is skipped.",
	})
}

// initUsageMetrics sets up the metrics of usage recording, cost
// corrections and the durable usage store.
func (m *Metrics) initUsageMetrics() {
	m.UsagePending = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "mcpgate_usage_pending_meters", Help: "Meters with admitted usage not yet recorded on them (a store was down).",
	})
	m.CostCorrections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mcpgate_cost_corrections_total", Help: "Cost corrections read from tool results, by outcome.",
	}, []string{"outcome"})
	m.Unmetered = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "mcpgate_unmetered_calls_total", Help: "Admitted calls whose usage cannot be proved recorded exactly once: a write unanswered past the op TTL, a full journal trimmed, usage no store accepts (its period long over, an overflow), or usage still pending when the process stopped.",
	})
	m.UsageLastFlush = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "mcpgate_usage_last_flush_success_timestamp_seconds", Help: "When the durable usage store last took a flush (Unix seconds; 0 before the first).",
	})
	m.UsageFlushFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mcpgate_usage_flush_failures_total", Help: "Failed writes of usage to the durable store, by op (flush, sweep).",
	}, []string{"op"})
}

// initUpstreamMetrics sets up the metrics of upstream calls, sessions and health.
func (m *Metrics) initUpstreamMetrics() {
	m.UpstreamSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "mcpgate_upstream_seconds", Help: "Latency of upstream calls, until the answer is relayed.",
		Buckets: prometheus.DefBuckets,
	})
	m.UpstreamSessions = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "mcpgate_upstream_sessions", Help: "Upstream MCP sessions tracked by this instance.",
	})
	m.UpstreamState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "mcpgate_upstream_state", Help: "Health of each upstream of upstreams: 1 for its current state (up, open, half_open, down, limited), 0 for the others.",
	}, []string{"upstream", "state"})
	m.UpstreamCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mcpgate_upstream_calls_total", Help: "Requests to each upstream of upstreams:, by outcome: ok, error (the upstream's JSON-RPC error or HTTP 4xx), refused (not sent: breaker open, 429 back-off, process down, no connection), failed (timeout, broken connection), cancelled, retried (session lost, sent again).",
	}, []string{"upstream", "outcome"})
	m.SessionsEnded = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "mcpgate_upstream_sessions_ended_total", Help: "Upstream sessions the gateway ended (idle, or without a slot).",
	})
	m.NotificationsDropped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mcpgate_notifications_dropped_total", Help: "Upstream notifications not relayed because their client was not taking them, by method.",
	}, []string{"method"})
}

// initCacheMetrics sets up the metrics of the result cache.
func (m *Metrics) initCacheMetrics() {
	m.CacheRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mcpgate_cache_requests_total", Help: "Calls of cacheable tools, by outcome.",
	}, []string{"outcome"})
	m.CacheInvalidations = newCacheInvalidations()
	m.CacheDegraded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mcpgate_cache_degraded_total", Help: "Calls of cacheable tools answered without the cache store (skipped by its breaker, or a failed or timed-out store operation), by reason.",
	}, []string{"reason"})
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
}
