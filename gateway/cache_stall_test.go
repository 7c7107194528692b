//go:build unix

package gateway

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// stopRedis freezes r with SIGSTOP (connections stay open, nothing
// answers); the returned func, also run when the test ends, resumes it.
func stopRedis(t *testing.T, r *testenv.Redis) (resume func()) {
	t.Helper()
	admin := r.Client(t)
	info, err := admin.Do(context.Background(), admin.B().Info().Section("server").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	pid := 0
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			pid, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	proc, err := os.FindProcess(pid)
	if pid <= 0 || err != nil {
		t.Fatalf("no process_id in INFO server (%v)", err)
	}
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	done := false
	resume = func() {
		if !done {
			done = true
			if err := proc.Signal(syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(resume)
	return resume
}

// With the cache's Redis stalled (SIGSTOP), a cached tool is answered by
// the upstream, as if uncached: each call tries the store once until the
// cache's breaker opens, then none does. The calls are counted in
// mcpgate_cache_degraded_total. After SIGCONT the probe closes the breaker
// and the entry stored before the stall is served again.
func TestCacheOnAStalledRedisServesUncached(t *testing.T) {
	t.Parallel()
	redis := testenv.StartRedis(t, nil)
	e := newEnv(t, setup{Config: cacheConfig, Upstream: jsonUpstream, CacheRedis: redis,
		CacheOptions: &cache.Options{Timeout: 200 * time.Millisecond}})
	c := e.gws[0].Engine().Cache()
	tok := token(t, "acme", "alice")
	q := map[string]any{"query": "stall"}
	expectResult(t, "up", e.callRaw(0, tok, 1, "search", q), "miss")
	expectResult(t, "up, again", e.callRaw(0, tok, 2, "search", q), "hit")

	resume := stopRedis(t, redis)
	tries := 0
	for c.StoreAvailable() {
		if tries == cache.DefaultBreakerFailures {
			t.Fatalf("cache breaker still closed after %d calls on a stalled Redis", tries)
		}
		expectResult(t, "stalled", e.callRaw(0, tok, 10+tries, "search", q), "miss")
		tries++
	}
	open := c.Stats()
	const n = 20
	for i := range n {
		expectResult(t, "breaker open", e.callRaw(0, tok, 100+i, "search", q), "miss")
	}
	if got, want := e.up.Calls("search"), int64(1+tries+n); got != want {
		t.Fatalf("upstream saw %d search calls, want %d (every call while stalled)", got, want)
	}
	if st := c.Stats(); st.StoreErrors != open.StoreErrors || st.StoreSkipped-open.StoreSkipped != n {
		t.Fatalf("with the breaker open: %d store operations attempted, %d skipped by %d calls",
			st.StoreErrors-open.StoreErrors, st.StoreSkipped-open.StoreSkipped, n)
	}
	m := scrape(t, e.base[0])
	if got := m[`mcpgate_cache_degraded_total{reason="skipped"}`]; got != n {
		t.Errorf(`mcpgate_cache_degraded_total{reason="skipped"} = %v, want %d`, got, n)
	}
	if got := m[`mcpgate_cache_degraded_total{reason="error"}`]; got != float64(tries) {
		t.Errorf(`mcpgate_cache_degraded_total{reason="error"} = %v, want %d`, got, tries)
	}

	resume()
	eventually(t, 15*time.Second, "the cache breaker to close", c.StoreAvailable)
	expectResult(t, "resumed", e.callRaw(0, tok, 200, "search", q), "hit")
}
