package memstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/limittest"
)

// start is a wall time aligned to every period used in these tests.
var start = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func newStore(t testing.TB, opts *Options) *Store {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// frozen returns a store on a fake clock that moves only when told to.
func frozen(t testing.TB) (*Store, *limittest.FakeClock) {
	clk := limittest.NewFakeClock(start)
	return newStore(t, &Options{Clock: clk}), clk
}

func check(name string, a limit.Algorithm, l int64, p time.Duration) limit.Check {
	return limit.Check{Rule: limit.Rule{Name: name, Algorithm: a, Limit: l, Period: p}, Key: "k:" + name}
}

func take(t testing.TB, s *Store, cost int64, checks ...limit.Check) limit.Decision {
	t.Helper()
	d, err := s.Take(context.Background(), checks, cost)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestNewOptions(t *testing.T) {
	for _, o := range []*Options{{Shards: -1}, {Shards: MaxShards + 1}, {SweepInterval: -time.Second}} {
		if _, err := New(o); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("New(%+v) = %v, want ErrInvalidOptions", o, err)
		}
	}
	s := newStore(t, nil)
	if len(s.c.shards) != DefaultShards {
		t.Fatalf("%d shards, want %d", len(s.c.shards), DefaultShards)
	}
	one := newStore(t, &Options{Shards: 1, SweepInterval: time.Hour})
	if d := take(t, one, 1, check("a", limit.GCRA, 1, time.Second)); !d.Allowed {
		t.Fatalf("one shard: %+v", d)
	}
}

func TestValidation(t *testing.T) {
	s, _ := frozen(t)
	ctx := context.Background()
	ok := check("a", limit.FixedWindow, 1, time.Second)
	bad := ok
	bad.Rule.Limit = 0
	noKey := ok
	noKey.Key = ""
	dup := check("b", limit.TokenBucket, 1, time.Second)
	dup.Key = ok.Key
	many := make([]limit.Check, 20)
	for i := range many {
		many[i] = check(fmt.Sprint("m", i), limit.FixedWindow, 1, time.Second)
	}
	many[19].Key = many[3].Key
	for _, tc := range []struct {
		checks []limit.Check
		cost   int64
		want   []error
	}{
		{nil, 1, []error{limit.ErrNoChecks}},
		{[]limit.Check{ok}, 0, []error{limit.ErrInvalidCost}},
		{[]limit.Check{ok, bad}, 1, []error{limit.ErrInvalidRule}},
		{[]limit.Check{noKey}, 1, []error{limit.ErrInvalidRule}},
		{[]limit.Check{ok, dup}, 1, []error{ErrDuplicateKey, limit.ErrInvalidRule}},
		{many, 1, []error{ErrDuplicateKey}},
	} {
		_, err := s.Take(ctx, tc.checks, tc.cost)
		rerr := s.Refund(ctx, tc.checks, tc.cost, "")
		for _, w := range tc.want {
			if !errors.Is(err, w) || !errors.Is(rerr, w) {
				t.Errorf("Take/Refund(%d checks, cost %d) = %v / %v, want %v", len(tc.checks), tc.cost, err, rerr, w)
			}
		}
	}
	if err := s.Release(ctx, []limit.Check{ok, dup}, "x"); !errors.Is(err, ErrDuplicateKey) {
		t.Errorf("Release with a duplicate key = %v", err)
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("rejected batches left %d counters", n)
	}
}

func TestContextCanceled(t *testing.T) {
	s, _ := frozen(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c := check("a", limit.FixedWindow, 1, time.Second)
	if _, err := s.Take(ctx, []limit.Check{c}, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Take = %v", err)
	}
	if err := s.Refund(ctx, []limit.Check{c}, 1, ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("Refund = %v", err)
	}
	if err := s.Release(ctx, []limit.Check{c}, "x"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release = %v", err)
	}
	if s.Len() != 0 || !take(t, s, 1, c).Allowed {
		t.Fatal("a canceled Take charged the counter")
	}
}

// TestAllOrNothing: when one enforced rule denies, no rule is charged.
func TestAllOrNothing(t *testing.T) {
	s, _ := frozen(t)
	wide := check("wide", limit.FixedWindow, 5, time.Minute)
	narrow := check("narrow", limit.SlidingWindow, 2, time.Minute)
	slots := check("slots", limit.Concurrency, 10, time.Minute)
	for i := range 2 {
		if d := take(t, s, 1, wide, narrow, slots); !d.Allowed || d.Lease == "" {
			t.Fatalf("take %d: %+v", i, d)
		}
	}
	for range 3 {
		d := take(t, s, 1, wide, narrow, slots)
		if d.Allowed || d.Rule.Name != "narrow" || d.Lease != "" || d.RetryAfter != time.Minute {
			t.Fatalf("third take: %+v", d)
		}
		if d.Results[0].Remaining != 5-2-1 || d.Results[2].Remaining != 10-2-1 {
			t.Fatalf("other rules' results: %+v", d.Results)
		}
	}
	// wide and slots were charged twice only: 3 units and 8 slots are left
	if d := take(t, s, 3, wide); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("wide after denials: %+v", d)
	}
	for i := range 8 {
		if d := take(t, s, 1, slots); !d.Allowed {
			t.Fatalf("slot %d after denials: %+v", i, d)
		}
	}
	if d := take(t, s, 1, slots); d.Allowed {
		t.Fatalf("slots: more than 10 in flight: %+v", d)
	}
}

func TestShadow(t *testing.T) {
	s, _ := frozen(t)
	enforced := check("enforced", limit.FixedWindow, 100, time.Minute)
	shadow := check("shadow", limit.TokenBucket, 10, time.Minute)
	shadow.Rule.Shadow = true
	take(t, s, 8, shadow)

	// The shadow rule would deny: reported, not enforced, not charged.
	d := take(t, s, 5, enforced, shadow)
	if !d.Allowed || d.Rule.Name != "enforced" || d.Remaining != 95 {
		t.Fatalf("shadow denial enforced: %+v", d)
	}
	if r := d.Results[1]; r.Allowed || r.Remaining != 2 || r.RetryAfter <= 0 {
		t.Fatalf("shadow result: %+v", r)
	}
	// The enforced rule denies: the allowing shadow rule is not charged.
	take(t, s, 94, enforced)
	if d := take(t, s, 2, enforced, shadow); d.Allowed || !d.Results[1].Allowed {
		t.Fatalf("enforced denial: %+v", d)
	}
	if d := take(t, s, 2, shadow); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("shadow was charged: %+v", d)
	}
	// Both allow: both are charged.
	s2, _ := frozen(t)
	take(t, s2, 4, enforced, shadow)
	if d := take(t, s2, 1, enforced, shadow); d.Results[0].Remaining != 95 || d.Results[1].Remaining != 5 {
		t.Fatalf("both allowing: %+v", d.Results)
	}
	// Only shadow rules: always admitted, reporting the most restrictive.
	if d := take(t, s, 20, shadow); !d.Allowed || d.Results[0].Allowed || d.RetryAfter != 0 {
		t.Fatalf("shadow only: %+v", d)
	}
}

func TestEpochAlignment(t *testing.T) {
	clk := limittest.NewFakeClock(time.Date(2024, 5, 1, 10, 0, 42, 500_000_000, time.UTC))
	s := newStore(t, &Options{Clock: clk})
	d := take(t, s, 1, check("m", limit.FixedWindow, 1, time.Minute), check("h", limit.FixedWindow, 1, time.Hour))
	if r := d.Results; r[0].ResetAfter != 17500*time.Millisecond || r[1].ResetAfter != 59*time.Minute+17500*time.Millisecond {
		t.Fatalf("windows not aligned to wall-clock minutes and hours: %+v", r)
	}
}

// TestFakeClockRefill: the retry times a store reports are exact on its clock.
func TestFakeClockRefill(t *testing.T) {
	for _, a := range []limit.Algorithm{limit.TokenBucket, limit.GCRA} {
		t.Run(string(a), func(t *testing.T) {
			s, clk := frozen(t)
			c := check("r", a, 10, time.Second) // one every 100ms, 10 at once
			for i := range 10 {
				if d := take(t, s, 1, c); !d.Allowed || d.Remaining != int64(9-i) {
					t.Fatalf("burst %d: %+v", i, d)
				}
			}
			d := take(t, s, 1, c)
			if d.Allowed || d.RetryAfter != 100*time.Millisecond || d.ResetAfter != time.Second {
				t.Fatalf("empty: %+v", d)
			}
			clk.Advance(d.RetryAfter - time.Microsecond)
			if d := take(t, s, 1, c); d.Allowed || d.RetryAfter != time.Microsecond {
				t.Fatalf("1µs early: %+v", d)
			}
			clk.Advance(time.Microsecond)
			if d := take(t, s, 1, c); !d.Allowed {
				t.Fatalf("on time: %+v", d)
			}
			clk.Advance(350 * time.Millisecond)
			if d := take(t, s, 3, c); !d.Allowed || d.Remaining != 0 {
				t.Fatalf("after 350ms: %+v", d)
			}
			if d := take(t, s, 11, c); d.Allowed || d.RetryAfter != limit.Never {
				t.Fatalf("cost above burst: %+v", d)
			}
		})
	}
}

func TestRealClock(t *testing.T) {
	s := newStore(t, nil)
	c := check("fast", limit.SlidingWindow, 1, time.Millisecond)
	if d := take(t, s, 1, c); !d.Allowed {
		t.Fatalf("first: %+v", d)
	}
	d := take(t, s, 1, c)
	if d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > time.Millisecond {
		t.Fatalf("second: %+v", d)
	}
	time.Sleep(d.RetryAfter)
	if d := take(t, s, 1, c); !d.Allowed {
		t.Fatalf("after the retry time: %+v", d)
	}
	ttl, ok := s.TTL(c.Key)
	if !ok || ttl <= 0 || ttl > time.Millisecond {
		t.Fatalf("TTL = %v, %v", ttl, ok)
	}
}

func TestLeases(t *testing.T) {
	s, clk := frozen(t)
	ctx := context.Background()
	slots := check("slots", limit.Concurrency, 2, time.Minute)
	plain := check("plain", limit.FixedWindow, 100, time.Minute)
	d1, d2 := take(t, s, 1, slots, plain), take(t, s, 5, slots)
	if d1.Lease == "" || d2.Lease == "" || d1.Lease == d2.Lease {
		t.Fatalf("leases %q and %q", d1.Lease, d2.Lease)
	}
	if d := take(t, s, 1, plain); d.Lease != "" {
		t.Fatalf("lease without a concurrency rule: %q", d.Lease)
	}
	d3 := take(t, s, 1, slots)
	if d3.Allowed || d3.Lease != "" || d3.RetryAfter != limit.ConcurrencyRetryHint {
		t.Fatalf("third call: %+v", d3)
	}
	for range 2 { // releasing twice is harmless
		if err := s.Release(ctx, []limit.Check{slots, plain}, d1.Lease); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{"", "unknown"} {
		if err := s.Release(ctx, []limit.Check{slots}, l); err != nil {
			t.Fatal(err)
		}
	}
	if d := take(t, s, 1, plain); d.Remaining != 97 {
		t.Fatalf("release touched a fixed window: %+v", d)
	}
	d4 := take(t, s, 1, slots)
	if !d4.Allowed || take(t, s, 1, slots).Allowed {
		t.Fatalf("after release: %+v", d4)
	}
	// A refund frees the slot too.
	if err := s.Refund(ctx, []limit.Check{slots}, 1, d4.Lease); err != nil {
		t.Fatal(err)
	}
	d5 := take(t, s, 1, slots)
	if !d5.Allowed {
		t.Fatalf("after refund: %+v", d5)
	}
	// Leases of dead holders free themselves after Period.
	clk.Advance(time.Minute - time.Microsecond)
	if take(t, s, 1, slots).Allowed {
		t.Fatal("admitted before a lease expired")
	}
	clk.Advance(time.Microsecond)
	if d := take(t, s, 1, slots); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("expired leases not freed: %+v", d)
	}
	// Releasing the last lease drops the counter.
	s2, _ := frozen(t)
	d := take(t, s2, 1, slots)
	if s2.Len() != 1 {
		t.Fatalf("Len = %d", s2.Len())
	}
	if err := s2.Release(ctx, []limit.Check{slots}, d.Lease); err != nil {
		t.Fatal(err)
	}
	if s2.Len() != 0 {
		t.Fatalf("Len after releasing every lease = %d", s2.Len())
	}
}

func TestRefund(t *testing.T) {
	s, _ := frozen(t)
	ctx := context.Background()
	tenant := check("tenant", limit.SlidingWindowCounter, 10, time.Minute)
	global := check("global", limit.GCRA, 2, time.Minute)
	take(t, s, 2, global)
	// The flow of the gateway: tenant rules admit, a global rule denies,
	// the tenant charge is given back.
	if d := take(t, s, 4, tenant); !d.Allowed || d.Remaining != 6 {
		t.Fatalf("tenant: %+v", d)
	}
	if d := take(t, s, 4, global); d.Allowed {
		t.Fatalf("global: %+v", d)
	}
	if err := s.Refund(ctx, []limit.Check{tenant}, 4, ""); err != nil {
		t.Fatal(err)
	}
	if d := take(t, s, 10, tenant); !d.Allowed {
		t.Fatalf("refund did not give back: %+v", d)
	}
	// A refund on a key the store does not hold creates nothing.
	if err := s.Refund(ctx, []limit.Check{check("none", limit.TokenBucket, 1, time.Second)}, 1, ""); err != nil {
		t.Fatal(err)
	}
	if keys := s.Keys(); len(keys) != 2 {
		t.Fatalf("keys %v", keys)
	}
}

func TestSweep(t *testing.T) {
	clk := limittest.NewFakeClock(start)
	s := newStore(t, &Options{Clock: clk, Shards: 2})
	const n = 2 * 3 * shrinkMin
	for i := range n {
		take(t, s, 1, limit.Check{Rule: check("r", limit.FixedWindow, 5, time.Second).Rule, Key: fmt.Sprint("k", i)})
	}
	long := check("long", limit.GCRA, 1, time.Hour)
	take(t, s, 1, long)
	if s.Len() != n+1 || len(s.Keys()) != n+1 {
		t.Fatalf("Len %d, %d keys", s.Len(), len(s.Keys()))
	}
	if ttl, ok := s.TTL("k7"); !ok || ttl != time.Second {
		t.Fatalf("TTL = %v, %v", ttl, ok)
	}
	clk.Advance(time.Second - time.Microsecond)
	s.Sweep()
	if s.Len() != n+1 {
		t.Fatalf("swept live counters: Len %d", s.Len())
	}
	clk.Advance(time.Microsecond)
	if _, ok := s.TTL("k7"); ok {
		t.Fatal("TTL of an expired counter")
	}
	s.Sweep()
	if s.Len() != 1 || s.Keys()[0] != long.Key {
		t.Fatalf("after sweep: Len %d, keys %v", s.Len(), s.Keys())
	}
	// Go maps never shrink: the sweep rebuilt the emptied ones.
	for i := range s.c.shards {
		if p := s.c.shards[i].peak; p > 1 {
			t.Fatalf("shard %d keeps a map sized for %d", i, p)
		}
	}
	if ttl, ok := s.TTL(long.Key); !ok || ttl != time.Hour-time.Second {
		t.Fatalf("TTL(long) = %v, %v", ttl, ok)
	}
}

func TestDropOnAccess(t *testing.T) {
	s, clk := frozen(t)
	c := check("a", limit.FixedWindow, 1, time.Second)
	take(t, s, 1, c)
	clk.Advance(time.Second)
	// An expired counter touched by a request that charges nothing is gone.
	if d := take(t, s, 2, c); d.Allowed || d.RetryAfter != limit.Never {
		t.Fatalf("%+v", d)
	}
	if s.Len() != 0 {
		t.Fatalf("Len %d after touching an expired counter", s.Len())
	}
	take(t, s, 1, c)
	clk.Advance(time.Second)
	if d := take(t, s, 1, c, check("b", limit.SlidingWindow, 1, time.Second)); !d.Allowed || s.Len() != 2 {
		t.Fatalf("expired counter not reused: %+v, Len %d", d, s.Len())
	}
}

func TestBackgroundSweep(t *testing.T) {
	clk := limittest.NewFakeClock(start)
	s := newStore(t, &Options{Clock: clk, SweepInterval: time.Millisecond})
	take(t, s, 1, check("a", limit.TokenBucket, 1, time.Second))
	clk.Advance(time.Second)
	for deadline := time.Now().Add(5 * time.Second); s.Len() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the background sweeper did not drop the expired counter")
		}
	}
}

func TestClose(t *testing.T) {
	s, _ := frozen(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if d := take(t, s, 1, check("a", limit.FixedWindow, 1, time.Second)); !d.Allowed {
		t.Fatalf("Take after Close: %+v", d)
	}
	// A store nobody closes still stops its sweeper once unreachable.
	s2, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	done := s2.c.done
	s2 = nil
	for range 100 {
		runtime.GC()
		select {
		case <-done:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatal("the sweeper of an unreachable store still runs")
}

func TestFakeClock(t *testing.T) {
	c := limittest.NewFakeClock(start)
	if !c.Now().Equal(start) {
		t.Fatalf("Now() = %v", c.Now())
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				c.Advance(time.Microsecond)
				_ = c.Now()
			}
		})
	}
	wg.Wait()
	if got, want := c.Now(), start.Add(8*time.Millisecond); !got.Equal(want) {
		t.Fatalf("after concurrent advances Now() = %v, want %v", got, want)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Advance(-1) did not panic")
		}
	}()
	c.Advance(-1)
}

// Op markers are bounded per shard: a store that meters every call keeps a
// bounded number of them, however many calls it decides within their TTL.
func TestOpMarkersBounded(t *testing.T) {
	s, err := New(&Options{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := limit.Meter{Key: "mcpgate:usage:{bounded}:2026-12", Tenant: "bounded", Period: "2026-12",
		ExpireAt: time.Now().Add(time.Hour), Seeded: true}
	for range 5 * maxOpsPerShard {
		m.Op = limit.NewOp()
		if _, _, err := s.TakeMetered(t.Context(), nil, m, 1); err != nil {
			t.Fatal(err)
		}
	}
	sh := &s.c.shards[0]
	sh.mu.Lock()
	n := len(sh.ops)
	sh.mu.Unlock()
	if n > maxOpsPerShard {
		t.Fatalf("%d op markers in one shard, bound %d", n, maxOpsPerShard)
	}
}
