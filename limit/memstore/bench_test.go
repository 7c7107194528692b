package memstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// benchRule admits nearly everything it is offered in a benchmark, so the
// admitting path is measured; the sliding window's log holds one entry per
// unit, so its limit is kept small (its denials are measured too).
func benchRule(a limit.Algorithm) limit.Rule {
	r := limit.Rule{Name: string(a), Algorithm: a, Limit: 1_000_000_000, Period: time.Second}
	if a == limit.SlidingWindow {
		r.Limit = 1000
	}
	return r
}

// BenchmarkTake measures single-check Takes from parallel goroutines on one
// key (every goroutine on one lock) and on many keys (spread over shards),
// and a three-rule batch. A concurrency Take is followed by its Release.
func BenchmarkTake(b *testing.B) {
	const nkeys = 1 << 14
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("mcpgate:rl:{tenant-%d}:tenant:per_tenant", i)
	}
	ctx := context.Background()
	for _, a := range limit.Algorithms {
		for _, many := range []bool{false, true} {
			name := a + "/one_key"
			if many {
				name = a + "/many_keys"
			}
			b.Run(string(name), func(b *testing.B) {
				s := newStore(b, nil)
				r := benchRule(a)
				var seq atomic.Uint64
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					i := int(seq.Add(1) * 7919)
					checks := []limit.Check{{Rule: r, Key: keys[0]}}
					for pb.Next() {
						if many {
							i++
							checks[0].Key = keys[i%nkeys]
						}
						d, err := s.Take(ctx, checks, 1)
						if err != nil {
							b.Fatal(err)
						}
						if d.Lease != "" {
							if err := s.Release(ctx, checks, d.Lease); err != nil {
								b.Fatal(err)
							}
						}
					}
				})
			})
		}
	}
	b.Run("batch3/many_keys", func(b *testing.B) {
		s := newStore(b, nil)
		var seq atomic.Uint64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := int(seq.Add(1) * 7919)
			checks := []limit.Check{
				{Rule: benchRule(limit.TokenBucket)},
				{Rule: benchRule(limit.SlidingWindowCounter)},
				{Rule: benchRule(limit.GCRA), Key: "mcpgate:rl:{~g}:global:all"},
			}
			for pb.Next() {
				i++
				checks[0].Key = keys[i%nkeys]
				checks[1].Key = keys[(i+nkeys/2)%nkeys]
				if _, err := s.Take(ctx, checks, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

// BenchmarkTakeFullState measures one Take (and, for concurrency, its
// Release) on a key whose counter already holds n units: n live leases of
// a concurrency rule, or n units in a sliding window's log. Its cost must
// not grow with n beyond the scan of the live leases (no copy of the state
// per call).
func BenchmarkTakeFullState(b *testing.B) {
	ctx := context.Background()
	for _, a := range []limit.Algorithm{limit.Concurrency, limit.SlidingWindow} {
		for _, n := range []int{10, 1000, 10000} {
			b.Run(fmt.Sprintf("%s/n=%d", a, n), func(b *testing.B) {
				s := newStore(b, nil)
				r := limit.Rule{Name: "full", Algorithm: a, Limit: int64(n) + 1000, Period: time.Hour}
				checks := []limit.Check{{Rule: r, Key: "mcpgate:rl:{t}:tenant:full"}}
				for range n {
					if _, err := s.Take(ctx, checks, 1); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					d, err := s.Take(ctx, checks, 1)
					if err != nil || !d.Allowed {
						b.Fatal(d, err)
					}
					if d.Lease != "" {
						if err := s.Release(ctx, checks, d.Lease); err != nil {
							b.Fatal(err)
						}
					} else if err := s.Refund(ctx, checks, 1, ""); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
