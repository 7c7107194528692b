package enforce_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/usage"
)

// A metered charge that lands but whose answer is lost (a store timeout
// under load: the call is admitted open, its op kept pending) counts twice
// if a flush reads the meter, this call included, into the durable total
// and the limit store then loses its data before the op is placed again:
// the meter is re-created from that total, which holds the call, and the
// op, its marker gone with the data, is applied on it once more
// (docs/design.md, "Bounds" (2)). The op must be placed again as soon as
// the store answers: right after the failure, past this instance's open
// store breaker, and when the breaker closes; not at the next tick of the
// flush interval (an hour in these tests).

// placedAgain waits until e's journals hold calls calls: every charge
// landed and answered, a lost answer's op placed again included.
func placedAgain(t *testing.T, e *enforce.Engine, calls int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); enforce.JournaledCalls(e) != calls || e.PendingUsage() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("lost answer's op not placed again: %d calls journaled, want %d; %d meters pending",
				enforce.JournaledCalls(e), calls, e.PendingUsage())
		}
	}
}

// The op of a lost answer is placed again at once (the store answers),
// before any flush or data loss can make it count twice.
func TestLostAnswerPlacedAgainAtOnce(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		mem := newSwappable(t)
		shared := newFaultyStore(mem)
		us := openSQLite(t)
		e := billingEngine(t, shared, "", us, time.Hour)
		n := admitN(t, e, 1, nil) // charged, journaled
		shared.loseNext.Store(true)
		n += admitN(t, e, 1, nil) // landed, answer lost: admitted open, op pending
		placedAgain(t, e, n)
		if err := e.Flusher().Sweep(context.Background()); err != nil {
			t.Fatal(err)
		}
		mem.restartEmpty()
		n += admitN(t, e, 1, nil) // NeedSeed: the journal's replays are found in the seed
		billed(t, e, us, n)
	})
	t.Run("redis", func(t *testing.T) {
		shared, flushAll := redisFaultyStore(t)
		us := openSQLite(t)
		e := billingEngine(t, shared, "", us, time.Hour)
		n := admitN(t, e, 1, nil)
		shared.loseNext.Store(true)
		n += admitN(t, e, 1, nil)
		placedAgain(t, e, n)
		if err := e.Flusher().Sweep(context.Background()); err != nil {
			t.Fatal(err)
		}
		flushAll()
		n += admitN(t, e, 1, nil)
		billed(t, e, us, n)
	})
}

// The CI interleaving, two engines on one real redis-server: engine A's
// charge lands and its answer is lost; engine B charges and flushes the
// meter, A's call included; redis-server is SIGKILLed and restarted empty;
// A's next call re-creates the meter from the durable total. A placed its
// op again before B's flush (it does so at once), so the op is journaled
// and goes back as a replay the seed is found to hold: counted once.
func TestLostAnswerFlushedByOtherEngineThenRedisKilled(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	us := openSQLite(t)
	a, b := twoEngines(t, r, us)
	a.loseNext.Store(true)
	n := admitN(t, a.e, 1, nil) // landed, answer lost: admitted open, op pending on A
	placedAgain(t, a.e, 1)
	n += admitN(t, b.e, 1, nil) // B charges the meter: tracked by B's flusher
	if err := b.e.Flusher().Flush(context.Background()); err != nil {
		t.Fatal(err) // durable: both calls
	}
	r.Kill()
	r.Restart(t)
	for deadline := time.Now().Add(10 * time.Second); !a.e.StoreAvailable(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("store still unavailable")
		}
	}
	n += admitN(t, a.e, 1, nil) // NeedSeed: the seed holds A's first call, journaled, replayed, found counted
	if err := b.e.Close(); err != nil {
		t.Fatal(err)
	}
	billed(t, a.e, us, n)
}

// Engine A's answers are lost until its store breaker opens, and its probe
// keeps failing (a loaded instance: its PINGs time out too) while engine B
// sees the store healthy and flushes. A places its in-doubt ops past its
// open breaker: they are resolved before B's flush and the data loss, not
// when A's probe at last answers.
func TestLostAnswerPlacedPastOpenBreaker(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	us := openSQLite(t)
	a, b := twoEngines(t, r, us)
	a.probeFails.Store(true)
	var n int64
	for a.e.StoreAvailable() {
		a.loseNext.Store(true)
		n += admitN(t, a.e, 1, nil) // landed, answer lost; the third opens A's breaker
	}
	placedAgain(t, a.e, n) // A's breaker still open
	if a.e.StoreAvailable() {
		t.Fatal("A's breaker closed: the test's premise is gone")
	}
	n += admitN(t, b.e, 1, nil)
	if err := b.e.Flusher().Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	flushAll(t, r)
	a.probeFails.Store(false)
	awaitAvailable(t, a.e)
	n += admitN(t, a.e, 1, nil)
	if err := b.e.Close(); err != nil {
		t.Fatal(err)
	}
	billed(t, a.e, us, n)
}

// Engine A cannot reach the store at all (its answers lost, its placements
// and probe failing) until it can again: then its pending usage is placed
// at once (when its probe closes the breaker, or the in-doubt ops' own
// retry goes past it first), not at the next tick of the flush interval.
func TestLostAnswerPlacedWhenBreakerCloses(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	us := openSQLite(t)
	a, b := twoEngines(t, r, us)
	a.cut.Store(true)
	var n int64
	for a.e.StoreAvailable() {
		n += admitN(t, a.e, 1, nil) // landed, answer lost, not placed again: A is cut off
	}
	n += admitN(t, a.e, 2, nil) // breaker open: admitted open, never sent
	a.cut.Store(false)
	placedAgain(t, a.e, n) // the probe closes the breaker, which places them
	n += admitN(t, b.e, 1, nil)
	if err := b.e.Flusher().Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	flushAll(t, r)
	n += admitN(t, a.e, 1, nil)
	if err := b.e.Close(); err != nil {
		t.Fatal(err)
	}
	billed(t, a.e, us, n)
}

// The bound no placement can close: engine A's charge lands, its answer is
// lost, and A cannot reach the store at all from then until after engine B
// flushed the meter (A's call included) and the store lost its data. A's op
// is then placed on the meter re-created from a durable total that holds
// it, its marker gone: it counts twice. The test documents the bound: at
// most the ops in doubt at the loss count twice (here the one, which does).
func TestLostAnswerUnreachableUntilLossCountsTwiceAtMost(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	us := openSQLite(t)
	a, b := twoEngines(t, r, us)
	a.cut.Store(true)
	n := admitN(t, a.e, 1, nil) // landed, answer lost; A cut off before it could place it again
	const inDoubt = 1
	n += admitN(t, b.e, 1, nil)
	if err := b.e.Flusher().Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	flushAll(t, r)
	a.cut.Store(false)
	awaitAvailable(t, a.e)
	n += admitN(t, a.e, 1, nil)
	if err := b.e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.e.Close(); err != nil {
		t.Fatal(err)
	}
	rec, _, err := us.Get(context.Background(), "acme", usage.Period(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if got := rec.NetCalls(); got < n || got > n+inDoubt {
		t.Errorf("durable usage %+v: %d calls; want %d to %d (every call once, at most the %d in doubt at the loss twice)",
			rec.Usage, got, n, n+inDoubt, inDoubt)
	}
}

// cutStore is a faultyStore that can be cut off from its server: while cut,
// an Evaluate is applied and its answer lost (an overloaded instance: the
// script runs, the reply misses the timeout), and Adjust and the probe
// fail without reaching it. probeFails fails the probe alone.
type cutStore struct {
	*faultyStore
	cut, probeFails atomic.Bool
}

var errCut = errors.New("i/o timeout (store unreachable from this instance)")

func (s *cutStore) Evaluate(ctx context.Context, req limit.Request) (limit.Outcome, error) {
	if !s.cut.Load() {
		return s.faultyStore.Evaluate(ctx, req)
	}
	if _, err := s.faultyStore.Evaluate(ctx, req); err != nil {
		return limit.Outcome{}, err
	}
	return limit.Outcome{}, errCut // the script ran; its answer missed the timeout
}

func (s *cutStore) Adjust(ctx context.Context, m limit.Meter, d limit.Usage) (limit.MeterResult, error) {
	if s.cut.Load() {
		return limit.MeterResult{}, errCut
	}
	return s.faultyStore.Adjust(ctx, m, d)
}

func (s *cutStore) probe(context.Context) error {
	if s.cut.Load() || s.probeFails.Load() {
		return errCut
	}
	return nil
}

type testEngine struct {
	*cutStore
	e *enforce.Engine
}

// twoEngines are two engines metering into us, each over a Redis store of
// its own on r (a cutStore), flushing every hour (and in the flusher's
// first sweep, which it waits for).
func twoEngines(t *testing.T, r *testenv.Redis, us usage.Store) (a, b testEngine) {
	t.Helper()
	cfg, err := policy.Parse("billing.yaml", []byte(`upstream: {url: "http://127.0.0.1:1/mcp"}
auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}
store: {timeout: 1s, on_error: open}
usage: {flush_interval: 1h}
tiers:
  free: {}
tools:
  llm: {cost: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	var es [2]testEngine
	for i := range es {
		rs, err := redisstore.New(r.Client(t), &redisstore.Options{Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rs.Close)
		s := &cutStore{faultyStore: newFaultyStore(rs)}
		e, err := enforce.New(enforce.Options{Config: cfg, Usage: us, Shared: s, Probe: s.probe})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		select {
		case <-s.swept:
		case <-time.After(10 * time.Second):
			t.Fatal("the flusher never swept the store")
		}
		es[i] = testEngine{cutStore: s, e: e}
	}
	return es[0], es[1]
}

func awaitAvailable(t *testing.T, e *enforce.Engine) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !e.StoreAvailable(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("store breaker still open")
		}
	}
}

// flushAll loses all of r's data, as a Redis restarted empty.
func flushAll(t *testing.T, r *testenv.Redis) {
	t.Helper()
	c := r.Client(t)
	if err := c.Do(context.Background(), c.B().Flushall().Build()).Error(); err != nil {
		t.Fatal(err)
	}
}
