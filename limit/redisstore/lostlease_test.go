package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
)

// A take sent before its caller's deadline that runs on the server only
// afterwards (the server stalled) takes a concurrency slot under a lease
// its caller never learnt: the store releases it, so the slot does not
// stay taken for the rule's period.
func TestLostLeaseIsReleased(t *testing.T) {
	r := testenv.StartRedis(t, &testenv.RedisOptions{Args: []string{"--enable-debug-command", "yes"}})
	c, sleeper, prober := r.Client(t), r.Client(t), r.Client(t)
	s := newStore(t, c, testTimeout)
	ctx := ctxT(t)
	checks := tenantChecks("lost-lease", limit.Rule{Name: "one", Algorithm: limit.Concurrency, Limit: 1, Period: time.Hour})
	d, err := s.Take(ctx, checks, 1) // the library loaded
	if err != nil || !d.Allowed {
		t.Fatalf("first take: %+v %v", d, err)
	}
	if err := s.Release(ctx, checks, d.Lease); err != nil {
		t.Fatal(err)
	}
	// The server sleeps for a second; once it no longer answers a PING,
	// a take is sent with a deadline it cannot meet. A loaded machine may
	// be slow to answer the PING without sleeping yet: then the take is
	// answered, and the round is tried again.
	for round := 0; ; round++ {
		slept := make(chan error, 1)
		go func() {
			slept <- sleeper.Do(ctx, sleeper.B().Arbitrary("DEBUG", "SLEEP").Args("1").Build()).Error()
		}()
		for {
			pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			err := prober.Do(pctx, prober.B().Ping().Build()).Error()
			cancel()
			if err != nil {
				break // asleep
			}
			time.Sleep(5 * time.Millisecond)
		}
		tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		d, err := s.Take(tctx, checks, 1)
		cancel()
		if err := <-slept; err != nil {
			t.Fatal(err)
		}
		if err != nil {
			break // the take is waiting in the sleeping server
		}
		if round == 5 {
			t.Fatal("no take met the sleeping server")
		}
		if err := s.Release(ctx, checks, d.Lease); err != nil {
			t.Fatal(err)
		}
	}
	// The server has run the take: its slot must come free again.
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := c.Do(ctx, c.B().Zcard().Key(checks[0].Key).Build()).AsInt64()
		if err == nil && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lost call's slot is still taken (%d leases, %v): it would be for the rule's hour", n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if d, err := s.Take(ctx, checks, 1); err != nil || !d.Allowed {
		t.Fatalf("a take with no call in flight: %+v, %v", d, err)
	}
}
