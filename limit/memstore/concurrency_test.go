package memstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/internal/algo"
	"github.com/mcpgate/mcpgate/limit/limittest"
)

const workers = 64

// hammer runs f from workers goroutines, attempts times each.
func hammer(attempts int, f func(worker, i int)) {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range attempts {
				f(w, i)
			}
		})
	}
	wg.Wait()
}

// TestExactAdmission: 64 goroutines make far more attempts than the limit;
// exactly the limit is admitted, each admission seeing the one before.
func TestExactAdmission(t *testing.T) {
	const limitN = 50
	for _, a := range limit.Algorithms {
		for _, cost := range []int64{1, 3} {
			t.Run(fmt.Sprintf("%s/cost%d", a, cost), func(t *testing.T) {
				s, _ := frozen(t)
				c := check("r", a, limitN, time.Minute)
				want := int64(limitN / cost)
				if a == limit.Concurrency {
					want = limitN // a call takes one slot whatever its cost
				}
				var mu sync.Mutex
				var remaining []int64
				var denied atomic.Int64
				hammer(20, func(int, int) {
					d, err := s.Take(context.Background(), []limit.Check{c}, cost)
					if err != nil {
						t.Error(err)
						return
					}
					if !d.Allowed {
						denied.Add(1)
						return
					}
					mu.Lock()
					remaining = append(remaining, d.Remaining)
					mu.Unlock()
				})
				if int64(len(remaining)) != want || denied.Load() != workers*20-want {
					t.Fatalf("%d admitted, %d denied; want %d admitted", len(remaining), denied.Load(), want)
				}
				// Each admission saw the state the previous one left.
				slices.Sort(remaining)
				for i, r := range remaining {
					per := cost
					if a == limit.Concurrency {
						per = 1
					}
					if w := limitN - want*per + int64(i)*per; r != w {
						t.Fatalf("remaining values %v: not one per admission", remaining)
					}
				}
			})
		}
	}
}

// TestExactAdmissionBatch: all-or-nothing holds under contention. The
// narrow rule admits 30; the wide rule and the shadow rule are charged for
// exactly those 30 requests, never for the denied ones.
func TestExactAdmissionBatch(t *testing.T) {
	s := newStore(t, &Options{Clock: limittest.NewFakeClock(start), Shards: 4})
	narrow := check("narrow", limit.FixedWindow, 30, time.Minute)
	wide := check("wide", limit.TokenBucket, 100, time.Minute)
	slots := check("slots", limit.Concurrency, 1000, time.Minute)
	shadow := check("shadow", limit.SlidingWindow, 40, time.Minute)
	shadow.Rule.Shadow = true
	var admitted atomic.Int64
	leases := sync.Map{}
	hammer(10, func(w, i int) {
		batch := []limit.Check{wide, narrow, slots, shadow}
		rand.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
		d, err := s.Take(context.Background(), batch, 1)
		if err != nil {
			t.Error(err)
			return
		}
		if d.Allowed {
			admitted.Add(1)
			if _, dup := leases.LoadOrStore(d.Lease, true); dup || d.Lease == "" {
				t.Errorf("lease %q reused or empty", d.Lease)
			}
		}
	})
	if admitted.Load() != 30 {
		t.Fatalf("%d admitted, want 30", admitted.Load())
	}
	for _, tc := range []struct {
		c    limit.Check
		left int64
	}{{wide, 70}, {slots, 970}, {shadow, 10}} {
		c := tc.c
		c.Rule.Shadow = false
		if d := take(t, s, 1, c); !d.Allowed || d.Remaining != tc.left-1 {
			t.Errorf("%s after the race: %+v, want %d left", c.Rule.Name, d, tc.left)
		}
	}
}

// TestNoDeadlock: batches over overlapping shards, in every key order, with
// refunds and releases in between, all complete.
func TestNoDeadlock(t *testing.T) {
	s := newStore(t, &Options{Shards: 4})
	var keys []limit.Check
	for i := range 16 {
		c := check(fmt.Sprint("r", i), limit.Algorithms[i%len(limit.Algorithms)], 1000, time.Second)
		keys = append(keys, c)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx := context.Background()
		hammer(200, func(w, i int) {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(i)))
			batch := make([]limit.Check, 1+rng.IntN(5))
			for j, k := range rng.Perm(len(keys))[:len(batch)] {
				batch[j] = keys[k]
			}
			d, err := s.Take(ctx, batch, 1)
			if err != nil {
				t.Error(err)
				return
			}
			if d.Allowed && rng.IntN(2) == 0 {
				err = s.Refund(ctx, batch, 1, d.Lease)
			} else {
				err = s.Release(ctx, batch, d.Lease)
			}
			if err != nil {
				t.Error(err)
			}
			if rng.IntN(50) == 0 {
				s.Sweep()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("deadlock: batches did not complete")
	}
}

// reference is the store written the plainest way: one map, never dropping
// a counter, evaluating a batch as the store's documentation says.
type reference struct {
	states map[string]*algo.State
}

func (r *reference) state(key string) *algo.State {
	st := r.states[key]
	if st == nil {
		st = new(algo.State)
		r.states[key] = st
	}
	return st
}

func (r *reference) take(checks []limit.Check, now, cost int64, lease string) (limit.Decision, bool) {
	results := make([]limit.Result, len(checks))
	admit, leased := true, false
	for i, c := range checks {
		results[i] = algo.Eval(c.Rule, r.state(c.Key), now, cost, "", false)
		admit = admit && (results[i].Allowed || c.Rule.Shadow)
		leased = leased || (c.Rule.Algorithm == limit.Concurrency && results[i].Allowed)
	}
	if !admit {
		return limit.Combine(checks, results, ""), false
	}
	for i, c := range checks {
		if results[i].Allowed {
			algo.Eval(c.Rule, r.state(c.Key), now, cost, lease, true)
		}
	}
	if !leased {
		lease = ""
	}
	return limit.Combine(checks, results, lease), leased
}

// TestMatchesReference drives the store and the reference through the same
// random requests, refunds, releases, sweeps and clock steps: dropping
// expired counters (on access and by Sweep) must never change a decision.
func TestMatchesReference(t *testing.T) {
	clk := limittest.NewFakeClock(start)
	s := newStore(t, &Options{Clock: clk, Shards: 3})
	ref := &reference{states: map[string]*algo.State{}}
	pool := []limit.Check{
		check("fw", limit.FixedWindow, 5, 100*time.Millisecond),
		check("sw", limit.SlidingWindow, 4, 70*time.Millisecond),
		check("swc", limit.SlidingWindowCounter, 6, 50*time.Millisecond),
		check("tb", limit.TokenBucket, 5, 100*time.Millisecond),
		check("gcra", limit.GCRA, 10, time.Second),
		check("conc", limit.Concurrency, 2, 200*time.Millisecond),
		check("shadow", limit.SlidingWindowCounter, 3, 30*time.Millisecond),
	}
	pool[3].Rule.Burst = 3
	pool[4].Rule.Burst = 4
	pool[6].Rule.Shadow = true
	now := func() int64 { return clk.Now().Sub(Epoch).Microseconds() }
	ctx := context.Background()
	type taken struct {
		checks []limit.Check
		cost   int64
		lease  string
	}
	var held []taken
	rng := rand.New(rand.NewPCG(7, 7))
	admitted := 0
	for i := range 20000 {
		switch x := rng.IntN(20); {
		case x < 8:
			clk.Advance(time.Duration(rng.IntN(40_000)) * time.Microsecond)
		case x == 8:
			s.Sweep()
		case x == 9 && len(held) > 0:
			h := held[rng.IntN(len(held))]
			if err := s.Release(ctx, h.checks, h.lease); err != nil {
				t.Fatal(err)
			}
			for _, c := range h.checks {
				algo.Release(c.Rule, ref.state(c.Key), h.lease)
			}
		case x == 10 && len(held) > 0:
			j := rng.IntN(len(held))
			h := held[j]
			held = slices.Delete(held, j, j+1)
			if err := s.Refund(ctx, h.checks, h.cost, h.lease); err != nil {
				t.Fatal(err)
			}
			for _, c := range h.checks {
				algo.Refund(c.Rule, ref.state(c.Key), now(), h.cost, h.lease)
			}
		}
		batch := make([]limit.Check, 1+rng.IntN(3))
		for j, k := range rng.Perm(len(pool))[:len(batch)] {
			batch[j] = pool[k]
		}
		cost := 1 + rng.Int64N(4)
		got, err := s.Take(ctx, batch, cost)
		if err != nil {
			t.Fatal(err)
		}
		want, leased := ref.take(batch, now(), cost, got.Lease)
		if leased != (got.Lease != "") || !reflect.DeepEqual(got, want) {
			t.Fatalf("request %d: store %+v\nreference %+v", i, got, want)
		}
		if got.Allowed {
			admitted++
			held = append(held, taken{batch, cost, got.Lease})
		}
	}
	if admitted < 2000 || admitted > 18000 {
		t.Fatalf("%d of 20000 admitted: the sequence tests little", admitted)
	}
}
