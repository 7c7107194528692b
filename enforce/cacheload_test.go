package enforce_test

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/enforce"
)

// A cached tool's load may take as long as the call it stands for: the
// cache's fixed 10s cut every slower cached tool with an error, although
// the same call uncached succeeded.
func TestCacheLoadTimeout(t *testing.T) {
	t.Parallel()
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
			if got := enforce.CacheLoadTimeout(parseConfig(t, c.yaml)); got != c.want {
				t.Fatalf("CacheLoadTimeout = %v, want %v", got, c.want)
			}
		})
	}
}

// upstream.timeout is live: a reload raising it lets a cached call's load
// run as long as an uncached call may, where the bound was the cache's,
// derived once at start, and the load was cut at the old timeout.
func TestCachePlanLoadTimeoutFollowsReload(t *testing.T) {
	t.Parallel()
	const tools = "tools:\n  slow: {cache: {ttl: 1m}}\n"
	e := newEngine(t, "upstream: {url: http://127.0.0.1:1/mcp, timeout: 5s}\n"+tools, enforce.Options{})
	loadTimeout := func() time.Duration {
		t.Helper()
		tk := mustAdmit(t, e, enforce.Call{Tenant: "acme", Subject: "a", Name: "slow"})
		defer tk.Done(t.Context(), enforce.Outcome{})
		plan, ok := tk.CachePlan()
		if !ok {
			t.Fatal("a cached tool has no cache plan")
		}
		return plan.Policy.LoadTimeout
	}
	if got := loadTimeout(); got != cache.DefaultLockTTL {
		t.Fatalf("upstream.timeout 5s: the load's bound is %v, want %v", got, cache.DefaultLockTTL)
	}
	if err := e.SetConfig(parseConfig(t, "upstream: {url: http://127.0.0.1:1/mcp, timeout: 30s}\n"+tools)); err != nil {
		t.Fatal(err)
	}
	if got := loadTimeout(); got != 30*time.Second {
		t.Fatalf("after a reload to upstream.timeout 30s: the load's bound is %v, want 30s", got)
	}
}
