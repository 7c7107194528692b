package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/policy"
)

const adminConfig = `
default_tier: free
tiers:
  free:
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: sliding_window, limit: 10, period: 1m}
  pro:
    monthly_quota: 5000
    limits:
      - {name: per_tenant, per: tenant, algorithm: gcra, limit: 100, period: 1s, burst: 200}
global:
  - {name: all_tenants, algorithm: fixed_window, limit: 10000, period: 1m}
tools:
  slow:
    limits:
      - {name: slow_in_flight, per: tenant_tool, algorithm: concurrency, limit: 2, period: 1m}
`

func adminReq(t *testing.T, method, url, authorization string) *response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	r, err := do(req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The admin API answers 401 without the admin bearer token, whatever the
// endpoint, and serves limits and reload with it.
func TestAdminAPI(t *testing.T) {
	t.Parallel()
	var reloads atomic.Int64
	var fail atomic.Bool
	e := newEnv(t, setup{Config: adminConfig, Reload: func(context.Context) error {
		reloads.Add(1)
		if fail.Load() {
			return errors.New("config.yaml:3: tiers: broken")
		}
		return nil
	}})
	base := e.base[0]
	endpoints := []struct{ method, path string }{
		{http.MethodGet, "/admin/limits?tenant=acme"},
		{http.MethodPost, "/admin/limits/reset"},
		{http.MethodPost, "/admin/reload"},
		{http.MethodGet, "/admin/usage?tenant=acme"},
		{http.MethodPost, "/admin/cache/invalidate"},
		{http.MethodGet, "/admin/breakers"},
		{http.MethodDelete, "/admin/breakers/x"},
		{http.MethodGet, "/admin/nope"},
	}
	agentToken := token(t, "acme", "alice")
	for _, ep := range endpoints {
		for _, authz := range []string{"", "Bearer wrong", "Basic " + testAdmin, "Bearer " + testAdmin + "x", "Bearer " + agentToken, testAdmin} {
			r := adminReq(t, ep.method, base+ep.path, authz)
			if r.Status != http.StatusUnauthorized || !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("%s %s with %q: %d %s", ep.method, ep.path, authz, r.Status, r.Body)
			}
		}
	}
	if reloads.Load() != 0 {
		t.Fatal("an unauthorized request reloaded")
	}

	admin := "Bearer " + testAdmin
	r := adminReq(t, http.MethodGet, base+"/admin/limits?tenant=acme", admin)
	if r.Status != http.StatusOK || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("/admin/limits: %d %v %s", r.Status, r.Header, r.Body)
	}
	var limits struct {
		Tenant      string `json:"tenant"`
		DefaultTier string `json:"default_tier"`
		Store       string `json:"store"`
		Tiers       map[string]struct {
			MonthlyQuota int64      `json:"monthly_quota"`
			Limits       []ruleView `json:"limits"`
		} `json:"tiers"`
		Tools  map[string][]ruleView `json:"tools"`
		Global []ruleView            `json:"global"`
	}
	if err := json.Unmarshal(r.Body, &limits); err != nil {
		t.Fatalf("%s: %v", r.Body, err)
	}
	if limits.Tenant != "acme" || limits.DefaultTier != "free" || limits.Store != "memory" ||
		len(limits.Tiers) != 2 || limits.Tiers["pro"].MonthlyQuota != 5000 ||
		len(limits.Tiers["free"].Limits) != 1 || limits.Tiers["free"].Limits[0] != (ruleView{Name: "per_tool", Per: "tenant_tool", Algorithm: "sliding_window", Limit: 10, Period: "1m0s"}) ||
		limits.Tiers["pro"].Limits[0].Burst != 200 ||
		len(limits.Tools["slow"]) != 1 || limits.Tools["slow"][0].Algorithm != "concurrency" ||
		len(limits.Global) != 1 || limits.Global[0].Per != "global" {
		t.Fatalf("/admin/limits: %s", r.Body)
	}
	if r := adminReq(t, http.MethodGet, base+"/admin/limits", admin); r.Status != http.StatusBadRequest {
		t.Fatalf("/admin/limits without tenant: %d %s", r.Status, r.Body)
	}

	if r := adminReq(t, http.MethodPost, base+"/admin/reload", admin); r.Status != http.StatusOK || !strings.Contains(string(r.Body), "reloaded") {
		t.Fatalf("/admin/reload: %d %s", r.Status, r.Body)
	}
	fail.Store(true)
	if r := adminReq(t, http.MethodPost, base+"/admin/reload", admin); r.Status != http.StatusUnprocessableEntity || !strings.Contains(string(r.Body), "broken") {
		t.Fatalf("/admin/reload failing: %d %s", r.Status, r.Body)
	}
	if reloads.Load() != 2 {
		t.Fatalf("Reload called %d times, want 2", reloads.Load())
	}
	if r := adminReq(t, http.MethodGet, base+"/admin/reload", admin); r.Status == http.StatusOK {
		t.Fatalf("GET /admin/reload: %d", r.Status)
	}
	// without a usage store, metering is off
	if r := adminReq(t, http.MethodGet, base+"/admin/usage?tenant=acme", admin); r.Status != http.StatusNotImplemented {
		t.Fatalf("/admin/usage without a usage store: %d %s, want 501", r.Status, r.Body)
	}
	if r := adminReq(t, http.MethodGet, base+"/admin/breakers", admin); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"breakers":[]`) {
		t.Fatalf("/admin/breakers: %d %s, want 200 and an empty list", r.Status, r.Body)
	}
	if r := adminReq(t, http.MethodDelete, base+"/admin/breakers/x", admin); r.Status != http.StatusNotFound {
		t.Fatalf("DELETE of an unknown breaker: %d %s, want 404", r.Status, r.Body)
	}
	if r := adminReq(t, http.MethodGet, base+"/admin/nope", admin); r.Status != http.StatusNotFound {
		t.Fatalf("unknown admin endpoint: %d", r.Status)
	}
}

// Without Options.Reload, /admin/reload answers 501; without an admin token,
// the admin API refuses everyone (even an empty bearer token).
func TestAdminWithoutReloadOrToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{})
	if r := adminReq(t, http.MethodPost, e.base[0]+"/admin/reload", "Bearer "+testAdmin); r.Status != http.StatusNotImplemented {
		t.Fatalf("reload without Reload: %d %s", r.Status, r.Body)
	}
	g, err := New(t.Context(), Options{Config: e.cfg, Auth: authFor(t, e.cfg, nil), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, authz := range []string{"", "Bearer ", "Bearer"} {
		req, _ := http.NewRequest(http.MethodGet, "/admin/limits?tenant=a", nil)
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		w := httptest.NewRecorder()
		g.ServeHTTP(w, req)
		if w.Code != http.StatusUnauthorized {
			t.Fatalf("no admin token configured, %q: %d", authz, w.Code)
		}
	}
}

// A reload through Apply takes effect on the next request: new limits, the
// counters' state kept, and the local denial cache forgotten (with Redis, the
// cached denial would otherwise outlive the limit that caused it).
func TestReloadAppliesConfig(t *testing.T) {
	t.Parallel()
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			var e *env
			var redis *testenv.Redis
			if m.redis {
				redis = testenv.StartRedis(t, nil)
			}
			rules := func(limit int) string {
				return storeYAML(m.redis) + fmt.Sprintf(`
tools:
  echo:
    limits:
      - {name: echo_cap, per: tenant_tool, algorithm: fixed_window, limit: %d, period: 1h}
`, limit)
			}
			e = newEnv(t, setup{Redis: redis, Upstream: upstream.Options{Stateless: true, JSONResponse: true}, Config: rules(1),
				Reload: func(context.Context) error {
					cfg, err := policy.Parse("reload.yaml", []byte(e.configYAML(setup{Redis: redis, Config: rules(3)})))
					if err != nil {
						return err
					}
					return e.gws[0].Apply(cfg, authFor(t, cfg, nil))
				}})
			tok := token(t, "acme", "alice")
			statuses := func(n int) (out []int) {
				for i := range n {
					out = append(out, e.callRaw(0, tok, i, "echo", map[string]any{"text": "x"}).Status)
				}
				return out
			}
			if got := statuses(3); !slices.Equal(got, []int{200, 429, 429}) {
				t.Fatalf("limit 1: %v", got)
			}
			if r := adminReq(t, http.MethodPost, e.base[0]+"/admin/reload", "Bearer "+testAdmin); r.Status != http.StatusOK {
				t.Fatalf("reload: %d %s", r.Status, r.Body)
			}
			// The counter keeps its 1 call; the new limit allows 2 more.
			if got := statuses(3); !slices.Equal(got, []int{200, 200, 429}) {
				t.Fatalf("after reload to limit 3: %v", got)
			}
			if e.gws[0].Config().Tools["echo"].Limits[0].Limit != 3 {
				t.Fatal("Config() does not return the reloaded configuration")
			}
		})
	}
}

// /healthz is liveness, /readyz readiness, /metrics the Prometheus
// exposition whose mcpgate series count what happened.
func TestHealthAndMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: adminConfig, Upstream: upstream.Options{Stateless: true, JSONResponse: true}})
	base := e.base[0]
	if r := get(t, base+"/healthz", ""); r.Status != http.StatusOK || strings.TrimSpace(string(r.Body)) != "ok" {
		t.Fatalf("/healthz: %d %s", r.Status, r.Body)
	}
	if r := get(t, base+"/readyz", ""); r.Status != http.StatusOK {
		t.Fatalf("/readyz (memory store): %d %s", r.Status, r.Body)
	}
	if r := adminReq(t, http.MethodPost, base+"/healthz", ""); r.Status != http.StatusMethodNotAllowed {
		t.Fatalf("POST /healthz: %d", r.Status)
	}

	// Traffic of every outcome.
	tok := token(t, "acme", "alice")
	for i := range 11 {
		e.callRaw(0, tok, i, "echo", map[string]any{"text": "x"}) // 10 admitted, 1 denied
	}
	e.callRaw(0, "", 1, "echo", nil)                                               // unauthorized
	e.callRaw(0, sign(t, claims("acme", "alice", "tools:search")), 1, "echo", nil) // forbidden
	post(t, e.mcpURL(0), tok, "{", nil)                                            // bad request

	m := scrape(t, base)
	for series, want := range map[string]float64{
		`mcpgate_requests_total{method="tools/call",outcome="admitted"}`:  10,
		`mcpgate_requests_total{method="tools/call",outcome="denied"}`:    1,
		`mcpgate_requests_total{method="tools/call",outcome="forbidden"}`: 1,
		`mcpgate_requests_total{method="any",outcome="unauthorized"}`:     1,
		`mcpgate_requests_total{method="any",outcome="bad_request"}`:      1,
		`mcpgate_denials_total{rule="per_tool",scope="tenant_tool"}`:      1,
		`mcpgate_upstream_seconds_count`:                                  10,
		// One store request per call (tenant and global rules together).
		`mcpgate_limit_decision_seconds_count`: 11,
		`mcpgate_denial_cache_hits_total`:      0,
	} {
		if got, ok := m[series]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
		}
	}
	for series := range m {
		name, _, _ := strings.Cut(series, "{")
		// Every name, the runtime collectors' included, carries the prefix.
		if !strings.HasPrefix(name, "mcpgate_") {
			t.Errorf("metric %s is not prefixed mcpgate_", name)
		}
	}
}
