package setup

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/policy"
)

// A cached tool's load may take as long as the call it stands for: the
// cache's fixed 10s cut every slower cached tool with an error, although
// the same call uncached succeeded.
func TestCacheLoadTimeout(t *testing.T) {
	for _, c := range []struct {
		name, yaml string
		want       time.Duration
	}{
		{"defaults: upstream.timeout", "upstream: {url: http://127.0.0.1:1/mcp}\n", 60 * time.Second},
		{"never below the lock's default", "upstream: {url: http://127.0.0.1:1/mcp, timeout: 2s}\n", cache.DefaultLockTTL},
		{"a tool's longer timeout", "upstreams:\n  - {name: a, url: http://127.0.0.1:1/mcp}\ntools:\n  a__report: {timeout: 5m}\n", 5 * time.Minute},
		{"an upstream's longer timeout", "upstreams:\n  - {name: a, url: http://127.0.0.1:1/mcp, timeout: 2m}\n", 2 * time.Minute},
		{"max_duration wins", "upstream: {url: http://127.0.0.1:1/mcp, timeout: 5m, max_duration: 90s}\n", 90 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := cacheLoadTimeout(parseOver(t, c.yaml)); got != c.want {
				t.Fatalf("cacheLoadTimeout = %v, want %v", got, c.want)
			}
		})
	}

	// Open's cache gives a load that long.
	st, err := Open(context.Background(), parseOver(t, "upstream: {url: http://127.0.0.1:1/mcp, timeout: 5m}\n"), nil, &Options{NoUsage: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	key, err := cache.NewKey(cache.Tenant("acme"), "report", json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	var left time.Duration
	_, _, err = st.Cache.Get(context.Background(), key, func(ctx context.Context) ([]byte, bool, error) {
		deadline, _ := ctx.Deadline()
		left = time.Until(deadline)
		return []byte(`{}`), false, nil
	}, cache.Policy{TTL: time.Minute})
	if err != nil || left < 4*time.Minute {
		t.Fatalf("a load of Open's cache has %v left (err %v), want about 5m", left, err)
	}
}

// parseOver parses yaml, which gives the upstream section, with the auth
// section of parse.
func parseOver(t *testing.T, yaml string) *policy.Config {
	t.Helper()
	cfg, err := policy.Parse("setup_test.yaml", []byte(yaml+"auth:\n  jwt:\n    hs256_secret_env: SETUP_TEST_SECRET\n"))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
