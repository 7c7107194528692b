package gateway

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/policy"
)

// A session-bound client that hangs up mid-call is counted as cancelled,
// not as an upstream error: the upstream did nothing wrong, and the
// dashboards and alerts on upstream_error would blame it.
func TestClientHangingUpIsNoUpstreamError(t *testing.T) {
	e := newEnv(t, setup{Config: cancelConfig})
	tok := token(t, "acme", "alice")
	init := post(t, e.mcpURL(0), tok, initializeBody, nil)
	sid := init.Header.Get("Mcp-Session-Id")
	if init.Status != http.StatusOK || sid == "" {
		t.Fatalf("initialize: %d %s", init.Status, init.Body)
	}
	hdr := http.Header{"Mcp-Session-Id": {sid}, "Mcp-Protocol-Version": {"2025-06-18"}}
	post(t, e.mcpURL(0), tok, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, hdr)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = postCtx(ctx, e.mcpURL(0), tok, callBody(7, "slow", map[string]any{"ms": 60000}), hdr)
	}()
	eventually(t, 10*time.Second, "the slow call to reach the upstream", func() bool { return e.up.Calls("slow") == 1 })
	cancel()
	<-done
	eventually(t, 10*time.Second, "the call to be settled", func() bool { return e.gws[0].inflight.size() == 0 })
	m := scrape(t, e.base[0])
	if got := m[`mcpgate_requests_total{method="tools/call",outcome="upstream_error"}`]; got != 0 {
		t.Errorf("a client hanging up counted as %v upstream_error", got)
	}
	if got := m[`mcpgate_requests_total{method="tools/call",outcome="cancelled"}`]; got != 1 {
		t.Errorf("a client hanging up counted as %v cancelled, want 1", got)
	}
}

// A tenant whose quota a reload removed is no longer exported as near it:
// mcpgate_tenant_quota_used kept its last value until the month ended, and
// MCPGateTenantNearQuota fired for a tenant whose calls are all admitted.
func TestQuotaExportDroppedWhenAReloadRemovesTheQuota(t *testing.T) {
	withQuota := "usage: {flush_interval: 50ms}\ndefault_tier: free\ntiers:\n  free:\n    monthly_quota: 10\n"
	without := "usage: {flush_interval: 50ms}\ndefault_tier: free\ntiers:\n  free: {}\n"
	st := openUsageDB(t, "")
	var e *env
	e = newEnv(t, setup{Usage: st, Upstream: upstream.Options{Stateless: true, JSONResponse: true}, Config: withQuota,
		Reload: func(context.Context) error {
			cfg, err := policy.Parse("reload.yaml", []byte(e.configYAML(setup{Usage: st, Config: without})))
			if err != nil {
				return err
			}
			return e.gws[0].Apply(cfg, authFor(t, cfg, nil))
		}})
	tok := token(t, "acme", "alice")
	for i := range 9 {
		if r := e.callRaw(0, tok, i, "echo", map[string]any{"text": "x"}); r.Status != http.StatusOK {
			t.Fatalf("call %d: %d %s", i, r.Status, r.Body)
		}
	}
	const series = `mcpgate_tenant_quota_used{tenant="acme"}`
	if got := scrape(t, e.base[0])[series]; got < 8 {
		t.Fatalf("before the reload acme is exported at %v of 10, want ≥ 8", got)
	}
	if r := adminReq(t, http.MethodPost, e.base[0]+"/admin/reload", "Bearer "+testAdmin); r.Status != http.StatusOK {
		t.Fatalf("reload: %d %s", r.Status, r.Body)
	}
	if r := e.callRaw(0, tok, 100, "echo", map[string]any{"text": "x"}); r.Status != http.StatusOK {
		t.Fatalf("call after the reload: %d %s", r.Status, r.Body)
	}
	for s, v := range scrape(t, e.base[0]) {
		if strings.HasPrefix(s, "mcpgate_tenant_quota") && strings.Contains(s, `tenant="acme"`) {
			t.Errorf("acme has no quota any more, yet is exported: %s %v", s, v)
		}
	}
}
