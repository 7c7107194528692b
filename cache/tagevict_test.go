package cache

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
)

// dropTagIndex deletes scope's index of tag as Redis's eviction would (the
// index alone, its entries left), and reports whether the store can lose
// an index that way: the memory store cannot (an index there only loses a
// member with the member's slot, and Invalidate deletes an index after
// the values it lists).
func dropTagIndex(t testing.TB, s Store, sc Scope, tag string) bool {
	t.Helper()
	st, ok := s.(*RedisStore)
	if !ok {
		return false
	}
	k := keyspace.CacheTag(sc, tag)
	if n, err := st.client.Do(context.Background(), st.client.B().Del().Key(k).Build()).AsInt64(); err != nil || n != 1 {
		t.Fatalf("DEL %s = %d, %v", k, n, err)
	}
	return true
}

// testUnlistedEntryNotServed checks that an entry is served only while
// every tag index it was registered in still lists it. Redis may evict a
// tag index (a cold key) before its entries (hot ones, under allkeys-lfu
// or volatile-lru); an invalidation then finds no member and deletes
// nothing, so the entry must not be served from then on: not as a hit,
// not to a Get whose policy names other tags or none, not as a stale copy.
// The memory store never loses a tag index apart from its members' slots:
// TestConformance runs it on Redis and Cluster only.
func testUnlistedEntryNotServed(t *testing.T, e storeEnv) {
	s := e.store(t)
	c := newCache(t, s, nil)
	ctx := context.Background()
	sc := scope(t)
	var l loads
	pol := Policy{TTL: time.Minute, Tags: []string{"product:1", "all"}}
	k := mustKey(t, sc, "search", `{"id":1}`)
	get(t, c, k, l.fixed("old", 0), pol)
	if v, src := get(t, c, k, l.fixed("x", 0), pol); v != "old" || src != Hit {
		t.Fatalf("second Get: %q %v, want a hit", v, src)
	}
	dropTagIndex(t, s, sc, "product:1")
	// The mutation's invalidation finds nothing through the lost index.
	if n, err := c.Invalidate(ctx, sc, []string{"product:1"}); err != nil || n != 0 {
		t.Fatalf("Invalidate through a lost index = %d, %v", n, err)
	}
	if v, src := get(t, c, k, l.fixed("new", 0), pol); v != "new" || src != Miss {
		t.Fatalf("entry missing from a tag index: %q %v, want a new load", v, src)
	}
	// The new load registered it again: invalidation finds it.
	if v, src := get(t, c, k, l.fixed("x", 0), pol); v != "new" || src != Hit {
		t.Fatalf("after the reload: %q %v, want a hit", v, src)
	}
	if n, err := c.Invalidate(ctx, sc, []string{"product:1"}); err != nil || n != 1 {
		t.Fatalf("Invalidate after the reload = %d, %v; want 1", n, err)
	}

	// The entry records its indexes: a Get whose policy names fewer tags,
	// or none, checks the entry's own. (One whose policy names a tag the
	// entry lacks reloads it: TestEntryMissingAPolicyTagIsReloaded.)
	for i, other := range []Policy{{TTL: time.Minute}, {TTL: time.Minute, Tags: []string{"product:1"}}} {
		k := mustKey(t, sc, "lookup", fmt.Sprintf(`{"i":%d}`, i))
		get(t, c, k, l.fixed("old", 0), pol)
		if v, src := get(t, c, k, l.fixed("x", 0), other); v != "old" || src != Hit {
			t.Fatalf("policy %v, indexes intact: %q %v, want a hit", other.Tags, v, src)
		}
		dropTagIndex(t, s, sc, "all")
		if v, src := get(t, c, k, l.fixed("new", 0), other); v != "new" || src != Miss {
			t.Fatalf("policy %v, index lost: %q %v, want a new load", other.Tags, v, src)
		}
	}

	// Warm acquires without reading first: registering the entry again
	// must not make it findable, and served, again.
	kw := mustKey(t, sc, "warm", `{}`)
	get(t, c, kw, l.fixed("old", 0), pol)
	dropTagIndex(t, s, sc, "product:1")
	if res, err := c.Warm(ctx, []WarmItem{{Key: kw, Policy: pol, Load: l.fixed("warmed", 0)}}); err != nil || res.Loaded != 1 {
		t.Fatalf("Warm of an unlisted entry: %+v %v, want it loaded", res, err)
	}
	if v, src := get(t, c, kw, l.fixed("x", 0), pol); v != "warmed" || src != Hit {
		t.Fatalf("after Warm: %q %v, want the warmed value", v, src)
	}

	// Nor is its stale copy served when waiting for another loader times
	// out: the copy is as unlisted as the fresh one was.
	w := newCache(t, e.store(t), &Options{WaitTimeout: 200 * time.Millisecond, StaleWindow: time.Minute})
	ks := mustKey(t, sc, "stale", `{}`)
	short := Policy{TTL: 50 * time.Millisecond, Tags: []string{"product:2"}}
	get(t, w, ks, l.fixed("old", 0), short)
	time.Sleep(100 * time.Millisecond) // only the stale copy is left
	dropTagIndex(t, s, sc, "product:2")
	started, finish := make(chan struct{}), make(chan struct{})
	slow := goGet(ctx, c, ks, gated("slow", started, finish), short)
	<-started
	if v, src := get(t, w, ks, l.fixed("waiter's", 0), short); v == "old" || src == Stale {
		t.Fatalf("waiter timed out and got %q %v: the unlisted stale copy", v, src)
	}
	close(finish)
	<-slow
}

// TestEvictedTagIndexMissesNoInvalidation is the reviewer's proof, under
// the eviction policy the deployment docs recommend for cache.redis: hot
// entries, read on every Get, outlive their tag indexes (written once per
// load) when allkeys-lfu makes room, and an invalidation of a tag whose
// index was evicted deleted nothing and reported success: the old entries
// were served as hits until their TTL. No entry may be a hit once its tag
// was invalidated, whatever was evicted.
func TestEvictedTagIndexMissesNoInvalidation(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	client := r.Client(t)
	ctx := context.Background()
	c := newCache(t, mustRedisStore(t, client), &Options{Timeout: time.Second})
	const n = 300
	val := strings.Repeat("x", 2000)
	load := func(v string) Loader {
		return func(context.Context) ([]byte, bool, error) { return []byte(v), false, nil }
	}
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = mustKey(t, Tenant("acme"), "get", fmt.Sprintf(`{"id":%d}`, i))
		get(t, c, keys[i], load(val), Policy{TTL: time.Hour, Tags: []string{fmt.Sprintf("p:%d", i)}})
	}
	// Make the entries hot: LFU counts their reads.
	for range 30 {
		for i := range keys {
			get(t, c, keys[i], load("reloaded"), Policy{TTL: time.Hour})
		}
	}
	do := func(cmd rueidis.Completed) rueidis.RedisResult {
		res := client.Do(ctx, cmd)
		if err := res.Error(); err != nil {
			t.Fatal(err)
		}
		return res
	}
	infoInt := func(section, field string) int64 {
		info, _ := do(client.B().Info().Section(section).Build()).ToString()
		var v int64
		for _, l := range strings.Split(info, "\r\n") {
			if s, ok := strings.CutPrefix(l, field+":"); ok {
				fmt.Sscan(s, &v)
			}
		}
		return v
	}
	used := infoInt("memory", "used_memory")
	// Fill the server past a limit just above what it holds: allkeys-lfu
	// evicts the least used keys to make room.
	do(client.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", "allkeys-lfu").Build())
	do(client.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", fmt.Sprint(used+200_000)).Build())
	for j := range 400 {
		client.Do(ctx, client.B().Set().Key(fmt.Sprintf("mcpgate:cache:{filler:%d}", j)).Value(strings.Repeat("y", 2000)).Build())
	}
	do(client.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", "0").Build())
	orphans := 0 // entries left whose index was evicted
	for i := range keys {
		idx := keyspace.CacheTag(Tenant("acme"), fmt.Sprintf("p:%d", i))
		e, _ := client.Do(ctx, client.B().Exists().Key(keys[i].entry).Build()).AsInt64()
		x, _ := client.Do(ctx, client.B().Exists().Key(idx).Build()).AsInt64()
		if e == 1 && x == 0 {
			orphans++
		}
	}
	t.Logf("evicted %d keys; %d entries outlived their tag index", infoInt("stats", "evicted_keys"), orphans)
	stale := 0
	for i := range keys {
		if _, err := c.Invalidate(ctx, Tenant("acme"), []string{fmt.Sprintf("p:%d", i)}); err != nil {
			t.Fatal(err)
		}
		if v, src := get(t, c, keys[i], load("reloaded"), Policy{TTL: time.Hour}); src == Hit && v == val {
			stale++
		}
	}
	if stale > 0 {
		t.Errorf("stale entries served as hits after their tag was invalidated: %d of %d", stale, n)
	}
}

// TestPreviousVersionBlob checks the blobs of the version before tag
// indexes were recorded in the entry: such an entry is a miss (its indexes
// are unknown, so it could be one an invalidation missed), loaded again
// and replaced. And an untagged entry this version writes keeps the old
// layout, so instances not yet upgraded still read it.
func TestPreviousVersionBlob(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	client := r.Client(t)
	ctx := context.Background()
	c := newCache(t, mustRedisStore(t, client), nil)
	k := mustKey(t, scope(t), "search", `{}`)
	old := make([]byte, 18, 18+3)
	old[0] = 1
	binary.BigEndian.PutUint64(old[2:10], 1)
	binary.BigEndian.PutUint32(old[10:14], 1)
	binary.BigEndian.PutUint32(old[14:18], 60_000)
	old = append(old, "old"...)
	if err := client.Do(ctx, client.B().Set().Key(k.entry).Value(rueidis.BinaryString(old)).Px(time.Hour).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	var l loads
	if v, src := get(t, c, k, l.fixed("new", 0), minute); v != "new" || src != Miss {
		t.Fatalf("entry of the previous version: %q %v, want a new load", v, src)
	}
	if v, src := get(t, c, k, l.fixed("x", 0), minute); v != "new" || src != Hit {
		t.Fatalf("after the reload: %q %v, want a hit", v, src)
	}
	b, err := client.Do(ctx, client.B().Get().Key(k.entry).Build()).AsBytes()
	if err != nil {
		t.Fatal(err)
	}
	// What the previous version's reader checks: version 1, value at 18.
	if len(b) < 18 || b[0] != 1 || string(b[18:]) != "new" {
		t.Fatalf("untagged entry stored as %q: the previous version cannot read it", b)
	}
}

// TestTaggedBlobRoundTrip checks the layout of a tagged entry, which
// records its tag index keys, and that a truncated one reads as absent.
func TestTaggedBlobRoundTrip(t *testing.T) {
	in := record{value: []byte("hello"), fence: 42, delta: time.Millisecond, stale: time.Second,
		tags: []string{keyspace.CacheTag(Tenant("acme"), "product:1"), ""}}
	b := encodeBlob(&in)
	if b[0] != blobTagged {
		t.Fatalf("tagged entry stored with version %d", b[0])
	}
	out, ok := decodeBlob(b, time.Minute)
	if !ok || string(out.value) != "hello" || out.fence != 42 || out.stale != time.Second ||
		len(out.tags) != 2 || out.tags[0] != in.tags[0] || out.tags[1] != "" {
		t.Fatalf("round trip: %+v %v", out, ok)
	}
	for n := blobHeader; n < len(b)-len(in.value); n++ {
		if _, ok := decodeBlob(b[:n], time.Minute); ok {
			t.Fatalf("blob truncated to %d of %d bytes accepted", n, len(b))
		}
	}
	// A count of indexes larger than the blob could hold is refused.
	bad := append([]byte(nil), b...)
	binary.BigEndian.PutUint32(bad[blobHeader:], 1<<31)
	if _, ok := decodeBlob(bad, time.Minute); ok {
		t.Fatal("absurd index count accepted")
	}
}
