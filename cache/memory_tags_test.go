package cache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
)

// memTagIndex returns the number of tag indexes of s, their memberships,
// and the memberships whose entry has no slot in s. Call it when s is quiet.
func memTagIndex(s *MemoryStore) (tags, members, orphans int) {
	s.tagMu.Lock()
	var entries []string
	for _, t := range s.tags {
		members += len(t.members)
		for m := range t.members {
			entries = append(entries, m)
		}
	}
	tags = len(s.tags)
	s.tagMu.Unlock()
	for _, e := range entries {
		sh := s.shard(e)
		sh.mu.RLock()
		if sh.m[e] == nil {
			orphans++
		}
		sh.mu.RUnlock()
	}
	return tags, members, orphans
}

// held reports whether the store holds a value (fresh or stale) of k.
func held(t *testing.T, s *MemoryStore, k Key) bool {
	t.Helper()
	_, ok, err := s.read(context.Background(), k, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// TestMemoryStoreTagIndexEviction: tags rendered from clients' arguments
// must not outgrow MaxEntries; the memberships of evicted entries go with
// them, and invalidation still deletes exactly the live tagged entries.
func TestMemoryStoreTagIndexEviction(t *testing.T) {
	const maxEntries, n = 64, 2000
	s, err := NewMemoryStore(&MemoryOptions{MaxEntries: maxEntries})
	if err != nil {
		t.Fatal(err)
	}
	c := newCache(t, s, nil)
	ctx := context.Background()
	sc := scope(t)
	var l loads
	keys := make([]Key, n)
	for i := range n {
		keys[i] = mustKey(t, sc, "product", fmt.Sprintf(`{"id":%d}`, i))
		get(t, c, keys[i], l.fixed("v", 0), Policy{TTL: time.Minute, Tags: []string{fmt.Sprintf("product:%d", i), "all"}})
	}
	// Slots are at most maxEntries+memShards (TestMemoryStoreBounded),
	// each in its product index and in "all".
	tags, members, orphans := memTagIndex(s)
	t.Logf("after %d entries with distinct tags: %d entries held, %d tag indexes, %d memberships", n, s.Len(), tags, members)
	if tags > maxEntries+memShards+1 || members > 2*(maxEntries+memShards) || orphans != 0 {
		t.Fatalf("MaxEntries %d: %d tag indexes, %d memberships, %d of entries no longer held", maxEntries, tags, members, orphans)
	}
	if sz := tagSize(t, s, sc, "all"); sz > maxEntries+memShards {
		t.Fatalf(`index "all" has %d members with MaxEntries %d`, sz, maxEntries)
	}

	// Invalidation: an evicted entry's tag deletes nothing, a held one's
	// exactly it.
	evicted, last := -1, n-1
	for i := range n {
		if !held(t, s, keys[i]) {
			evicted = i
			break
		}
	}
	if evicted < 0 || !held(t, s, keys[last]) {
		t.Fatalf("evicted %d, last held %v", evicted, held(t, s, keys[last]))
	}
	if got, err := c.Invalidate(ctx, sc, []string{fmt.Sprintf("product:%d", evicted)}); err != nil || got != 0 {
		t.Fatalf("Invalidate(evicted entry's tag) = %d, %v; want 0", got, err)
	}
	if got, err := c.Invalidate(ctx, sc, []string{fmt.Sprintf("product:%d", last)}); err != nil || got != 1 || held(t, s, keys[last]) {
		t.Fatalf("Invalidate(held entry's tag) = %d, %v, still held %v; want 1", got, err, held(t, s, keys[last]))
	}
	keep := mustKey(t, sc, "other", `{}`)
	get(t, c, keep, l.fixed("keep", 0), Policy{TTL: time.Minute, Tags: []string{"other"}})
	want := 0
	for _, k := range keys {
		if held(t, s, k) {
			want++
		}
	}
	if got, err := c.Invalidate(ctx, sc, []string{"all"}); err != nil || got != want {
		t.Fatalf(`Invalidate("all") = %d, %v; want the %d entries held`, got, err, want)
	}
	for i, k := range keys {
		if held(t, s, k) {
			t.Fatalf(`entry %d still held after Invalidate("all")`, i)
		}
	}
	if !held(t, s, keep) {
		t.Fatal("an entry without the tag was invalidated")
	}
	if _, src := get(t, c, keys[last], l.fixed("v2", 0), Policy{TTL: time.Minute, Tags: []string{"all"}}); src != Miss {
		t.Fatalf("invalidated entry: %v, want a miss", src)
	}
	if got, err := c.Invalidate(ctx, sc, []string{"all"}); err != nil || got != 1 {
		t.Fatalf(`Invalidate("all") after a reload = %d, %v; want 1`, got, err)
	}
}

// TestMemoryStoreTagIndexExpiry: with room to spare (no eviction), the
// memberships of expired entries go, though their slots stay (a fence
// outlives its value by a minute), so tags of a few members each do not
// pile up.
func TestMemoryStoreTagIndexExpiry(t *testing.T) {
	const n = 1000
	s, err := NewMemoryStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	// Memberships last LoadTimeout + Timeout + TTL + 100ms = 750ms: longer
	// than n writes take under -race on a loaded machine.
	c := newCache(t, s, &Options{StaleWindow: -1, LoadTimeout: 50 * time.Millisecond, Timeout: 100 * time.Millisecond})
	const life = 750 * time.Millisecond
	ctx := context.Background()
	sc := scope(t)
	var l loads
	put := func(from int) time.Time {
		for i := from; i < from+n; i++ {
			k := mustKey(t, sc, "product", fmt.Sprintf(`{"id":%d}`, i))
			get(t, c, k, l.fixed("v", 0), Policy{TTL: 500 * time.Millisecond, Tags: []string{fmt.Sprintf("product:%d", i)}})
		}
		return time.Now()
	}
	start := time.Now()
	last := put(0)
	if tags, _, _ := memTagIndex(s); tags != n && last.Sub(start) < life {
		// (slower than life, the first memberships may have ended and gone)
		t.Fatalf("%d tag indexes after %d entries, want %d", tags, n, n)
	}
	time.Sleep(time.Until(last.Add(life + 50*time.Millisecond)))
	if got, err := c.Invalidate(ctx, sc, []string{"product:0"}); err != nil || got != 0 {
		t.Fatalf("Invalidate(expired entry's tag) = %d, %v; want 0", got, err)
	}
	// The insertions of n more entries sample the expired ones (8 slots
	// of the shard each) and drop their memberships.
	put(n)
	s.tagMu.Lock()
	old := 0
	for i := range n {
		if s.tags[keyspace.CacheTag(sc, fmt.Sprintf("product:%d", i))] != nil {
			old++
		}
	}
	s.tagMu.Unlock()
	tags, members, orphans := memTagIndex(s)
	t.Logf("after %d more entries: %d entries held, %d tag indexes (%d of expired entries), %d memberships", n, s.Len(), tags, old, members)
	if old > n/10 || orphans != 0 {
		t.Fatalf("%d of %d tag indexes of expired entries left, %d orphan memberships", old, n, orphans)
	}
}

// TestMemoryStoreTagIndexConcurrent runs loads, evictions and
// invalidations together (for -race and lock order), then checks that no
// membership outlived its entry.
func TestMemoryStoreTagIndexConcurrent(t *testing.T) {
	s, err := NewMemoryStore(&MemoryOptions{MaxEntries: 64})
	if err != nil {
		t.Fatal(err)
	}
	// Memberships of 125 to 175ms: some end while the test runs.
	c := newCache(t, s, &Options{StaleWindow: -1, LoadTimeout: 20 * time.Millisecond, Timeout: 5 * time.Millisecond})
	sc := scope(t)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			// The loader ignores its context: LoadTimeout (20ms, which
			// sizes the memberships) can end before a loaded -race run
			// schedules the load; a loader honouring it then fails the
			// Get. Ignoring it, a late load is served, just not stored.
			load := func(context.Context) ([]byte, bool, error) { return []byte("v"), false, nil }
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range 1000 {
				id := r.IntN(300)
				k := mustKey(t, sc, "product", fmt.Sprintf(`{"id":%d}`, id))
				pol := Policy{TTL: time.Duration(1+r.IntN(50)) * time.Millisecond, Tags: []string{fmt.Sprintf("product:%d", id), fmt.Sprintf("group:%d", id%7)}}
				if _, _, err := c.Get(context.Background(), k, load, pol); err != nil {
					t.Error(err)
					return
				}
				if r.IntN(10) == 0 {
					if _, err := c.Invalidate(context.Background(), sc, []string{fmt.Sprintf("group:%d", r.IntN(7))}); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	c.Close() // early refreshes still running would race memTagIndex
	tags, members, orphans := memTagIndex(s)
	if orphans != 0 || members > 2*(64+memShards) || tags > members {
		t.Fatalf("%d tag indexes, %d memberships, %d of entries not held", tags, members, orphans)
	}
}

// memLives returns when the value s holds for k ends (zero: none held),
// and when each of its tag memberships does.
func memLives(s *MemoryStore, k Key) (until time.Time, memberships []time.Time) {
	sh := s.shard(k.entry)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	sl := sh.m[k.entry]
	if sl == nil || !sl.has {
		return time.Time{}, nil
	}
	s.tagMu.Lock()
	defer s.tagMu.Unlock()
	for _, ref := range sl.tags {
		if t := s.tags[ref.tag]; t != nil {
			memberships = append(memberships, t.members[k.entry])
		}
	}
	return sl.until, memberships
}

// TestMemoryStoreWarmEntriesWithinTheirMemberships: an entry Warm stores
// ends no later than its tag memberships, which its batch's acquire
// registered sized for a load starting then. Warm used to store a batch's
// results together once its last load ended, each judged late only by its
// own load's duration: a load that waited for its turn (WarmConcurrency),
// or one held up by a slow load of its batch, outlived its memberships,
// and an invalidation after they ended left it served as a fresh hit (the
// memory store serves an entry without checking them).
func TestMemoryStoreWarmEntriesWithinTheirMemberships(t *testing.T) {
	const loadTimeout = 100 * time.Millisecond
	sleep := func(d time.Duration) Loader {
		return func(context.Context) ([]byte, bool, error) {
			time.Sleep(d) // ignores its context: a late load is still returned
			return []byte("v"), false, nil
		}
	}
	for _, tc := range []struct {
		name        string
		concurrency int
		loads       []time.Duration
	}{
		// Each load is within LoadTimeout; together they are not.
		{"loads in turn", 1, []time.Duration{80 * time.Millisecond, 80 * time.Millisecond, 80 * time.Millisecond,
			80 * time.Millisecond, 80 * time.Millisecond, 80 * time.Millisecond}},
		{"a slow load in the batch", 4, []time.Duration{0, 0, 0, 600 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewMemoryStore(nil)
			if err != nil {
				t.Fatal(err)
			}
			c := newCache(t, s, &Options{StaleWindow: -1, LoadTimeout: loadTimeout, Timeout: 100 * time.Millisecond, WarmConcurrency: tc.concurrency})
			sc := scope(t)
			items := make([]WarmItem, len(tc.loads))
			for i, d := range tc.loads {
				items[i] = WarmItem{Key: mustKey(t, sc, "product", fmt.Sprintf(`{"id":%d}`, i)),
					Policy: Policy{TTL: time.Minute, Tags: []string{fmt.Sprintf("product:%d", i), "products"}}, Load: sleep(d)}
			}
			if res, err := c.Warm(context.Background(), items); err != nil || res.Loaded != len(items) {
				t.Fatalf("Warm: %+v %v", res, err)
			}
			stored := 0
			for i, it := range items {
				until, memberships := memLives(s, it.Key)
				if until.IsZero() {
					continue // late: not stored
				}
				stored++
				if len(memberships) != len(it.Policy.Tags) {
					t.Fatalf("item %d: %d tag memberships, want %d", i, len(memberships), len(it.Policy.Tags))
				}
				for j, m := range memberships {
					if until.After(m) {
						t.Errorf("item %d (a load of %v): its entry ends %v after its membership of tag %q: an invalidation then would not find it",
							i, tc.loads[i], until.Sub(m), it.Policy.Tags[j])
					}
				}
			}
			t.Logf("%d of %d warmed entries stored", stored, len(items))
		})
	}
}

// BenchmarkMemoryStoreDistinctTags loads entries each with its own tag, as
// a client varying the tagged argument does, into a store of 1024 entries.
func BenchmarkMemoryStoreDistinctTags(b *testing.B) {
	s, err := NewMemoryStore(&MemoryOptions{MaxEntries: 1024})
	if err != nil {
		b.Fatal(err)
	}
	c := newCache(b, s, nil)
	sc := Tenant("bench")
	load := func(context.Context) ([]byte, bool, error) { return []byte("v"), false, nil }
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := mustKey(b, sc, "product", fmt.Sprintf(`{"id":%d}`, i))
		if _, _, err := c.Get(context.Background(), k, load, Policy{TTL: time.Minute, Tags: []string{fmt.Sprintf("product:%d", i)}}); err != nil {
			b.Fatal(err)
		}
		i++
	}
	tags, _, _ := memTagIndex(s)
	b.ReportMetric(float64(tags), "tags")
}
