package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/usage"
)

// A cached, cost-reporting tool (cost.from_result) shared by every tenant:
// tenant acme's call loads the entry (the tool reports 900 tokens, acme is
// billed 900). Tenant initech's identical call is a hit: no upstream work
// was done for it, so it is billed the tool's estimate (150), not the 900
// tokens acme's load consumed (as the Go SDK middleware bills a hit).
func TestCacheHitIsBilledTheEstimateNotTheLoadersReportedCost(t *testing.T) {
	s := setup{Usage: openUsageDB(t, ""), Upstream: stateless, Config: `
usage: {flush_interval: 50ms}
tools:
  llm_complete:
    cost: {estimate: 150, from_result: _meta.usage.tokens}
    cache: {ttl: 10m, shared: true}
`}
	e := newEnv(t, s)
	args := map[string]any{"prompt": "p", "tokens": 900}
	r1 := e.callRaw(0, token(t, "acme", "alice"), 1, "llm_complete", args)
	r2 := e.callRaw(0, token(t, "initech", "bob"), 2, "llm_complete", args)
	if r1.Status != http.StatusOK || r2.Status != http.StatusOK {
		t.Fatalf("statuses %d %d", r1.Status, r2.Status)
	}
	if h := r2.Header.Get("X-Mcp-Cache"); h != "hit" {
		t.Fatalf("second call X-Mcp-Cache = %q, want hit", h)
	}
	e.srvs[0].Close()
	p := usage.Period(time.Now())
	a, b := e.live(0, "acme", p), e.live(0, "initech", p)
	t.Logf("acme used %d, initech used %d", a.Used(), b.Used())
	if b.Used() != 150 {
		t.Fatalf("initech (a cache hit, no upstream work) billed %d: acme's load's reported cost; want the estimate 150", b.Used())
	}
}
