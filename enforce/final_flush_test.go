package enforce_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/usage"
)

// On the in-process store, usage a failed final flush could not write is
// lost with the process (no other instance will sweep it): its calls are
// counted in mcpgate_unmetered_calls_total.
func TestFailedFinalFlushInProcessCountsUnmetered(t *testing.T) {
	us := &putFailing{Store: openSQLite(t)}
	m := metrics.New()
	e := newEngine(t, `upstream: {url: "http://127.0.0.1:1/mcp"}
usage: {flush_interval: 1h}
tools:
  llm: {cost: 3}
`, enforce.Options{Usage: us, Metrics: m})
	if n := admitN(t, e, 2, nil); n != 2 {
		t.Fatalf("%d calls admitted, want 2", n)
	}
	if err := e.Flusher().Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	us.down.Store(true)
	if n := admitN(t, e, 3, nil); n != 3 {
		t.Fatalf("%d calls admitted, want 3", n)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.Unmetered); got != 3 {
		t.Errorf("unmetered calls = %v, want the 3 the failed final flush left in the in-process store", got)
	}
}

// blipStore is a shared store whose Evaluate and Adjust fail (before
// applying anything) while it is down, as a store that times out. Adjust
// too: the engine places a charge that got no answer again at once, and a
// store answering that placement would not be down.
type blipStore struct {
	limit.GuardedStore
	down atomic.Bool
}

func (s *blipStore) Evaluate(ctx context.Context, req limit.Request) (limit.Outcome, error) {
	if s.down.Load() {
		return limit.Outcome{}, context.DeadlineExceeded
	}
	return s.GuardedStore.Evaluate(ctx, req)
}

func (s *blipStore) Adjust(ctx context.Context, m limit.Meter, d limit.Usage) (limit.MeterResult, error) {
	if s.down.Load() {
		return limit.MeterResult{}, context.DeadlineExceeded
	}
	return s.GuardedStore.Adjust(ctx, m, d)
}

// A short store outage opens the store breaker: calls are admitted open
// and their usage waits in process. The store answers again when the
// engine is closed, its breaker still open until the next probe: the
// shutdown must wait for the probe and place that usage, not drop it as
// unmetered because the breaker refused the last try at once.
func TestShutdownRightAfterStoreBlipPlacesUsage(t *testing.T) {
	shared := &blipStore{GuardedStore: newSwappable(t)}
	us := openSQLite(t)
	m := metrics.New()
	e := newEngine(t, `upstream: {url: "http://127.0.0.1:1/mcp"}
store: {timeout: 1s, on_error: open}
usage: {flush_interval: 1h}
tiers:
  free: {}
tools:
  llm: {cost: 3}
`, enforce.Options{Usage: us, Shared: shared, Metrics: m,
		Probe: func(context.Context) error {
			if shared.down.Load() {
				return errors.New("down")
			}
			return nil
		}})
	n := admitN(t, e, 1, nil) // creates the meter
	shared.down.Store(true)
	n += admitN(t, e, 5, nil) // 3 failures open the store breaker, 2 more skip the store
	if e.StoreAvailable() {
		t.Fatal("store breaker did not open")
	}
	shared.down.Store(false)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	rec, _, err := us.Get(context.Background(), "acme", usage.Period(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if rec.NetCalls() != n || rec.Used() != 3*n {
		t.Errorf("durable usage %+v: %d calls billed, want %d (the store answered at shutdown)", rec.Usage, rec.NetCalls(), n)
	}
	if got := testutil.ToFloat64(m.Unmetered); got != 0 {
		t.Errorf("unmetered calls = %v, want 0", got)
	}
}

// outcomeBlip fails the loop breaker's outcome reports while down (a
// connection error: a timeout would be the caller's, whose deadline, a
// ticket's releaseTimeout, is no later than store.timeout here): what
// opens the store breaker then leaves no usage to write.
type outcomeBlip struct {
	limit.GuardedStore
	down atomic.Bool
}

var errConnReset = errors.New("read: connection reset by peer")

func (s *outcomeBlip) ReportOutcome(ctx context.Context, b limit.BreakerSpec, failed, probe bool) (limit.BreakerState, error) {
	if s.down.Load() {
		return limit.BreakerState{}, errConnReset
	}
	return s.GuardedStore.ReportOutcome(ctx, b, failed, probe)
}

// With nothing to write (the usage flushed, the store breaker opened by
// failed outcome reports), the shutdown does not wait for a store that
// stays down: the wait is for usage it could place, and it lasts up to 5s.
func TestShutdownWithNothingToWriteDoesNotWaitForTheStore(t *testing.T) {
	shared := &outcomeBlip{GuardedStore: newSwappable(t)}
	e := newEngine(t, `upstream: {url: "http://127.0.0.1:1/mcp"}
store: {timeout: 1s}
usage: {flush_interval: 1h}
breaker: {consecutive_failures: 100, cooldown: 1m}
`, enforce.Options{Usage: openSQLite(t), Shared: shared,
		Probe: func(context.Context) error { return errors.New("down") }})
	// The flusher's first round (a flush and a sweep, at start) done: on a
	// loaded machine it could still be writing the calls below when Close
	// cancels it, leaving the final flush something to write after all.
	testenv.Eventually(t, 10*time.Second, "the start sweep done", func() bool {
		return !e.Flusher().Health().LastSuccess.IsZero()
	})
	var tickets []*enforce.Ticket
	for range 3 {
		tk, d := e.Admit(t.Context(), enforce.Call{Tenant: "acme", Subject: "a", Name: "flaky"})
		if !d.Allowed {
			t.Fatalf("denied: %+v", d)
		}
		tickets = append(tickets, tk)
	}
	// Flushed until nothing is left to write (the second flush sees the
	// first's write and empties the journal): the premise of the test.
	testenv.Eventually(t, 10*time.Second, "the usage flushed", func() bool {
		return e.Flusher().Flush(t.Context()) == nil && !enforce.ShutdownHasWork(e)
	})
	shared.down.Store(true)
	for _, tk := range tickets {
		tk.Done(t.Context(), enforce.Outcome{Status: enforce.ToolError})
	}
	if e.StoreAvailable() {
		t.Fatal("store breaker did not open")
	}
	if enforce.ShutdownHasWork(e) {
		t.Fatal("failed outcome reports left usage to write")
	}
	start := time.Now()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	// Without anything to write Close takes milliseconds; waiting for the
	// store lasts 5s at least (shutdownStep): 4.5s tells them apart, with
	// room for a loaded machine.
	if d := time.Since(start); d > 4500*time.Millisecond {
		t.Fatalf("Close took %v with nothing to write: it waited for the store", d.Round(time.Millisecond))
	}
}

// A call admitted before Close whose Done runs after it (a call still in
// flight past the server's shutdown grace, a cached load the gateway
// stopped waiting for) corrects its charge after the final flush: the
// correction is written to the usage store at once, or, when that fails,
// its call is counted in mcpgate_unmetered_calls_total (it used to be put
// on the in-process meter, never flushed, counted nowhere).
func TestCorrectionAfterCloseIsWrittenOrCounted(t *testing.T) {
	for _, down := range []bool{false, true} {
		t.Run(map[bool]string{false: "usage store up", true: "usage store down"}[down], func(t *testing.T) {
			sq := openSQLite(t)
			us := &putFailing{Store: sq}
			m := metrics.New()
			e := newEngine(t, `upstream: {url: "http://127.0.0.1:1/mcp"}
usage: {flush_interval: 1h}
tools:
  llm: {cost: 3}
`, enforce.Options{Usage: us, Metrics: m})
			ctx := context.Background()
			tk := mustAdmit(t, e, acmeCall)
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			us.down.Store(down)
			charged := tk.Done(ctx, enforce.Outcome{Cost: 10})
			rec, _, err := sq.Get(ctx, "acme", usage.Period(time.Now()))
			if err != nil {
				t.Fatal(err)
			}
			lost := testutil.ToFloat64(m.Unmetered)
			switch {
			case !down && (rec.Used() != charged || lost != 0):
				t.Errorf("Done reported %d units charged, the usage store holds %d, unmetered calls %v: want the correction written",
					charged, rec.Used(), lost)
			case down && lost != 1:
				t.Errorf("usage store down: Done reported %d units charged, the usage store holds %d, unmetered calls %v: want the call counted",
					charged, rec.Used(), lost)
			}
		})
	}
}
