package redisstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
)

// BenchmarkTake measures decisions per second against one local
// redis-server, with 16 callers per CPU sharing one client (rueidis
// pipelines their calls). Each caller is its own tenant. The peer is a bare
// PING through the same client: the round trip every Take pays, so the
// ratio take/ping is the cost of the script itself.
func BenchmarkTake(b *testing.B) {
	r := testenv.StartRedis(b, nil)
	c := r.Client(b)
	s := newStore(b, c, 10*time.Second)
	ctx := context.Background()
	const p = 100 * time.Millisecond // keeps sliding-window logs short
	big := int64(1_000_000_000)      // every call allowed: the charging path
	tb := rule("tb", limit.TokenBucket, big, p)
	for _, bc := range []struct {
		name  string
		rules []limit.Rule
	}{
		{"token_bucket", []limit.Rule{tb}},
		{"gcra", []limit.Rule{rule("gc", limit.GCRA, big, p)}},
		{"sliding_window", []limit.Rule{rule("sw", limit.SlidingWindow, limit.MaxSlidingWindowLimit, p)}},
		{"tenant_batch_3", []limit.Rule{rule("fw", limit.FixedWindow, big, p), rule("swc", limit.SlidingWindowCounter, big, p), tb}},
		{"concurrency_and_release", []limit.Rule{rule("cc", limit.Concurrency, big, p)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var id atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(16)
			b.RunParallel(func(pb *testing.PB) {
				checks := tenantChecks(fmt.Sprintf("bench-%s-%d", bc.name, id.Add(1)), bc.rules...)
				for pb.Next() {
					d, err := s.Take(ctx, checks, 1)
					if err != nil || !d.Allowed {
						b.Errorf("Take: %+v, %v", d, err)
						return
					}
					if d.Lease != "" {
						if err := s.Release(ctx, checks, d.Lease); err != nil {
							b.Error(err)
							return
						}
					}
				}
			})
		})
	}
	b.Run("peer_ping", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				ctx, cancel := context.WithTimeout(ctx, time.Second)
				err := c.Do(ctx, c.B().Ping().Build()).Error()
				cancel()
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkTakeMetered is BenchmarkTake's batch of three with a usage meter
// charged in the same script, and a meter alone (a tool with only a quota),
// to compare with BenchmarkTake/tenant_batch_3 and peer_ping.
func BenchmarkTakeMetered(b *testing.B) {
	r := testenv.StartRedis(b, nil)
	s := newStore(b, r.Client(b), 10*time.Second)
	ctx := context.Background()
	const p = 100 * time.Millisecond
	big := int64(1_000_000_000)
	for _, bc := range []struct {
		name  string
		rules []limit.Rule
	}{
		{"tenant_batch_3", []limit.Rule{rule("fw", limit.FixedWindow, big, p), rule("swc", limit.SlidingWindowCounter, big, p), rule("tb", limit.TokenBucket, big, p)}},
		{"meter_only", nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var id atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(16)
			b.RunParallel(func(pb *testing.PB) {
				tenant := fmt.Sprintf("bench-m-%s-%d", bc.name, id.Add(1))
				checks := tenantChecks(tenant, bc.rules...)
				m := testMeter(tenant, 0)
				for pb.Next() {
					d, _, err := s.TakeMetered(ctx, checks, m, 1)
					if err != nil || !d.Allowed {
						b.Errorf("TakeMetered: %+v, %v", d, err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkEvaluate is BenchmarkTakeMetered's batch of three with a loop
// breaker (every trigger on, identical calls counted) in the same script,
// and the cost of a call an open breaker denies, to compare with
// BenchmarkTakeMetered/tenant_batch_3 and BenchmarkTake/peer_ping.
func BenchmarkEvaluate(b *testing.B) {
	r := testenv.StartRedis(b, nil)
	s := newStore(b, r.Client(b), 10*time.Second)
	ctx := context.Background()
	const p = 100 * time.Millisecond
	big := int64(1_000_000_000)
	rules := []limit.Rule{rule("fw", limit.FixedWindow, big, p), rule("swc", limit.SlidingWindowCounter, big, p), rule("tb", limit.TokenBucket, big, p)}
	for _, open := range []bool{false, true} {
		name := "tenant_batch_3_meter_breaker"
		if open {
			name = "open_breaker"
		}
		b.Run(name, func(b *testing.B) {
			var id atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(16)
			b.RunParallel(func(pb *testing.PB) {
				tenant := fmt.Sprintf("bench-e-%s-%d", name, id.Add(1))
				m := testMeter(tenant, 0)
				br := testBreaker(tenant, "fp")
				br.IdenticalCount = limit.MaxBreakerCount
				if open {
					br.ConsecutiveFailures, br.Cooldown, br.MaxCooldown = 1, time.Hour, time.Hour
					if _, err := s.ReportOutcome(ctx, br, true, false); err != nil {
						b.Error(err)
						return
					}
				}
				req := limit.Request{Checks: tenantChecks(tenant, rules...), Meter: &m, Breaker: &br, Cost: 1}
				for pb.Next() {
					o, err := s.Evaluate(ctx, req)
					if err != nil || o.Decision.Allowed == open || o.Breaker.Open != open {
						b.Errorf("Evaluate: %+v, %v", o, err)
						return
					}
				}
			})
		})
	}
}
