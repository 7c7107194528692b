package enforce_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// A tenant that has used up its monthly quota (the store just denied it
// with scope quota) gets every call admitted as soon as Redis goes down
// under on_error: local: the fallback evaluates the rate rules only, the
// meter is dropped (its usage "waits"), and nothing uses what this
// instance knows (the usage the store answered, the denial it gave). The
// docs say `local` "decides with the in-process store and the same
// rules"; nothing says the quota is off, only for `open`.
func TestExhaustedQuotaAdmittedUnderLocalFallback(t *testing.T) {
	redis := testenv.StartRedis(t, nil)
	cfg, err := policy.Parse("q.yaml", []byte(`
upstream: {url: "http://127.0.0.1:1/mcp"}
auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}
store: {on_error: local, timeout: 1s}
tiers:
  free:
    monthly_quota: 3
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 1000, period: 1h}
`))
	if err != nil {
		t.Fatal(err)
	}
	us, err := sqlite.Open(filepath.Join(t.TempDir(), "u.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { us.Close() })
	client := redis.Client(t)
	st, err := redisstore.New(client, &redisstore.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforce.New(enforce.Options{Config: cfg, Shared: st, Usage: us,
		Probe: func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	call := enforce.Call{Tenant: "acme", Subject: "a", Name: "llm"}
	for i := range 3 {
		ticket, d := e.Admit(t.Context(), call)
		if !d.Allowed {
			t.Fatalf("call %d within the quota: %+v", i, d)
		}
		ticket.Done(t.Context(), enforce.Outcome{})
	}
	if _, d := e.Admit(t.Context(), call); d.Allowed || d.Scope != enforce.ScopeQuota {
		t.Fatalf("4th call: %+v, want denied by the quota", d)
	}
	redis.Kill()
	admitted := 0
	for range 10 {
		ticket, d := e.Admit(t.Context(), call)
		if d.Allowed {
			admitted++
		}
		ticket.Done(t.Context(), enforce.Outcome{})
	}
	if admitted != 0 {
		t.Fatalf("monthly quota 3 used up (3 admitted, the 4th denied): %d of 10 more admitted under on_error: local once Redis went down, want 0", admitted)
	}
}
