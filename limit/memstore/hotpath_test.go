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
)

// settableClock is a Clock that reads whatever it was last set to. Setting
// it back stands in for a reading taken before a lock by a call that got
// the lock after another call which read the clock later.
type settableClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *settableClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *settableClock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// A reading earlier than a time already used under a shard's lock is
// replaced by that time: a stale reading must not reopen a fixed window the
// counter has already left (it would admit a second call in a window of 1).
func TestStaleReadingDoesNotReopenWindow(t *testing.T) {
	for _, batch := range []bool{false, true} {
		clk := &settableClock{t: start}
		s := newStore(t, &Options{Clock: clk, Shards: 1})
		fw := check("fw", limit.FixedWindow, 1, time.Second)
		checks := []limit.Check{fw}
		if batch {
			checks = append(checks, check("tb", limit.TokenBucket, 100, time.Second))
		}
		clk.set(start.Add(time.Second))
		if d := take(t, s, 1, checks...); !d.Allowed {
			t.Fatalf("batch %v: first call of the window denied: %+v", batch, d)
		}
		clk.set(start.Add(time.Second - time.Microsecond))
		if d := take(t, s, 1, checks...); d.Allowed || d.Rule.Name != "fw" {
			t.Errorf("batch %v: a stale reading reopened the previous window: %+v", batch, d)
		}
	}
}

// A rule that differs from the one a counter was last charged under is
// validated again: the error is Rule.Validate's, and nothing is charged.
func TestChangedRuleIsValidated(t *testing.T) {
	s, _ := frozen(t)
	ctx := context.Background()
	ok := check("a", limit.TokenBucket, 10, time.Second)
	if d := take(t, s, 1, ok); d.Remaining != 9 {
		t.Fatalf("first take: %+v", d)
	}
	for _, mutate := range []func(*limit.Rule){
		func(r *limit.Rule) { r.Limit = 0 },
		func(r *limit.Rule) { r.Period = time.Microsecond },
		func(r *limit.Rule) { r.Algorithm = "leaky" },
		func(r *limit.Rule) { r.Burst = -1 },
		func(r *limit.Rule) { r.Name = "" },
	} {
		bad := ok
		mutate(&bad.Rule)
		want := bad.Rule.Validate()
		_, err := s.Take(ctx, []limit.Check{bad}, 1)
		if !errors.Is(err, limit.ErrInvalidRule) || err.Error() != want.Error() {
			t.Errorf("Take(%+v) = %v, want %v", bad.Rule, err, want)
		}
	}
	if d := take(t, s, 1, ok); d.Remaining != 8 {
		t.Fatalf("after refused takes: %+v, want 8 remaining", d)
	}
	// a valid change of rule is taken, and then cached in its turn
	other := ok
	other.Rule.Limit = 20
	if d := take(t, s, 1, other); !d.Allowed || d.Limit != 20 {
		t.Fatalf("changed rule: %+v", d)
	}
}

// Decisions carve their results from a shared slab: the bytes are shared,
// the results are not.
func TestResultsDoNotAlias(t *testing.T) {
	s, _ := frozen(t)
	c := check("a", limit.TokenBucket, 10, time.Second)
	d1 := take(t, s, 1, c)
	d2 := take(t, s, 1, c)
	if cap(d1.Results) != 1 || cap(d2.Results) != 1 {
		t.Fatalf("capacities %d, %d, want 1", cap(d1.Results), cap(d2.Results))
	}
	_ = append(d1.Results, limit.Result{Remaining: -1})
	d1.Results[0].Remaining = -2
	if d2.Results[0].Remaining != 8 {
		t.Fatalf("second decision's result changed: %+v", d2.Results[0])
	}
	b := take(t, s, 1, check("x", limit.GCRA, 10, time.Second), check("y", limit.FixedWindow, 10, time.Second))
	if len(b.Results) != 2 || cap(b.Results) != 2 {
		t.Fatalf("batch results: len %d cap %d", len(b.Results), cap(b.Results))
	}
}

// A decision does not allocate: one slab serves slabSize results.
func TestTakeAllocations(t *testing.T) {
	s := newStore(t, nil)
	ctx := context.Background()
	one := []limit.Check{check("a", limit.TokenBucket, 1_000_000_000, time.Second)}
	batch := []limit.Check{one[0], check("b", limit.GCRA, 1_000_000_000, time.Second), check("c", limit.SlidingWindowCounter, 1_000_000_000, time.Second)}
	for _, checks := range [][]limit.Check{one, batch} {
		const slabs = 50
		runs := slabs * slabSize / len(checks)
		take(t, s, 1, checks...) // the counters exist from here on
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		for range runs {
			if _, err := s.Take(ctx, checks, 1); err != nil {
				t.Fatal(err)
			}
		}
		runtime.ReadMemStats(&m1)
		// a slab per slabSize results, and slack for what the runtime and
		// other goroutines allocate meanwhile (MemStats counts the whole
		// process; the race detector's runtime adds its own): an
		// allocation per take would be runs, many times more
		if n := m1.Mallocs - m0.Mallocs; n > 2*slabs {
			t.Errorf("%d checks: %d allocations in %d takes, want at most %d", len(checks), n, runs, 2*slabs)
		}
	}
}

// decideOne is limit.Combine for one check without a lease.
func TestDecideOneIsCombine(t *testing.T) {
	for _, a := range limit.Algorithms {
		if a == limit.Concurrency {
			continue // takes a lease: never decided by decideOne
		}
		for _, shadow := range []bool{false, true} {
			for _, burst := range []int64{0, 7} {
				for _, res := range []limit.Result{
					{Allowed: true, Remaining: 3, ResetAfter: time.Second},
					{Allowed: false, Remaining: 0, ResetAfter: time.Second, RetryAfter: time.Millisecond},
					{Allowed: false, RetryAfter: limit.Never},
				} {
					ch := limit.Check{Rule: limit.Rule{Name: "r", Algorithm: a, Limit: 5, Burst: burst, Period: time.Second, Shadow: shadow}, Key: "k"}
					var got limit.Decision
					decideOne(&got, &ch, []limit.Result{res})
					want := limit.Combine([]limit.Check{ch}, []limit.Result{res}, "")
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Errorf("%s shadow %v burst %d %+v:\n got %+v\nwant %+v", a, shadow, burst, res, got, want)
					}
				}
			}
		}
	}
}

// A counter holding many units is updated in place: a Take on a key with
// 1 000 live leases, or 1 000 units in a sliding window's log, allocates
// no copy of them (it did: 109 KB in 13 allocations per concurrency Take,
// 12 KB in one per sliding window Take). A concurrency Take allocates its
// lease id only.
func TestFullStateNotCopied(t *testing.T) {
	ctx := context.Background()
	for _, a := range []limit.Algorithm{limit.Concurrency, limit.SlidingWindow} {
		t.Run(string(a), func(t *testing.T) {
			s := newStore(t, nil)
			checks := []limit.Check{{Rule: limit.Rule{Name: "full", Algorithm: a, Limit: 2000, Period: time.Hour}, Key: "mcpgate:rl:{t}:tenant:full"}}
			for range 1000 {
				if _, err := s.Take(ctx, checks, 1); err != nil {
					t.Fatal(err)
				}
			}
			var err error
			allocs := testing.AllocsPerRun(50, func() {
				var d limit.Decision
				if d, err = s.Take(ctx, checks, 1); err != nil || !d.Allowed {
					err = fmt.Errorf("take: %+v, %v", d, err)
					return
				}
				if d.Lease != "" {
					err = s.Release(ctx, checks, d.Lease)
				} else {
					err = s.Refund(ctx, checks, 1, "")
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			want := 0.0
			if a == limit.Concurrency {
				want = 1 // the lease id
			}
			if allocs > want {
				t.Errorf("%v allocations per Take and its undo on a counter of 1 000 units; want at most %v", allocs, want)
			}
		})
	}
}
