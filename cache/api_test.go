package cache

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestNewValidates(t *testing.T) {
	mem, _ := NewMemoryStore(nil)
	for _, o := range []*Options{
		{LockTTL: -1}, {LoadTimeout: -time.Second}, {WaitTimeout: -1}, {Timeout: -1}, {PollInterval: -1},
		{WarmConcurrency: -1},
	} {
		if _, err := New(mem, o); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("New(%+v) = %v, want ErrInvalidOptions", o, err)
		}
	}
	if _, err := New(nil, nil); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("New(nil store) = %v", err)
	}
	c, err := New(mem, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.lockTTL != DefaultLockTTL || c.loadTimeout != DefaultLockTTL || c.wait != DefaultLockTTL ||
		c.stale != DefaultStaleWindow || c.timeout != DefaultTimeout || c.beta != DefaultBeta || c.warmN != DefaultWarmConcurrency {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if _, err := NewRedisStore(nil, nil); err == nil {
		t.Fatal("NewRedisStore(nil, nil) accepted")
	}
}

func TestGetValidates(t *testing.T) {
	mem, _ := NewMemoryStore(nil)
	c := newCache(t, mem, nil)
	var l loads
	k := mustKey(t, Tenant("t"), "search", `{}`)
	ctx := context.Background()
	if _, _, err := c.Get(ctx, Key{}, l.fixed("v", 0), minute); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("zero Key: %v", err)
	}
	if _, _, err := c.Get(ctx, k, nil, minute); !errors.Is(err, ErrInvalidPolicy) {
		t.Errorf("nil loader: %v", err)
	}
	for _, p := range []Policy{{}, {TTL: -1}, {TTL: time.Second, Jitter: 1.5}, {TTL: time.Second, Jitter: -0.1},
		{TTL: time.Second, NegativeTTL: -1}, {TTL: time.Second, LoadTimeout: -1}} {
		if _, _, err := c.Get(ctx, k, l.fixed("v", 0), p); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("policy %+v: %v", p, err)
		}
	}
	if l.count() != 0 {
		t.Fatal("an invalid Get called its loader")
	}
	c.Close()
	if _, _, err := c.Get(ctx, k, l.fixed("v", 0), minute); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close: %v", err)
	}
}

func TestJitter(t *testing.T) {
	mem, _ := NewMemoryStore(nil)
	c := newCache(t, mem, nil)
	pol := Policy{TTL: 10 * time.Second, Jitter: 0.1}
	lo, hi := pol.TTL, time.Duration(0)
	for range 1000 {
		r := c.newRecord(nil, false, 1, 0, Key{}, pol)
		ttl := r.fresh()
		if ttl < 9*time.Second || ttl > 10*time.Second {
			t.Fatalf("jittered TTL %v outside [9s, 10s]", ttl)
		}
		lo, hi = min(lo, ttl), max(hi, ttl)
	}
	if hi-lo < 500*time.Millisecond {
		t.Fatalf("TTLs spread over [%v, %v] only: no jitter", lo, hi)
	}
	if r := c.newRecord(nil, true, 1, 0, Key{}, Policy{TTL: time.Hour, NegativeTTL: time.Second}); r.fresh() != time.Second || r.stale != 0 {
		t.Fatalf("negative record: fresh %v, stale %v", r.fresh(), r.stale)
	}
}

func TestSourceString(t *testing.T) {
	for s, want := range map[Source]string{Miss: "miss", Hit: "hit", Stale: "stale", Coalesced: "coalesced", 0: "Source(0)"} {
		if s.String() != want {
			t.Errorf("%d.String() = %q, want %q", s, s.String(), want)
		}
	}
}

func TestKey(t *testing.T) {
	k := mustKey(t, Tenant("acme"), "search", `{"q":1.0}`)
	if k.Tool() != "search" || k.Scope() != Tenant("acme") || len(k.ArgsHash()) != 64 || k.IsZero() {
		t.Fatalf("key %+v", k)
	}
	if !strings.HasPrefix(k.String(), "mcpgate:cache:{acme:search:") {
		t.Fatalf("key string %q", k)
	}
	if k != NewKeyCanonical(Tenant("acme"), "search", []byte(`{"q":1}`)) {
		t.Fatal("NewKeyCanonical differs from NewKey")
	}
	if mustKey(t, Tenant("a"), "t", `{}`) == mustKey(t, Shared(), "t", `{}`) {
		t.Fatal("tenant and shared keys equal")
	}
	if _, err := NewKey(Tenant("a"), "t", []byte(`{"a":`)); !errors.Is(err, ErrInvalidArguments) {
		t.Fatalf("invalid JSON: %v", err)
	}
	if !(Key{}).IsZero() {
		t.Fatal("zero Key not IsZero")
	}
}

// TestRefreshKeepsPositive checks that an early refresh whose load returns
// a negative result leaves the fresh positive value in place.
func TestRefreshKeepsPositive(t *testing.T) {
	mem, _ := NewMemoryStore(nil)
	c := newCache(t, mem, &Options{Beta: 1e12}) // refresh on every hit
	k := mustKey(t, Tenant("t"), "search", `{}`)
	var l loads
	pol := Policy{TTL: time.Minute, NegativeTTL: time.Minute}
	get(t, c, k, l.fixed("good", 0), pol)
	negative := func(context.Context) ([]byte, bool, error) { return []byte("err"), true, nil }
	if v, src := get(t, c, k, negative, pol); v != "good" || src != Hit {
		t.Fatalf("%q %v", v, src)
	}
	c.Close() // waits for the refresh
	if st := c.Stats(); st.Refreshes != 1 {
		t.Fatalf("refreshes %d, want 1", st.Refreshes)
	}
	c2 := newCache(t, mem, &Options{Beta: -1})
	e, src, err := c2.Get(context.Background(), k, negative, pol)
	if err != nil || src != Hit || e.Negative || string(e.Value) != "good" {
		t.Fatalf("after a negative refresh: %+v %v %v", e, src, err)
	}
}

// Only an early refresh's Loader is told it runs as one (Refreshing): a
// miss's and a warm-up's load run for callers that wait for them.
func TestRefreshingMarksOnlyEarlyRefreshes(t *testing.T) {
	mem, _ := NewMemoryStore(nil)
	c := newCache(t, mem, &Options{Beta: 1e12}) // refresh on every hit
	pol := Policy{TTL: time.Minute}
	marked := make(chan bool, 3)
	load := func(ctx context.Context) ([]byte, bool, error) {
		marked <- Refreshing(ctx)
		return []byte("v"), false, nil
	}
	k := mustKey(t, Tenant("t"), "search", `{}`)
	if _, src := get(t, c, k, load, pol); src != Miss {
		t.Fatalf("first Get: %v, want a miss", src)
	}
	if _, src := get(t, c, k, load, pol); src != Hit {
		t.Fatalf("second Get: %v, want a hit", src)
	}
	w := mustKey(t, Tenant("t"), "search", `{"q":1}`)
	if _, err := c.Warm(context.Background(), []WarmItem{{Key: w, Policy: pol, Load: load}}); err != nil {
		t.Fatal(err)
	}
	c.Close() // waits for the refresh
	close(marked)
	var got []bool
	for m := range marked {
		got = append(got, m)
	}
	// The refresh may end before or after the warm-up's load.
	if len(got) != 3 || got[0] || (got[1] == got[2]) {
		t.Fatalf("Refreshing in the miss's, then the refresh's and the warm-up's loads (in either order): %v", got)
	}
	if Refreshing(context.Background()) {
		t.Fatal("Refreshing(Background) = true")
	}
}
