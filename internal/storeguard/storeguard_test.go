package storeguard

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The breaker opens on the Failures-th consecutive failure (an answer in
// between starts the count again), skips while open, and closes once a
// probe succeeds.
func TestBreakerOpensAndCloses(t *testing.T) {
	var healthy atomic.Bool
	var probes atomic.Int64
	var mu sync.Mutex
	var states []bool
	b, err := New(Options{
		Failures: 3, ProbeInterval: time.Millisecond,
		Probe: func(context.Context) error {
			probes.Add(1)
			if healthy.Load() {
				return nil
			}
			return errors.New("down")
		},
		OnState: func(up bool) { mu.Lock(); states = append(states, up); mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	fail := errors.New("timeout")
	b.Observe(fail)
	b.Observe(fail)
	b.Observe(nil) // an answer: the count starts again
	b.Observe(fail)
	b.Observe(fail)
	if !b.Available() || b.Skip() {
		t.Fatal("open after 2 consecutive failures, want closed until 3")
	}
	opened := b.Opened()
	b.Observe(fail)
	select {
	case <-opened:
	default:
		t.Fatal("Opened not closed when the breaker opened")
	}
	if b.Available() || !b.Skip() || !b.Skip() || b.Skipped() != 2 {
		t.Fatalf("available %v, skipped %d: want open and 2 skipped", b.Available(), b.Skipped())
	}
	for probes.Load() < 2 { // the probe keeps trying while the store is down
		time.Sleep(time.Millisecond)
	}
	healthy.Store(true)
	for !b.Available() {
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(states) != 2 || states[0] || !states[1] {
		t.Fatalf("state changes %v, want [false true]", states)
	}
	select {
	case <-b.Opened():
		t.Fatal("Opened of a closed breaker is already closed")
	default:
	}
}

// Close stops the probe of an open breaker and keeps it from opening again.
func TestCloseStopsTheProbe(t *testing.T) {
	b, err := New(Options{Failures: 1, ProbeInterval: time.Millisecond, Probe: func(context.Context) error { return errors.New("down") }})
	if err != nil {
		t.Fatal(err)
	}
	b.Observe(errors.New("x"))
	b.Close() // waits for the probe goroutine
	b.Close() // idempotent
	if _, err := New(Options{}); err == nil {
		t.Fatal("New without a Probe succeeded")
	}
}

// Trip opens the breaker at once, whatever the failure count; a probe
// closes it as after failures; after Close it does nothing.
func TestTrip(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	b, err := New(Options{Failures: 1000, ProbeInterval: time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		Probe: func(context.Context) error {
			if down.Load() {
				return errors.New("down")
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	b.Trip(errors.New("not to be trusted"))
	if b.Available() {
		t.Fatal("Trip left the breaker closed")
	}
	down.Store(false)
	for deadline := time.Now().Add(10 * time.Second); !b.Available(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no probe closed the breaker a Trip opened")
		}
	}
	b.Close()
	b.Trip(errors.New("after Close"))
	if !b.Available() {
		t.Error("Trip after Close opened the breaker")
	}
}
