package enforce_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// outageEnv is an engine on a real redis-server, for the tests of what it
// decides once that server dies (redis.Kill): a store timeout of 1s, a
// probe that PINGs, and a clock the test moves (advance).
type outageEnv struct {
	e     *enforce.Engine
	redis *testenv.Redis
	st    *redisstore.Store
	mu    sync.Mutex
	clock time.Time
}

// newOutageEnv starts the server and the engine. config is the file's
// body after upstream and auth (store, breaker, tiers); withUsage gives
// the engine a usage store (SQLite), which quotas need.
func newOutageEnv(t *testing.T, config string, withUsage bool) *outageEnv {
	t.Helper()
	env := &outageEnv{redis: testenv.StartRedis(t, nil), clock: time.Now()}
	cfg, err := policy.Parse("outage.yaml", []byte(`
upstream: {url: "http://127.0.0.1:1/mcp"}
auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}
`+config))
	if err != nil {
		t.Fatal(err)
	}
	client := env.redis.Client(t)
	if env.st, err = redisstore.New(client, &redisstore.Options{Timeout: time.Second}); err != nil {
		t.Fatal(err)
	}
	opts := enforce.Options{Config: cfg, Shared: env.st, Now: env.now,
		Probe: func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() }}
	if withUsage {
		us, err := sqlite.Open(filepath.Join(t.TempDir(), "u.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { us.Close() })
		opts.Usage = us
	}
	if env.e, err = enforce.New(opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.e.Close() })
	return env
}

func (env *outageEnv) now() time.Time {
	env.mu.Lock()
	defer env.mu.Unlock()
	return env.clock
}

// advance moves the engine's clock by d.
func (env *outageEnv) advance(d time.Duration) {
	env.mu.Lock()
	env.clock = env.clock.Add(d)
	env.mu.Unlock()
}

// openBreaker fails call n times in a row, n being the config's
// breaker.consecutive_failures, and checks that the breaker then refuses it.
func (env *outageEnv) openBreaker(t *testing.T, call enforce.Call, n int) {
	t.Helper()
	for i := range n {
		ticket, d := env.e.Admit(t.Context(), call)
		if !d.Allowed {
			t.Fatalf("call %d: %+v", i, d)
		}
		ticket.Done(t.Context(), enforce.Outcome{Status: enforce.ToolError})
	}
	if _, d := env.e.Admit(t.Context(), call); d.Allowed || d.Scope != enforce.ScopeBreaker {
		t.Fatalf("after %d failures: %+v, want the breaker open", n, d)
	}
}

// admitN admits call n times, settling each at once, and returns how many
// were allowed and the last decision.
func (env *outageEnv) admitN(t *testing.T, call enforce.Call, n int) (admitted int, last enforce.Decision) {
	t.Helper()
	for range n {
		ticket, d := env.e.Admit(t.Context(), call)
		if d.Allowed {
			admitted++
		}
		last = d
		ticket.Done(t.Context(), enforce.Outcome{})
	}
	return admitted, last
}
