package memstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

func testBreaker(tenant string) limit.BreakerSpec {
	return limit.BreakerSpec{
		Key: keyspace.Breaker(tenant, "s"), Tenant: tenant, ID: "s",
		ConsecutiveDenials: 3, ConsecutiveFailures: 2,
		IdenticalKey: keyspace.BreakerCall(tenant, "s", "fp"), IdenticalCount: 2, IdenticalWithin: time.Minute,
		Cooldown: 10 * time.Second, MaxCooldown: 40 * time.Second, ProbeLease: 5 * time.Second,
	}
}

// Breakers and identical-calls counters are held, counted by Len, listed by
// Keys with their TTLs, and dropped by Sweep once expired.
func TestBreakerMemory(t *testing.T) {
	s, clk := frozen(t)
	ctx := context.Background()
	b := testBreaker("mem")
	for range 2 {
		if _, err := s.Evaluate(ctx, limit.Request{Breaker: &b, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if s.Len() != 2 {
		t.Errorf("Len %d with an open breaker and its counter, want 2 (keys %v)", s.Len(), s.Keys())
	}
	for key, want := range map[string]time.Duration{b.Key: 50 * time.Second, b.IdenticalKey: time.Minute} {
		if ttl, ok := s.TTL(key); !ok || ttl != want {
			t.Errorf("TTL(%q) = %v, %v; want %v", key, ttl, ok, want)
		}
	}
	clk.Advance(50 * time.Second)
	s.Sweep()
	if keys := s.Keys(); len(keys) != 1 || keys[0] != b.IdenticalKey {
		t.Errorf("after the breaker's expiry: keys %v, want the counter only", keys)
	}
	clk.Advance(10 * time.Second)
	s.Sweep()
	if s.Len() != 0 {
		t.Errorf("after every expiry: keys %v", s.Keys())
	}
	// A store that never saw a breaker makes no breaker maps.
	for i := range s.c.shards {
		if s.c.shards[i].br != nil && len(s.c.shards[i].br.states)+len(s.c.shards[i].br.calls) != 0 {
			t.Errorf("shard %d holds breaker state after the sweep", i)
		}
	}
	fresh, _ := frozen(t)
	take(t, fresh, 1, check("fw", limit.FixedWindow, 5, time.Second))
	for i := range fresh.c.shards {
		if fresh.c.shards[i].br != nil {
			t.Fatalf("a plain Take made shard %d's breaker maps", i)
		}
	}
}

// Guarded calls over few shards (so that their keys share and cross
// shards), plain Takes, reports, resets and listings that call back into
// the store run together without deadlock or race.
func TestBreakerLockOrder(t *testing.T) {
	s := newStore(t, &Options{Shards: 3})
	ctx := context.Background()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Go(func() {
				tenant := fmt.Sprint("t", g%4)
				b := testBreaker(tenant)
				r := limit.Rule{Name: "r", Algorithm: limit.TokenBucket, Limit: 1000, Period: time.Second}
				checks := []limit.Check{
					{Rule: r, Key: keyspace.RateLimit(keyspace.PerTenant, "r", keyspace.Owner{Tenant: tenant})},
					{Rule: r, Key: keyspace.RateLimit(keyspace.PerSubject, "r", keyspace.Owner{Tenant: tenant, Subject: fmt.Sprint(g)})},
				}
				m := limit.Meter{Key: keyspace.Usage(tenant, "p"), Seeded: true, ExpireAt: time.Now().Add(time.Hour)}
				for i := range 300 {
					var err error
					switch i % 6 {
					case 0, 1:
						_, err = s.Evaluate(ctx, limit.Request{Checks: checks, Meter: &m, Breaker: &b, Cost: 1})
					case 2:
						_, err = s.Take(ctx, checks, 1)
					case 3:
						_, err = s.ReportOutcome(ctx, b, i%4 == 3, i%5 == 0)
					case 4:
						_, err = s.ResetBreaker(ctx, b.Key)
					case 5:
						err = s.ListBreakers(ctx, func(info limit.BreakerInfo) error {
							_, err := s.AddDenials(ctx, b, 1)
							return err
						})
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("guarded calls deadlocked")
	}
}
