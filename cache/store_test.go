package cache

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
)

// tagSize returns the number of members of a tag index, expired or not.
func tagSize(t testing.TB, s Store, sc Scope, tag string) int {
	t.Helper()
	k := keyspace.CacheTag(sc, tag)
	switch st := s.(type) {
	case *MemoryStore:
		st.tagMu.Lock()
		defer st.tagMu.Unlock()
		if m := st.tags[k]; m != nil {
			return len(m.members)
		}
		return 0
	case *RedisStore:
		n, err := st.client.Do(context.Background(), st.client.B().Zcard().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		pttl, err := st.client.Do(context.Background(), st.client.B().Pttl().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 && (pttl <= 0 || pttl > int64(time.Minute/time.Millisecond)) {
			t.Fatalf("tag index %s has PTTL %d", k, pttl)
		}
		return int(n)
	}
	t.Fatalf("unknown store %T", s)
	return 0
}

// testTagIndexBounded checks that a tag index drops the memberships of
// expired entries, so it does not grow with every entry ever tagged.
func testTagIndexBounded(t *testing.T, e storeEnv) {
	s := e.store(t)
	// Memberships last LoadTimeout + Timeout + TTL + 100ms = 1.65s: far
	// longer than a round of 50 writes takes even under -race on a loaded
	// machine (with 300ms, the first ones ended before the last was added).
	// A store timeout of 100ms let one registration of 50 time out there,
	// and its entry load without the store.
	const life = 1650 * time.Millisecond
	c := newCache(t, s, &Options{StaleWindow: -1, LoadTimeout: 50 * time.Millisecond, Timeout: 500 * time.Millisecond})
	sc := scope(t)
	var l loads
	pol := Policy{TTL: time.Second, Tags: []string{"hot"}}
	// ended waits until every membership added before last has ended, by
	// the clock Redis and the memory store read.
	ended := func(last time.Time) { time.Sleep(time.Until(last.Add(life + 50*time.Millisecond))) }
	var last time.Time
	for round := range 2 {
		for i := range 50 {
			get(t, c, mustKey(t, sc, "search", fmt.Sprintf(`{"r":%d,"i":%d}`, round, i)), l.fixed("v", 0), pol)
		}
		last = time.Now()
		if round == 0 {
			if n := tagSize(t, s, sc, "hot"); n != 50 {
				t.Fatalf("tag index holds %d members, want 50", n)
			}
			ended(last)
		}
	}
	n := tagSize(t, s, sc, "hot")
	if _, redis := s.(*RedisStore); (redis && n != 50) || n > 55 {
		t.Fatalf("after the first 50 entries expired and 50 more were tagged, the index holds %d members", n)
	}
	// Invalidating the tag finds nothing to delete among expired entries.
	ended(last)
	if got, err := c.Invalidate(context.Background(), sc, []string{"hot"}); err != nil || got != 0 {
		t.Fatalf("Invalidate after expiry = %d, %v", got, err)
	}
}

func TestMemoryStoreBounded(t *testing.T) {
	s, err := NewMemoryStore(&MemoryOptions{MaxEntries: 64})
	if err != nil {
		t.Fatal(err)
	}
	c := newCache(t, s, nil)
	var l loads
	for i := range 1000 {
		get(t, c, mustKey(t, Tenant("t"), "search", fmt.Sprintf(`{"i":%d}`, i)), l.fixed("v", 0), minute)
	}
	// Each of the 32 shards holds at most its share (2), plus the one slot
	// being inserted.
	if n := s.Len(); n > 64+memShards {
		t.Fatalf("memory store holds %d entries with MaxEntries 64", n)
	}
	if _, err := NewMemoryStore(&MemoryOptions{MaxEntries: -1}); err == nil {
		t.Fatal("negative MaxEntries accepted")
	}
}

func TestBlobRoundTrip(t *testing.T) {
	in := record{value: []byte("hello"), negative: true, fence: 1<<53 + 7, delta: 1500 * time.Microsecond, stale: time.Minute}
	out, ok := decodeBlob(encodeBlob(&in), 2*time.Minute)
	if !ok || string(out.value) != "hello" || !out.negative || out.fence != in.fence ||
		out.delta != 2*time.Millisecond || out.stale != time.Minute || out.fresh() != time.Minute {
		t.Fatalf("round trip: %+v %v", out, ok)
	}
	if _, ok := decodeBlob([]byte{2, 0, 0}, time.Second); ok {
		t.Fatal("short blob accepted")
	}
	b := encodeBlob(&in)
	b[0] = 9
	if _, ok := decodeBlob(b, time.Second); ok {
		t.Fatal("unknown version accepted")
	}
	// A zero load time is stored as 1ms: XFetch needs a positive delta.
	if r, _ := decodeBlob(encodeBlob(&record{}), time.Second); r.delta != time.Millisecond {
		t.Fatalf("zero delta stored as %v", r.delta)
	}
}
