package enforce_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/policy"
)

// The engine exports its cache's failed, replayed and lost invalidations:
// a lost one means a stale result may be served until its TTL, which an
// operator must be able to alert on (deploy/prometheus). Two invalidations
// fail on a frozen Redis with room to remember one: one is failed and
// pending, the other lost; after the thaw the remembered one is replayed.
// Closing the engine takes its cache out of the export.
func TestEngineExportsCacheInvalidations(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	cs, err := cache.NewRedisStore(r.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.New(cs, &cache.Options{Timeout: 100 * time.Millisecond, ProbeInterval: 50 * time.Millisecond, MaxPendingInvalidations: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cfg, err := policy.Parse("x.yaml", []byte(`upstream: {url: "http://127.0.0.1:1/mcp"}
auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}
`))
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	e, err := enforce.New(enforce.Options{Config: cfg, Cache: c, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	want := func(failed, replayed, lost, pending int, when string) {
		t.Helper()
		exp := strings.NewReader(`# HELP mcpgate_cache_invalidations_pending Failed cache invalidations waiting for the cache store to answer again.
# TYPE mcpgate_cache_invalidations_pending gauge
mcpgate_cache_invalidations_pending ` + strconv.Itoa(pending) + `
# HELP mcpgate_cache_invalidations_total Cache invalidations that did not reach the cache store when asked, by outcome: failed (remembered and replayed when the store answers again), replayed, lost (not remembered: a stale result may be served until its TTL).
# TYPE mcpgate_cache_invalidations_total counter
mcpgate_cache_invalidations_total{outcome="failed"} ` + strconv.Itoa(failed) + `
mcpgate_cache_invalidations_total{outcome="lost"} ` + strconv.Itoa(lost) + `
mcpgate_cache_invalidations_total{outcome="replayed"} ` + strconv.Itoa(replayed) + `
`)
		if err := testutil.GatherAndCompare(m.Registry, exp, "mcpgate_cache_invalidations_total", "mcpgate_cache_invalidations_pending"); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
	}
	want(0, 0, 0, 0, "before any invalidation")

	ctx := context.Background()
	thaw := r.Freeze(t)
	for _, tag := range []string{"p:1", "p:2"} {
		if _, err := c.Invalidate(ctx, cache.Tenant("acme"), []string{tag}); err == nil {
			t.Fatal("Invalidate on a frozen Redis succeeded")
		}
	}
	want(2, 0, 1, 1, "after two failed invalidations, room for one")
	thaw()
	testenv.Eventually(t, 15*time.Second, "the remembered invalidation to be replayed", func() bool {
		return c.Stats().ReplayedInvalidations == 1
	})
	want(2, 1, 1, 0, "after the replay")

	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	want(0, 0, 0, 0, "after the engine closed")
}
