package cache

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
)

// An entry stored while its tool's policy named no tag, or other tags (a
// config reload added one since), is not in the index of the tag the
// policy in force names, so an invalidation of that tag cannot find it. A
// Get under that policy must not be served it, whether the invalidation
// came before that Get or after it: it is reloaded, and registered under
// the tag.
func TestEntryMissingAPolicyTagIsReloaded(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	for name, s := range map[string]Store{"memory": mustMemoryStore(t), "redis": mustRedisStore(t, r.Client(t))} {
		t.Run(name, func(t *testing.T) {
			c := newCache(t, s, nil)
			ctx := context.Background()
			sc := scope(t)
			tagged := Policy{TTL: time.Hour, Tags: []string{"product:1"}}
			for i, before := range []Policy{{TTL: time.Hour}, {TTL: time.Hour, Tags: []string{"all"}}} {
				var l loads
				// The invalidation after the first Get under the new policy.
				k := mustKey(t, sc, "search", fmt.Sprintf(`{"id":1,"i":%d}`, i))
				get(t, c, k, l.fixed("old", 0), before)
				if v, src := get(t, c, k, l.fixed("reloaded", 0), tagged); v != "reloaded" || src != Miss {
					t.Fatalf("before %v: first Get under the new tags: %q %v, want a new load", before.Tags, v, src)
				}
				if v, src := get(t, c, k, l.fixed("x", 0), tagged); v != "reloaded" || src != Hit {
					t.Fatalf("before %v: second Get under the new tags: %q %v, want a hit", before.Tags, v, src)
				}
				if _, err := c.Invalidate(ctx, sc, []string{"product:1"}); err != nil {
					t.Fatal(err)
				}
				if v, src := get(t, c, k, l.fixed("new", 0), tagged); v != "new" {
					t.Fatalf("before %v: after Invalidate(product:1): %q %v, want the new value", before.Tags, v, src)
				}

				// The invalidation before any Get under the new policy:
				// it found nothing to delete.
				k = mustKey(t, sc, "lookup", fmt.Sprintf(`{"id":1,"i":%d}`, i))
				get(t, c, k, l.fixed("old", 0), before)
				if _, err := c.Invalidate(ctx, sc, []string{"product:1"}); err != nil {
					t.Fatal(err)
				}
				if v, src := get(t, c, k, l.fixed("new", 0), tagged); v != "new" {
					t.Fatalf("before %v: Get after Invalidate(product:1): %q %v, want the new value", before.Tags, v, src)
				}
				// An entry with more tags than the policy names is served.
				if v, src := get(t, c, k, l.fixed("x", 0), Policy{TTL: time.Hour}); v != "new" || src != Hit {
					t.Fatalf("before %v: Get under no tags: %q %v, want a hit", before.Tags, v, src)
				}

				// A lock attempt (a miss whose read came before another
				// instance, on the old policy, stored the entry; Warm) does
				// not return the entry lacking the tag as fresh either.
				k = mustKey(t, sc, "fetch", fmt.Sprintf(`{"id":1,"i":%d}`, i))
				get(t, c, k, l.fixed("old", 0), before)
				acq := s.acquire(ctx, []acquireReq{c.acquireReq(k, tagged, modeMiss, 0, c.token())})[0]
				if acq.err != nil || acq.status == statusFresh {
					t.Fatalf("before %v: a lock attempt under the new tags: %+v, want the lock, not the entry lacking the tag", before.Tags, acq)
				}
			}
		})
	}
}
