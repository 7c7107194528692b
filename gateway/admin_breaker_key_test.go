package gateway

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/usage"
)

// Only keys of keyspace.Breaker's form reach the store. DELETE
// /admin/breakers/{key} used to hand any key to the store's ResetBreaker:
// on Redis, a key that is not a breaker hash (a rate-limit counter, as an
// operator could paste from GET /admin/limits or redis-cli) made the
// script's HMGET fail with WRONGTYPE, and the admin API answered 503
// "limit store: ..." - the store is up, the request was wrong: want 404
// "no such breaker" (as the in-process store answers for the same key).
// The other kinds under mcpgate: (a breaker's identical-calls counter, a
// usage meter, a session counter) are no breaker either, and answer 404 too.
func TestAdminResetBreakerOtherKeysOnRedis(t *testing.T) {
	t.Parallel()
	redis := testenv.StartRedis(t, nil)
	cfg := storeYAML(true) + `
default_tier: free
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: 100, period: 1m}
breaker:
  identical_calls: {count: 5, within: 1m}
sessions:
  max_per_subject: 3
  idle_timeout: 1h
usage: {flush_interval: 1h}
`
	e := newEnv(t, setup{Redis: redis, Config: cfg, Usage: openUsageDB(t, "")})
	cs := connect(t, e.mcpURL(0), token(t, "acme", "alice"), "")
	if res, err := callTool(t.Context(), cs, "echo", map[string]any{"text": "x"}); err != nil || res.IsError {
		t.Fatalf("call: %v %+v", err, res)
	}
	br := keyspace.Breaker("acme", "subject:alice")
	for _, key := range []string{
		keyspace.Counter(keyspace.PerTenant, "fixed_window", "per_tenant", keyspace.Owner{Tenant: "acme"}),
		keyspace.BreakerCall("acme", "subject:alice", "f"),
		keyspace.Usage("acme", usage.Period(time.Now())),
		keyspace.TenantSessions("acme"),
		br + ":",
		strings.TrimSuffix(keyspace.BreakerPattern, "*"),
	} {
		r := adminReq(t, http.MethodDelete, e.base[0]+"/admin/breakers/"+url.PathEscape(key), "Bearer "+testAdmin)
		if r.Status != http.StatusNotFound {
			t.Errorf("DELETE /admin/breakers/%s (not a breaker): %d %s, want 404", key, r.Status, r.Body)
		}
	}
}
