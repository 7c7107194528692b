package cache

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMemoryStoreMaxBytes: distinct large values, as a client varying a
// cached tool's arguments sends, must not grow the store past MaxBytes (the
// entry count alone let 200 answers of 1 MiB pin 200 MiB); the newest ones
// are still served.
func TestMemoryStoreMaxBytes(t *testing.T) {
	// A shard's share is 128 KiB, a value may count 32 KiB: 5 values of
	// 24 KiB fit in a shard, 6 do not.
	const maxBytes, size, n = 4 << 20, 24 << 10, 1000
	s := newBytesStore(t, maxBytes)
	c := newCache(t, s, nil)
	sc := scope(t)
	var l loads
	keys := make([]Key, n)
	peak := int64(0)
	for i := range n {
		keys[i] = mustKey(t, sc, "echo", fmt.Sprintf(`{"i":%d}`, i))
		v := fmt.Sprintf("%06d", i) + strings.Repeat("x", size-6)
		if got, _ := get(t, c, keys[i], l.fixed(v, 0), minute); got != v {
			t.Fatalf("value %d: got %d bytes", i, len(got))
		}
		peak = max(peak, heldBytes(s))
	}
	t.Logf("%d values of %d bytes: %d entries held, %d bytes (peak %d), MaxBytes %d", n, size, s.Len(), heldBytes(s), peak, maxBytes)
	if peak > maxBytes {
		t.Fatalf("the store held %d bytes with MaxBytes %d", peak, maxBytes)
	}
	// Each shard keeps its newest values: its share fits 5, and an
	// insertion samples them all, dropping the oldest.
	for i := n - 4; i < n; i++ {
		want := fmt.Sprintf("%06d", i) + strings.Repeat("x", size-6)
		if got, src := get(t, c, keys[i], l.fixed("reloaded", 0), minute); src != Hit || got != want {
			t.Fatalf("recent value %d: %v (%d bytes), want a hit", i, src, len(got))
		}
	}
}

// TestMemoryStoreOversizedValue: a value over a share's quarter goes back
// to its caller and the callers sharing its flight, is not stored, and a
// waiter of another Cache on the same store is woken (it loads itself)
// rather than left waiting out WaitTimeout.
func TestMemoryStoreOversizedValue(t *testing.T) {
	const maxBytes = 4 << 20 // a value may count 32 KiB
	s := newBytesStore(t, maxBytes)
	opts := &Options{WaitTimeout: 10 * time.Second, LockTTL: 10 * time.Second}
	a, b := newCache(t, s, opts), newCache(t, s, opts)
	k := mustKey(t, scope(t), "echo", `{"big":true}`)
	big := strings.Repeat("y", 64<<10)
	var la, lb loads
	slow := la.fixed(big, 300*time.Millisecond)

	type result struct {
		v   string
		src Source
		err error
		d   time.Duration
	}
	start := time.Now()
	var wg sync.WaitGroup
	res := make([]result, 3)
	run := func(i int, c *Cache, load Loader) {
		wg.Go(func() {
			e, src, err := c.Get(context.Background(), k, load, minute)
			res[i] = result{string(e.Value), src, err, time.Since(start)}
		})
	}
	run(0, a, slow)
	time.Sleep(50 * time.Millisecond) // a holds the lock
	run(1, a, slow)                   // shares a's flight
	run(2, b, lb.fixed(big, 0))       // waits for a's lock
	wg.Wait()
	for i, r := range res {
		if r.err != nil || r.v != big {
			t.Fatalf("caller %d: %d bytes, %v, %v", i, len(r.v), r.src, r.err)
		}
	}
	if la.count() != 1 {
		t.Fatalf("a's loader ran %d times, want once for its flight", la.count())
	}
	if r := res[2]; lb.count() != 1 || r.d > 5*time.Second {
		t.Fatalf("b's waiter: %v after %v, its loader ran %d times; want its own load once a's commit woke it", r.src, r.d, lb.count())
	}
	if held(t, s, k) || heldBytes(s) != 0 {
		t.Fatalf("oversized value stored: held %v, %d bytes", held(t, s, k), heldBytes(s))
	}
	if _, src := get(t, a, k, la.fixed(big, 0), minute); src != Miss {
		t.Fatalf("after an oversized value: %v, want a miss", src)
	}

	// A small value of the same key is stored.
	if _, src := get(t, a, k, la.fixed("small", 0), minute); src != Miss {
		t.Fatalf("small value: %v, want a miss", src)
	}
	if v, src := get(t, b, k, lb.fixed("other", 0), minute); src != Hit || v != "small" {
		t.Fatalf("small value: %q %v, want a hit", v, src)
	}
}

// TestMemoryStoreOversizedReplaces: an oversized load of an entry drops the
// older value it replaces, so the store never serves a value older than
// one its callers already got.
func TestMemoryStoreOversizedReplaces(t *testing.T) {
	s := newBytesStore(t, 4<<20)
	c := newCache(t, s, &Options{StaleWindow: -1})
	k := mustKey(t, scope(t), "echo", `{}`)
	var l loads
	get(t, c, k, l.fixed("old", 0), Policy{TTL: 50 * time.Millisecond})
	time.Sleep(80 * time.Millisecond)
	if v, src := get(t, c, k, l.fixed(strings.Repeat("z", 64<<10), 0), minute); src != Miss || len(v) != 64<<10 {
		t.Fatalf("reload: %d bytes %v", len(v), src)
	}
	if held(t, s, k) || heldBytes(s) != 0 {
		t.Fatalf("the replaced value is still held (%d bytes)", heldBytes(s))
	}
}

// TestMemoryStoreBytesAccounting: invalidation and eviction by MaxEntries
// give the bytes back.
func TestMemoryStoreBytesAccounting(t *testing.T) {
	s, err := NewMemoryStore(&MemoryOptions{MaxEntries: 64, MaxBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c := newCache(t, s, nil)
	sc := scope(t)
	var l loads
	for i := range 500 {
		get(t, c, mustKey(t, sc, "echo", fmt.Sprintf(`{"i":%d}`, i)), l.fixed(strings.Repeat("v", 1000), 0), Policy{TTL: time.Minute, Tags: []string{"all"}})
	}
	if want := int64(s.Len()); heldBytes(s) != want*(1000+memEntryOverhead+int64(len(mustKey(t, sc, "echo", `{"i":0}`).entry))) {
		t.Fatalf("%d bytes held by %d entries", heldBytes(s), want)
	}
	if _, err := c.Invalidate(context.Background(), sc, []string{"all"}); err != nil {
		t.Fatal(err)
	}
	if n := heldBytes(s); n != 0 {
		t.Fatalf("%d bytes held after invalidating everything", n)
	}
}

func TestMemoryStoreMaxBytesOptions(t *testing.T) {
	if _, err := NewMemoryStore(&MemoryOptions{MaxBytes: -1}); err == nil {
		t.Fatal("negative MaxBytes accepted")
	}
	s, err := NewMemoryStore(&MemoryOptions{MaxEntries: 10})
	if err != nil {
		t.Fatal(err)
	}
	if s.shardBytes*memShards != DefaultMaxBytes {
		t.Fatalf("MaxBytes 0: shards hold %d bytes, want DefaultMaxBytes", s.shardBytes*memShards)
	}
}
