package gateway

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
)

// DELETE /admin/breakers/{key} hands any key to the store's ResetBreaker.
// On Redis, a key that is not a breaker hash (a rate-limit counter, as an
// operator could paste from GET /admin/limits or redis-cli) makes the
// script's HMGET fail with WRONGTYPE, and the admin API answers 503
// "limit store: ..." - the store is up, the request was wrong: want 404
// "no such breaker" (as the in-process store answers for the same key).
func TestAdminResetBreakerNonBreakerKeyOnRedis(t *testing.T) {
	t.Parallel()
	redis := testenv.StartRedis(t, nil)
	cfg := storeYAML(true) + `
default_tier: free
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: 100, period: 1m}
`
	e := newEnv(t, setup{Redis: redis, Config: cfg})
	cs := connect(t, e.mcpURL(0), token(t, "acme", "alice"), "")
	if res, err := callTool(t.Context(), cs, "echo", map[string]any{"text": "x"}); err != nil || res.IsError {
		t.Fatalf("call: %v %+v", err, res)
	}
	key := keyspace.Counter(keyspace.PerTenant, "fixed_window", "per_tenant", keyspace.Owner{Tenant: "acme"})
	r := adminReq(t, http.MethodDelete, e.base[0]+"/admin/breakers/"+url.PathEscape(key), "Bearer "+testAdmin)
	if r.Status != http.StatusNotFound {
		t.Fatalf("DELETE /admin/breakers/%s (a rate-limit counter, not a breaker): %d %s, want 404", key, r.Status, r.Body)
	}
}
