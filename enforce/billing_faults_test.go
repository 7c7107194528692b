package enforce_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/memstore"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// Billing under the faults that leave a charge's outcome unknown: a reply
// lost after the store applied it, a caller gone while it ran, the limit
// store losing its data. Every admitted call is billed once, and no refused
// call is billed.

// faultyStore is a shared limit store (a memory store, or the Redis store)
// that can lose the reply of a metered Evaluate it applied, and tells when
// the flusher's first sweep has read it.
type faultyStore struct {
	limit.GuardedStore
	// loseSeeded, loseNext: the next Evaluate whose meter is Seeded, or
	// the next metered one that charged, is applied and then answered
	// with an error (its reply lost to a timeout).
	loseSeeded, loseNext atomic.Bool
	// onLand, when set, runs after the next metered Evaluate that charged
	// (the caller's context ends while the script runs), whose answer is
	// then the context's error.
	onLand atomic.Pointer[func()]
	swept  chan struct{}
	once   sync.Once
}

var errLostReply = errors.New("i/o timeout (reply lost after the script ran)")

func newFaultyStore(s limit.GuardedStore) *faultyStore {
	return &faultyStore{GuardedStore: s, swept: make(chan struct{})}
}

func (s *faultyStore) Evaluate(ctx context.Context, req limit.Request) (limit.Outcome, error) {
	o, err := s.GuardedStore.Evaluate(ctx, req)
	if err != nil || req.Meter == nil {
		return o, err
	}
	charged := !o.Meter.NeedSeed && o.Meter.Allowed
	if f := s.onLand.Load(); f != nil && charged && s.onLand.CompareAndSwap(f, nil) {
		(*f)()
		return limit.Outcome{}, ctx.Err()
	}
	if req.Meter.Seeded && s.loseSeeded.CompareAndSwap(true, false) || charged && s.loseNext.CompareAndSwap(true, false) {
		return limit.Outcome{}, errLostReply
	}
	return o, nil
}

func (s *faultyStore) ScanMeters(ctx context.Context, fn func(limit.MeterState) error) error {
	defer s.once.Do(func() { close(s.swept) })
	return s.GuardedStore.ScanMeters(ctx, fn)
}

// swappable is a memory store that can lose every counter and marker, as
// a Redis restarted empty.
type swappable struct {
	t   *testing.T
	mu  sync.Mutex
	cur *memstore.Store
}

func newSwappable(t *testing.T) *swappable {
	s := &swappable{t: t}
	s.restartEmpty()
	return s
}

func (s *swappable) restartEmpty() {
	ms, err := memstore.New(nil)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { ms.Close() })
	s.mu.Lock()
	s.cur = ms
	s.mu.Unlock()
}

func (s *swappable) st() *memstore.Store { s.mu.Lock(); defer s.mu.Unlock(); return s.cur }

func (s *swappable) Evaluate(ctx context.Context, req limit.Request) (limit.Outcome, error) {
	return s.st().Evaluate(ctx, req)
}
func (s *swappable) Take(ctx context.Context, c []limit.Check, cost int64) (limit.Decision, error) {
	return s.st().Take(ctx, c, cost)
}
func (s *swappable) Renew(ctx context.Context, c []limit.Check, lease string) (bool, error) {
	return s.st().Renew(ctx, c, lease)
}
func (s *swappable) Refund(ctx context.Context, c []limit.Check, cost int64, lease string) error {
	return s.st().Refund(ctx, c, cost, lease)
}
func (s *swappable) Release(ctx context.Context, c []limit.Check, lease string) error {
	return s.st().Release(ctx, c, lease)
}
func (s *swappable) TakeMetered(ctx context.Context, c []limit.Check, m limit.Meter, cost int64) (limit.Decision, limit.MeterResult, error) {
	return s.st().TakeMetered(ctx, c, m, cost)
}
func (s *swappable) Adjust(ctx context.Context, m limit.Meter, d limit.Usage) (limit.MeterResult, error) {
	return s.st().Adjust(ctx, m, d)
}
func (s *swappable) ReadMeter(ctx context.Context, key string) (limit.MeterState, bool, error) {
	return s.st().ReadMeter(ctx, key)
}
func (s *swappable) MarkFlushed(ctx context.Context, key, gen string, u limit.Usage) error {
	return s.st().MarkFlushed(ctx, key, gen, u)
}
func (s *swappable) ScanMeters(ctx context.Context, fn func(limit.MeterState) error) error {
	return s.st().ScanMeters(ctx, fn)
}
func (s *swappable) ReportOutcome(ctx context.Context, b limit.BreakerSpec, failed, probe bool) (limit.BreakerState, error) {
	return s.st().ReportOutcome(ctx, b, failed, probe)
}
func (s *swappable) AddDenials(ctx context.Context, b limit.BreakerSpec, n int64) (limit.BreakerState, error) {
	return s.st().AddDenials(ctx, b, n)
}
func (s *swappable) ReleaseProbe(ctx context.Context, b limit.BreakerSpec) error {
	return s.st().ReleaseProbe(ctx, b)
}
func (s *swappable) ListBreakers(ctx context.Context, fn func(limit.BreakerInfo) error) error {
	return s.st().ListBreakers(ctx, fn)
}
func (s *swappable) ResetBreaker(ctx context.Context, key string) (bool, error) {
	return s.st().ResetBreaker(ctx, key)
}

// billingEngine is an engine over shared, metering every call of tool llm
// (cost 3) into us, flushing every flush (and in the flusher's first sweep,
// which it waits for: a flush between a lost reply and a data loss is the
// one case where an op placed again counts twice, see docs/design.md).
func billingEngine(t *testing.T, shared *faultyStore, tool string, us usage.Store, flush time.Duration) *enforce.Engine {
	t.Helper()
	cfg, err := policy.Parse("billing.yaml", []byte(`upstream: {url: "http://127.0.0.1:1/mcp"}
auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}
store: {timeout: 1s, on_error: open}
usage: {flush_interval: `+flush.String()+`}
tiers:
  free: {}
tools:
  llm: {cost: 3`+tool+`}
`))
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforce.New(enforce.Options{Config: cfg, Usage: us, Shared: shared, Probe: func(context.Context) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	select {
	case <-shared.swept:
	case <-time.After(10 * time.Second):
		t.Fatal("the flusher never swept the store")
	}
	return e
}

func openSQLite(t *testing.T) *sqlite.Store {
	t.Helper()
	us, err := sqlite.Open(filepath.Join(t.TempDir(), "usage.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { us.Close() })
	return us
}

// billed closes e (its final placement and flush) and checks the durable
// usage: calls admitted, 3 units each.
func billed(t *testing.T, e *enforce.Engine, us usage.Store, calls int64) {
	t.Helper()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	rec, _, err := us.Get(context.Background(), "acme", usage.Period(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if rec.NetCalls() != calls || rec.Used() != 3*calls {
		t.Errorf("durable usage %+v: %d calls, %d units billed; want %d calls, %d units (every admitted call once)",
			rec.Usage, rec.NetCalls(), rec.Used(), calls, 3*calls)
	}
}

var acmeCall = enforce.Call{Tenant: "acme", Subject: "a", Name: "llm"}

// admitN makes n calls and reports how many were admitted.
func admitN(t *testing.T, e *enforce.Engine, n int, before func(i int) context.Context) (admitted int64) {
	t.Helper()
	for i := range n {
		ctx := context.Background()
		if before != nil {
			ctx = before(i)
		}
		tk, d := e.Admit(ctx, acmeCall)
		if d.Allowed {
			admitted++
		}
		tk.Done(context.Background(), enforce.Outcome{})
	}
	return admitted
}

// The call that creates a tenant's meter gets no answer (it landed); two
// more calls are charged on that meter; then the limit store loses its
// data. Placed again, the first call's op creates the meter anew: that new
// life must not take the lost one's generation id (it used to be the
// creating op's), or the other two calls, charged in the lost one, would
// be judged still counted and never billed.
func TestMeterRecreatedAfterLoss(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		mem := newSwappable(t)
		shared := newFaultyStore(mem)
		us := openSQLite(t)
		e := billingEngine(t, shared, "", us, time.Hour)
		shared.loseSeeded.Store(true)
		n := admitN(t, e, 3, nil)
		mem.restartEmpty()
		billed(t, e, us, n)
	})
	t.Run("redis", func(t *testing.T) {
		shared, flushAll := redisFaultyStore(t)
		us := openSQLite(t)
		e := billingEngine(t, shared, "", us, time.Hour)
		shared.loseSeeded.Store(true)
		n := admitN(t, e, 3, nil)
		flushAll()
		billed(t, e, us, n)
	})
}

// A call whose metered charge may have landed but which is then refused
// (its reply lost under on_error: closed: 503; or its caller gone while the
// charge ran) never reached the upstream: it is not billed.
func TestRefusedCallIsNotBilled(t *testing.T) {
	for _, tc := range []struct {
		name, tool string
		fault      func(*faultyStore, context.CancelFunc)
	}{
		{"closed, reply lost", ", on_error: closed", func(s *faultyStore, _ context.CancelFunc) { s.loseNext.Store(true) }},
		{"caller gone", "", func(s *faultyStore, cancel context.CancelFunc) { f := func() { cancel() }; s.onLand.Store(&f) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shared := newFaultyStore(newSwappable(t))
			us := openSQLite(t)
			e := billingEngine(t, shared, tc.tool, us, time.Hour)
			n := admitN(t, e, 3, func(i int) context.Context {
				ctx, cancel := context.WithCancel(context.Background())
				t.Cleanup(cancel)
				if i == 1 {
					tc.fault(shared, cancel)
				}
				return ctx
			})
			if n != 2 {
				t.Fatalf("%d of 3 calls admitted, want 2 (the second refused)", n)
			}
			billed(t, e, us, n)
		})
	}
}

// A call whose caller is gone before Admit is refused before the store did
// anything (a store checks ctx before any work, and the in-process store
// never loses an answer): there is no charge to take back, and the usage
// store must not show it admitted and refunded (calls_admitted 1,
// refunded_calls 1, for a call never admitted).
func TestCallerGoneBeforeAdmitIsNotCounted(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(map[bool]string{false: "in process", true: "shared"}[shared], func(t *testing.T) {
			us := openSQLite(t)
			o := enforce.Options{Usage: us}
			if shared {
				o.Shared, o.Probe = newSwappable(t), func(context.Context) error { return nil }
			}
			e := newEngine(t, `upstream: {url: "http://127.0.0.1:1/mcp"}
usage: {flush_interval: 1h}
tools:
  llm: {cost: 3}
`, o)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			tk, d := e.Admit(ctx, acmeCall)
			tk.Done(context.Background(), enforce.Outcome{})
			if d.Allowed {
				t.Fatal("admitted with its caller gone")
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			rec, found, err := us.Get(context.Background(), "acme", usage.Period(time.Now()))
			if err != nil {
				t.Fatal(err)
			}
			if found && (rec.Calls != 0 || rec.RefundedCalls != 0) {
				t.Errorf("usage store holds %+v for a call never admitted", rec.Usage)
			}
		})
	}
}

// redisFaultyStore is the Redis store on a redis-server of its own, and a
// function that loses all its data (FLUSHALL: Redis restarted empty).
func redisFaultyStore(t *testing.T) (*faultyStore, func()) {
	t.Helper()
	r := testenv.StartRedis(t, nil)
	client, admin := r.Client(t), r.Client(t)
	rs, err := redisstore.New(client, &redisstore.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Close)
	return newFaultyStore(rs), func() {
		if err := admin.Do(context.Background(), admin.B().Flushall().Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
}

// putFailing is a usage store whose Put fails while down.
type putFailing struct {
	usage.Store
	down atomic.Bool
}

func (s *putFailing) Put(ctx context.Context, recs []usage.Record) error {
	if s.down.Load() {
		return usage.ErrUnavailable
	}
	return s.Store.Put(ctx, recs)
}

// A metered charge lands on Redis, its reply is lost, and the engine
// places the op again: the store answers with the charge's own answer (not
// "already counted"), so the engine journals the call like the others.
// While the usage store is down nothing is flushed; when the limit store
// then loses its data, the journal places every call again, this one
// included.
func TestPlacedAgainChargeIsJournaled(t *testing.T) {
	sq := openSQLite(t)
	us := &putFailing{Store: sq}
	shared, flushAll := redisFaultyStore(t)
	e := billingEngine(t, shared, "", us, 100*time.Millisecond)
	us.down.Store(true)
	n := admitN(t, e, 2, func(i int) context.Context {
		if i == 1 {
			shared.loseNext.Store(true) // the second call's reply is lost: its op is pending
		}
		return context.Background()
	})
	// The engine places pending usage every flush interval.
	for deadline := time.Now().Add(10 * time.Second); e.PendingUsage() > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("usage still pending: %d meters", e.PendingUsage())
		}
	}
	flushAll()
	us.down.Store(false)
	billed(t, e, sq, n)
}

// A call admitted on a meter re-created after a data loss ends after the
// store lost the meter again, usage flushed in between: its cost
// correction must re-create the meter from the durable total as it is now,
// not from the seed read at the call's admission. Seeded with that older
// total, the meter would count the usage flushed since as not yet charged,
// and the durable store (which only ever raises a total) would absorb
// every later call up to it: never billed.
func TestCorrectionAfterASecondLossReseedsFromTheDurableTotal(t *testing.T) {
	mem := newSwappable(t)
	shared := newFaultyStore(mem)
	us := openSQLite(t)
	e := billingEngine(t, shared, "", us, time.Hour)
	ctx := context.Background()

	admitN(t, e, 1, nil) // 1 call, 3 units
	if err := e.Flusher().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	mem.restartEmpty() // Redis restarted empty (or evicted the meter)

	// Call B is admitted on the re-seeded meter; it is still running.
	tkB, d := e.Admit(ctx, acmeCall)
	if !d.Allowed {
		t.Fatalf("B refused: %+v", d)
	}
	admitN(t, e, 5, nil) // 5 more calls, flushed
	if err := e.Flusher().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	mem.restartEmpty() // the meter is lost again

	// B ends and reports a cost of 5 (estimate 3): +2 units.
	tkB.Done(ctx, enforce.Outcome{Cost: 5})
	admitN(t, e, 3, nil) // 3 more calls
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	rec, _, err := us.Get(ctx, "acme", usage.Period(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	const calls = 1 + 1 + 5 + 3
	if rec.Calls != calls || rec.Used() != 3*calls+2 {
		t.Errorf("durable usage %+v: %d calls, %d units; want %d calls, %d units", rec.Usage, rec.Calls, rec.Used(), calls, 3*calls+2)
	}
}
