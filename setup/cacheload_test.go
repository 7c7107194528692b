package setup

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/policy"
)

// Open's cache bounds a load given no bound of its own (Warm's, at start)
// by the start's config (enforce.CacheLoadTimeout): its fixed 10s cut
// every slower cached tool with an error, although the same call uncached
// succeeded.
func TestOpenCacheLoadTimeout(t *testing.T) {
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
