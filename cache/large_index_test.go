package cache

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
)

// One tenant's tag index can hold as many memberships as it has entries
// alive: its tool's arguments pick the keys. An invalidation that read the
// whole index in one reply failed on a large one (here: a server that
// cuts replies over 1 MiB, as an output-buffer limit or the store timeout
// would), was remembered, and so held the cache store's breaker open, and
// every tenant's cached tools uncached, until the replay, which failed the
// same way for as long as the memberships lived. Paged, it succeeds,
// drops every entry the index lists, and the store stays available.
func TestInvalidatingALargeTagIndex(t *testing.T) {
	r := testenv.StartRedis(t, &testenv.RedisOptions{Args: []string{"--client-output-buffer-limit", "normal 1mb 1mb 0"}})
	client := r.Client(t)
	ctx := context.Background()
	c := newCache(t, mustRedisStore(t, client), &Options{Timeout: 2 * time.Second, ProbeInterval: 50 * time.Millisecond})
	big, other := Tenant("big"), Tenant("other")
	pol := Policy{TTL: time.Hour, Tags: []string{"t"}}
	var keys []Key
	for i := range 3 {
		k := mustKey(t, big, "get", fmt.Sprintf(`{"id":%d}`, i))
		loadOld(t, c, k, "old", pol)
		keys = append(keys, k)
	}
	ko := mustKey(t, other, "get", `{"id":1}`)
	loadOld(t, c, ko, "other", pol)

	// Memberships of entries that are gone or never stored (what a
	// tenant's many loads leave), far over the reply limit: ~40k × 80 B.
	index := keyspace.CacheTag(big, "t")
	until := float64(time.Now().Add(time.Hour).UnixMilli())
	for b := range 40 {
		cmd := client.B().Zadd().Key(index).ScoreMember()
		for i := range 1000 {
			cmd = cmd.ScoreMember(until, keyspace.CacheEntry(big, "get", fmt.Sprintf("%064d", b*1000+i)))
		}
		if err := client.Do(ctx, cmd.Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}

	n, err := c.Invalidate(ctx, big, []string{"t"})
	if err != nil {
		t.Fatalf("Invalidate of a 40k-member index: %v (stats %+v)", err, c.Stats())
	}
	if n != len(keys) {
		t.Errorf("Invalidate dropped %d entries, want %d", n, len(keys))
	}
	if !c.StoreAvailable() {
		t.Fatalf("the store is unavailable after the invalidation; stats %+v", c.Stats())
	}
	for _, k := range keys {
		notServed(t, c, k, pol, "after the invalidation")
	}
	var l loads
	if v, src := get(t, c, ko, l.fixed("reloaded", 0), pol); v != "other" || src != Hit {
		t.Fatalf("another tenant's entry: %q %v, want a hit on %q", v, src, "other")
	}
	if st := c.Stats(); st.FailedInvalidations != 0 || st.PendingInvalidations != 0 {
		t.Fatalf("stats: %+v", st)
	}
}
