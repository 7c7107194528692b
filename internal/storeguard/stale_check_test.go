package storeguard

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// A check Suspect started before the breaker opened outlives the outage:
// the breaker opens on real failures, its probe finds the store back and
// closes it, and only then does the stale check (its PING sent while the
// store was down) fail. Its suspects, from before the outage was even
// detected, do not reopen the breaker the probe just closed: it opened
// once. (Once, they were counted against the recovered store and reopened
// it at once.)
func TestStaleSuspectCheckLeavesRecoveredBreakerClosed(t *testing.T) {
	release := make(chan error)
	var calls, opens atomic.Int64
	b, err := New(Options{Failures: 3, ProbeInterval: 5 * time.Millisecond, ProbeTimeout: time.Hour,
		OnState: func(up bool) {
			if !up {
				opens.Add(1)
			}
		},
		Probe: func(ctx context.Context) error {
			if calls.Add(1) == 1 { // the suspect check: sent while the store was down
				select {
				case err := <-release:
					return err
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil // the breaker's probe: the store is back
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	for range 3 {
		b.Suspect() // short-deadline callers time out: one check starts
	}
	down := errors.New("connection refused")
	for range 3 {
		b.Observe(down) // the outage is seen: the breaker opens
	}
	if b.Available() {
		t.Fatal("breaker not open after 3 failures")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !b.Available() {
		if time.Now().After(deadline) {
			t.Fatal("probe never closed the breaker")
		}
		time.Sleep(time.Millisecond)
	}
	// The store answers again (the probe saw it). The old check's PING,
	// sent during the outage, now fails.
	release <- context.DeadlineExceeded
	awaitChecked(b)
	if n := opens.Load(); n != 1 {
		t.Fatalf("breaker opened %d times, want 1: a check started before the outage reopened the breaker the probe had just closed on a store that answers", n)
	}
}
