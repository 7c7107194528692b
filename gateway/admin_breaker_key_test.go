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

// Only keys of keyspace.Breaker's form reach the store: on Redis the
// other kinds under mcpgate: (a breaker's identical-calls counter, a usage
// meter, a session counter) are no breaker either, and answer 404 rather
// than the store's WRONGTYPE as 503.
func TestAdminResetBreakerOtherKeysOnRedis(t *testing.T) {
	t.Parallel()
	redis := testenv.StartRedis(t, nil)
	cfg := storeYAML(true) + `
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
