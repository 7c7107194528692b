//go:build unix

package cache

import (
	"context"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
)

// A Warm whose commit meets a stalled Redis times out on the store (the
// commit's own bound, acquired+LoadTimeout+Timeout): that is a store failure
// and must count for the breaker (BreakerFailures 1: it opens), as a Get's
// commit timing out does.
func TestWarmCommitTimeoutCountsAsStoreFailure(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	client := r.Client(t)
	c := newCache(t, mustRedisStore(t, client), &Options{Timeout: 200 * time.Millisecond, BreakerFailures: 1})
	k := mustKey(t, scope(t), "search", `{"w":1}`)
	pol := minute
	pol.LoadTimeout = 2 * time.Second
	var resume func()
	load := func(ctx context.Context) ([]byte, bool, error) {
		resume = stopRedis(t, client) // the store stalls while the value loads
		return []byte("v"), false, nil
	}
	_, err := c.Warm(context.Background(), []WarmItem{{Key: k, Policy: pol, Load: load}})
	t.Logf("Warm: %v", err)
	avail := c.StoreAvailable()
	resume()
	if err == nil {
		t.Fatal("Warm's commit on a stalled Redis succeeded")
	}
	if avail {
		t.Fatalf("a Warm commit that timed out on a stalled Redis did not count as a store failure (breaker still closed, BreakerFailures 1): %v", err)
	}
}
