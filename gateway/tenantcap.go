package gateway

import (
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// ruleRequestsPerTenant names the per-tenant cap on requests in progress
// in denials and metrics.
const ruleRequestsPerTenant = "max_requests_per_tenant"

// tenantRequests counts each tenant's requests in progress on this
// instance (server.max_requests_per_tenant), open streams included, so
// that one tenant cannot hold every connection the instance accepts
// (server.max_connections). It is per instance on purpose: connections are.
// Safe for concurrent use; the zero value is ready. Entries live only while
// a tenant has a request in progress.
type tenantRequests struct {
	mu sync.Mutex
	n  map[string]int
}

// acquire counts a request of tenant and reports whether it fits under max.
func (c *tenantRequests) acquire(tenant string, max int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[tenant] >= max {
		return false
	}
	if c.n == nil {
		c.n = make(map[string]int)
	}
	c.n[tenant]++
	return true
}

// release ends a request acquire counted.
func (c *tenantRequests) release(tenant string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[tenant] <= 1 {
		delete(c.n, tenant)
		return
	}
	c.n[tenant]--
}

// capTenant is the stage after authentication: a tenant over its share of
// requests in progress gets 429 (scope tenant) with Retry-After 1, before
// any work is done for it.
func (g *Gateway) capTenant(x *exchange) bool {
	max := x.rt.cfg.Server.MaxRequestsPerTenant
	if max <= 0 {
		return true
	}
	if tenant := x.p.Tenant; g.tenantRequests.acquire(tenant, max) {
		x.after(func() { g.tenantRequests.release(tenant) })
		return true
	}
	g.metrics.Requests.WithLabelValues("any", "denied").Inc()
	g.metrics.Denials.WithLabelValues(string(keyspace.PerTenant), ruleRequestsPerTenant).Inc()
	d := enforce.Decision{Scope: string(keyspace.PerTenant), Limit: limit.Decision{
		Rule:  limit.Rule{Name: ruleRequestsPerTenant, Algorithm: limit.Concurrency, Limit: int64(max), Period: time.Second},
		Limit: int64(max), RetryAfter: time.Second, ResetAfter: time.Second,
	}}
	writeDenied(x.w, nil, d, g.now())
	return false
}
