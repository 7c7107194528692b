package gosdk_test

import (
	"context"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// A cached call whose caller leaves while its own flight waits for the
// entry's lock (held by an older flight, started before an invalidation)
// is settled at once: its own Loader has not started yet (ran is false),
// so cachedCall returns no orphan, and its concurrency slot is freed. The
// flight goes on (its ctx is detached) and, once the lock is free, runs
// that caller's Loader: the tool handler runs for a call already settled,
// outside every concurrency slot, and two more calls are admitted beside
// it under a limit of 2. Its Loader now does not run once its call was
// settled (the flight's other callers make their own calls).
func TestLeftWhileFlightWaitsForLockRunsNoHandlerOutsideSlots(t *testing.T) {
	settled := make(chan enforce.Status, 16)
	s := newServer(t, false, `
tools:
  slow:
    cache: {ttl: 10m, tags: [slowdata]}
    limits:
      - {name: two_at_a_time, per: tenant_tool, algorithm: concurrency, limit: 2, period: 10m}
`, options{settled: func(tool string, st enforce.Status) { settled <- st }})
	release1 := make(chan struct{})
	s.setRelease(release1)
	cs := s.connect(token(t, "flight-co", "alice"))

	// X: key k, its flight F1 holds the entry's lock while its handler runs.
	xdone := make(chan error, 1)
	go func() {
		_, err := call(context.Background(), cs, "slow", map[string]any{"key": "k"})
		xdone <- err
	}()
	<-s.started
	// An invalidation: a Get of k now starts a flight of its own (F2),
	// which waits for F1's lock; F1's commit is refused by the fence.
	if _, err := s.engine.Invalidate(context.Background(), "flight-co", []string{"slowdata"}); err != nil {
		t.Fatal(err)
	}
	// Y: key k, admitted (second slot), waits in F2; its caller leaves.
	yctx, ycancel := context.WithCancel(context.Background())
	ydone := make(chan error, 1)
	go func() {
		_, err := call(yctx, cs, "slow", map[string]any{"key": "k"})
		ydone <- err
	}()
	time.Sleep(300 * time.Millisecond) // Y reaches F2's wait
	ycancel()
	<-ydone
	if st := <-settled; st != enforce.Cancelled && st != enforce.Abandoned {
		close(release1)
		t.Fatalf("first settled call: %v, want Y cancelled or abandoned", st)
	}
	// X's handler returns; F2 takes the lock and calls Y's Loader.
	before := s.reached("slow") // X's
	loads := s.engine.Cache().Stats().Loads
	release2 := make(chan struct{})
	defer close(release2)
	s.setRelease(release2)
	close(release1)
	if err := <-xdone; err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "F2 to call Y's Loader", func() bool {
		return s.engine.Cache().Stats().Loads > loads
	})
	// Z and W, two more keys: both admitted under the limit of 2, and
	// their handlers are the only ones to run after X's.
	for _, key := range []string{"z", "w"} {
		go func() { _, _ = call(context.Background(), cs, "slow", map[string]any{"key": key}) }()
	}
	testenv.Eventually(t, time.Minute, "Z's and W's handlers to start", func() bool { return s.reached("slow") >= before+2 })
	if n := s.reached("slow") - before; n != 2 {
		t.Fatalf("%d slow handlers ran after X's under a concurrency limit of 2, want 2 (Z's, W's): Y's ran for a call settled when its caller left before its Loader started", n)
	}
}
