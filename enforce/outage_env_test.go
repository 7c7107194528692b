package enforce_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit/limittest"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// outageEnv is an engine on a real redis-server, for the tests of what it
// decides once that server dies (redis.Kill) or slows down (proxy), with a
// probe that PINGs.
type outageEnv struct {
	e     *enforce.Engine
	redis *testenv.Redis
	proxy *testenv.Toxiproxy // nil without outageOptions.Proxy
	st    *redisstore.Store
	clock *limittest.FakeClock // the engine's clock with outageOptions.Clock
}

// outageOptions are newOutageEnv's choices; the zero value is a real clock,
// no usage store, a direct connection and a store timeout of 1s.
type outageOptions struct {
	Clock   bool          // the engine reads a clock the test moves (env.clock.Advance), not the real one
	Usage   bool          // a usage store (SQLite), which quotas need
	Proxy   bool          // the connection goes through a toxiproxy, env.proxy
	Timeout time.Duration // the store's timeout: the config's store.timeout (default 1s)
}

// newOutageEnv starts the server and the engine. config is the file's
// body after upstream and auth (store, breaker, tiers).
func newOutageEnv(t *testing.T, config string, o outageOptions) *outageEnv {
	t.Helper()
	env := &outageEnv{redis: testenv.StartRedis(t, nil), clock: limittest.NewFakeClock(time.Now())}
	cfg, err := policy.Parse("outage.yaml", []byte(`
upstream: {url: "http://127.0.0.1:1/mcp"}
auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}
`+config))
	if err != nil {
		t.Fatal(err)
	}
	client := env.redis.Client(t)
	if o.Proxy {
		env.proxy = testenv.StartToxiproxy(t, env.redis.Addr)
		opt := env.redis.ClientOption()
		opt.InitAddress = []string{env.proxy.Addr}
		if client, err = rueidis.NewClient(opt); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(client.Close)
	}
	if o.Timeout == 0 {
		o.Timeout = time.Second
	}
	if env.st, err = redisstore.New(client, &redisstore.Options{Timeout: o.Timeout}); err != nil {
		t.Fatal(err)
	}
	opts := enforce.Options{Config: cfg, Shared: env.st,
		Probe: func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() }}
	if o.Clock {
		opts.Now = env.clock.Now
	}
	if o.Usage {
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
