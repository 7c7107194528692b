package storeguard

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// suspectBreaker is a breaker whose probe waits for one answer per call on
// the returned channel, counting the calls.
func suspectBreaker(t *testing.T) (*Breaker, chan error, *atomic.Int64) {
	t.Helper()
	answers := make(chan error)
	var probes atomic.Int64
	b, err := New(Options{Failures: 3, ProbeInterval: time.Hour, Probe: func(ctx context.Context) error {
		probes.Add(1)
		select {
		case err := <-answers:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b, answers, &probes
}

// awaitChecked waits until no check runs.
func awaitChecked(b *Breaker) {
	for b.checking.Load() {
		time.Sleep(time.Millisecond)
	}
}

// Operations suspected (a caller's deadline ended them) do not count by
// themselves: one check of the store runs for all of them, and its failure
// counts them, opening the breaker; a dead store thus opens it even when
// every caller's deadline is shorter than the store's.
func TestSuspectsCountWhenTheCheckFails(t *testing.T) {
	b, answers, probes := suspectBreaker(t)
	for range 3 {
		b.Suspect()
	}
	if !b.Available() {
		t.Fatal("open on suspects alone, before the check failed")
	}
	answers <- errors.New("no answer within the store's timeout")
	awaitChecked(b)
	if b.Available() {
		t.Fatal("check failed with 3 operations suspected: breaker closed, want open")
	}
	if n := probes.Load(); n != 1 {
		t.Fatalf("%d checks for 3 suspected operations, want 1 (one at a time)", n)
	}
}

// A check the store answers forgets the operations suspected meanwhile:
// a caller's short deadline with the store healthy never opens the breaker.
func TestSuspectsForgottenWhenTheCheckPasses(t *testing.T) {
	b, answers, probes := suspectBreaker(t)
	for round := range 3 {
		for range 5 {
			b.Suspect()
		}
		answers <- nil
		awaitChecked(b)
		if !b.Available() {
			t.Fatalf("round %d: store answered the check, breaker open", round)
		}
	}
	if n := probes.Load(); n != 3 {
		t.Fatalf("%d checks for 3 rounds of suspects, want 3", n)
	}
	// The failures counted so far are untouched by the suspects: two real
	// failures and one more do open it.
	b.Observe(errors.New("timeout"))
	b.Observe(errors.New("timeout"))
	if !b.Available() {
		t.Fatal("open after 2 failures")
	}
	b.Observe(errors.New("timeout"))
	if b.Available() {
		t.Fatal("closed after 3 failures")
	}
}

// Close ends a check in flight without counting it, and none starts after.
func TestSuspectAfterClose(t *testing.T) {
	b, _, probes := suspectBreaker(t)
	b.Suspect()
	b.Close() // the check in flight is cancelled: Close returns
	if !b.Available() {
		t.Fatal("a check cancelled by Close opened the breaker")
	}
	n := probes.Load()
	b.Suspect()
	awaitChecked(b)
	if probes.Load() != n {
		t.Fatal("a check started after Close")
	}
}
