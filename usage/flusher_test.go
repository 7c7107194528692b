package usage_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/memstore"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/sqlite"
	"github.com/mcpgate/mcpgate/usage/usagetest"
)

var (
	_ limit.MeteredStore = (*memstore.Store)(nil)

	ctxT = usagetest.Ctx
	want = usagetest.Want
)

// grace is how long a meter outlives its period, for its last flush.
const grace = 48 * time.Hour

// period is the billing period most tests charge: the current one, since a
// store refuses a meter whose period (and grace) has passed on its clock.
var period = usage.Period(time.Now())

// clock is a settable time source for the memory store and the Flusher.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func newMem(t *testing.T, c memstore.Clock) *memstore.Store {
	t.Helper()
	s, err := memstore.New(&memstore.Options{Clock: c})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newSQLite(t *testing.T, path string) *sqlite.Store {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "usage.db")
	}
	s, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Init(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	return s
}

// quiet is a Logger for Flushers whose failures a test provokes on purpose.
func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func meter(t *testing.T, tenant, period string) limit.Meter {
	t.Helper()
	end, err := usage.PeriodEnd(period)
	if err != nil {
		t.Fatal(err)
	}
	return limit.Meter{Key: keyspace.Usage(tenant, period), Tenant: tenant, Period: period, ExpireAt: end.Add(grace)}
}

// charge admits one call of cost against tenant's meter the way the gateway
// does: unseeded first, and on NeedSeed again with the durable total from
// f.Seed. f may be nil for an instance that never seeds (the meter must
// then exist). It tracks the meter in track when not nil.
func charge(t *testing.T, ms limit.MeteredStore, f, track *usage.Flusher, tenant, period string, cost int64) limit.Usage {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	m := meter(t, tenant, period)
	for range 2 {
		d, mr, err := ms.TakeMetered(ctx, nil, m, cost)
		if err != nil {
			t.Fatalf("TakeMetered: %v", err)
		}
		if mr.NeedSeed {
			if f == nil || m.Seeded {
				t.Fatalf("meter %s needs a seed", m.Key)
			}
			if m.Seed, err = f.Seed(ctx, tenant, period); err != nil {
				t.Fatalf("Seed: %v", err)
			}
			m.Seeded = true
			continue
		}
		if !d.Allowed {
			t.Fatalf("call denied: %+v %+v", d, mr)
		}
		if track != nil {
			track.Track(m.Key)
		}
		return mr.Usage
	}
	t.Fatal("unreachable")
	return limit.Usage{}
}

// live returns the meter's state, failing when the store lacks it.
func live(t *testing.T, ms limit.MeteredStore, tenant, period string) limit.MeterState {
	t.Helper()
	st, ok, err := ms.ReadMeter(ctxT(t, 10*time.Second), keyspace.Usage(tenant, period))
	if err != nil || !ok {
		t.Fatalf("ReadMeter(%s, %s) = %v, %v", tenant, period, ok, err)
	}
	return st
}

func TestFlushWritesTrackedMeters(t *testing.T) {
	ms := newMem(t, nil)
	st := newSQLite(t, "")
	f := usage.NewFlusher(ms, st, nil)
	for range 5 {
		charge(t, ms, f, f, "acme", period, 3)
	}
	charge(t, ms, f, f, "globex", period, 1)
	if _, err := ms.Adjust(t.Context(), meter(t, "acme", period), limit.Usage{Refunded: 2, RefundedCalls: 1}); err != nil {
		t.Fatal(err)
	}
	if got := f.Pending(); got != 2 {
		t.Fatalf("Pending = %d, want 2", got)
	}
	if err := f.Flush(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	want(t, st, "acme", period, limit.Usage{Charged: 15, Refunded: 2, Calls: 5, RefundedCalls: 1})
	want(t, st, "globex", period, limit.Usage{Charged: 1, Calls: 1})
	if s := live(t, ms, "acme", period); s.Flushed != s.Live {
		t.Fatalf("after Flush the meter is %+v: flushed part not recorded", s)
	}
	if got := f.Pending(); got != 0 {
		t.Fatalf("Pending after Flush = %d, want 0", got)
	}
}

// A flush that wrote its snapshot but died before MarkFlushed, a duplicate
// flush by another instance, a concurrent one: nothing counts twice.
func TestRetriedFlushDoesNotDoubleCount(t *testing.T) {
	ms := newMem(t, nil)
	st := newSQLite(t, "")
	f := usage.NewFlusher(ms, st, nil)
	other := usage.NewFlusher(ms, st, nil)
	for range 4 {
		charge(t, ms, f, f, "acme", period, 5)
	}
	// The snapshot lands, the mark is lost (a crash in between).
	s := live(t, ms, "acme", period)
	if err := st.Put(t.Context(), []usage.Record{{Tenant: "acme", Period: period, Usage: s.Live}}); err != nil {
		t.Fatal(err)
	}
	// Flushed twice, and by another instance's sweep at the same time.
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if err := f.Flush(t.Context()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Go(func() {
		if err := other.Sweep(t.Context()); err != nil {
			t.Error(err)
		}
	})
	wg.Wait()
	f.Track(keyspace.Usage("acme", period))
	if err := f.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	want(t, st, "acme", period, limit.Usage{Charged: 20, Calls: 4})

	charge(t, ms, f, f, "acme", period, 5)
	for range 2 {
		f.Track(keyspace.Usage("acme", period))
		if err := f.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	want(t, st, "acme", period, limit.Usage{Charged: 25, Calls: 5})
}

// switchable is a usage.Store whose real store can be closed (an outage:
// every call fails as a closed database does) and replaced by one opened
// again on the same file (the store is back).
type switchable struct {
	mu sync.Mutex
	s  *sqlite.Store
}

func (w *switchable) cur() *sqlite.Store {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.s
}

func (w *switchable) swap(s *sqlite.Store) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.s = s
}

func (w *switchable) Init(ctx context.Context) error  { return w.cur().Init(ctx) }
func (w *switchable) Check(ctx context.Context) error { return w.cur().Check(ctx) }
func (w *switchable) Put(ctx context.Context, recs []usage.Record) error {
	return w.cur().Put(ctx, recs)
}
func (w *switchable) Get(ctx context.Context, tenant, period string) (usage.Record, bool, error) {
	return w.cur().Get(ctx, tenant, period)
}
func (w *switchable) Close() error { return w.cur().Close() }

// The usage store is down for a while: calls keep being admitted and
// counted, flushes fail and keep their keys, and when it is back the totals
// land, exact.
func TestStoreDownThenBack(t *testing.T) {
	ms := newMem(t, nil)
	path := filepath.Join(t.TempDir(), "usage.db")
	w := &switchable{s: newSQLite(t, path)}
	f := usage.NewFlusher(ms, w, &usage.FlusherOptions{
		Interval: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond, Logger: quiet(),
	})
	charge(t, ms, f, f, "acme", period, 2)
	charge(t, ms, f, f, "globex", period, 7)
	if err := f.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	want(t, w.cur(), "acme", period, limit.Usage{Charged: 2, Calls: 1})

	w.cur().Close() // down
	for range 3 {
		charge(t, ms, f, f, "acme", period, 2)
		charge(t, ms, f, f, "globex", period, 7)
	}
	// A meter that needs a seed cannot get one: guessing would lose usage.
	if _, err := f.Seed(t.Context(), "initech", period); !errors.Is(err, usage.ErrUnavailable) {
		t.Fatalf("Seed with the store down = %v, want ErrUnavailable", err)
	}
	err := f.Flush(t.Context())
	if !errors.Is(err, usage.ErrUnavailable) {
		t.Fatalf("Flush with the store down = %v, want ErrUnavailable", err)
	}
	if got := f.Pending(); got != 2 {
		t.Fatalf("Pending after a failed flush = %d, want 2: the keys must stay tracked", got)
	}

	// Run keeps failing (with backoff) while the store is down...
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	time.Sleep(100 * time.Millisecond)
	charge(t, ms, f, f, "acme", period, 2)
	if s := live(t, ms, "acme", period); s.Flushed.Charged != 2 {
		t.Fatalf("flushed part moved while the store was down: %+v", s)
	}

	// ...and when it is back the totals land without anyone calling Flush.
	w.swap(newSQLite(t, path))
	deadline := time.Now().Add(5 * time.Second)
	for {
		a := live(t, ms, "acme", period)
		g := live(t, ms, "globex", period)
		if a.Flushed == a.Live && g.Flushed == g.Live {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not flushed 5s after the store came back: %+v %+v", a, g)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	want(t, w.cur(), "acme", period, limit.Usage{Charged: 10, Calls: 5})
	want(t, w.cur(), "globex", period, limit.Usage{Charged: 28, Calls: 4})
}

// An instance charges and dies before flushing: another instance's sweep
// writes its meters, and so does the sweep a Flusher makes when Run starts.
func TestSweepWritesDeadInstancesMeters(t *testing.T) {
	ms := newMem(t, nil)
	st := newSQLite(t, "")
	dead := usage.NewFlusher(ms, st, nil) // used to seed only: it never flushes
	for range 3 {
		charge(t, ms, dead, nil, "acme", period, 4)
	}
	charge(t, ms, dead, nil, "globex", period, 1)

	survivor := usage.NewFlusher(ms, st, nil)
	if survivor.Pending() != 0 {
		t.Fatal("the survivor tracks nothing")
	}
	if err := survivor.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	usagetest.WantNone(t, st, "acme", period)
	if err := survivor.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	want(t, st, "acme", period, limit.Usage{Charged: 12, Calls: 3})
	want(t, st, "globex", period, limit.Usage{Charged: 1, Calls: 1})

	// More unflushed usage; a restarted instance's Run sweeps at once.
	charge(t, ms, dead, nil, "acme", period, 4)
	restarted := usage.NewFlusher(ms, st, &usage.FlusherOptions{Interval: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- restarted.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for s := live(t, ms, "acme", period); s.Flushed != s.Live; s = live(t, ms, "acme", period) {
		if time.Now().After(deadline) {
			t.Fatalf("Run's startup sweep did not flush %+v", s)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	want(t, st, "acme", period, limit.Usage{Charged: 16, Calls: 4})
}

// Graceful shutdown: cancelling Run flushes what is tracked, even with a
// flush interval that never came.
func TestRunFinalFlush(t *testing.T) {
	ms := newMem(t, nil)
	st := newSQLite(t, "")
	var logs bytes.Buffer
	f := usage.NewFlusher(ms, st, &usage.FlusherOptions{
		Interval: time.Hour, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	for range 7 {
		charge(t, ms, f, f, "acme", period, 1)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	want(t, st, "acme", period, limit.Usage{Charged: 7, Calls: 7})
	if !bytes.Contains(logs.Bytes(), []byte("final flush done")) {
		t.Fatalf("no final flush in the log:\n%s", logs.String())
	}
}

// The final flush reports a store it could not reach.
func TestRunFinalFlushFailure(t *testing.T) {
	ms := newMem(t, nil)
	st := newSQLite(t, "")
	f := usage.NewFlusher(ms, st, &usage.FlusherOptions{Interval: time.Hour, Logger: quiet()})
	charge(t, ms, f, f, "acme", period, 1)
	st.Close() // before Run: its first flush fails too, and keeps the key
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	cancel()
	if err := <-done; !errors.Is(err, usage.ErrUnavailable) {
		t.Fatalf("Run = %v, want ErrUnavailable from the final flush", err)
	}
}

// Calls on both sides of midnight at the end of a month are counted in their
// own periods, each its own meter and record.
func TestMonthRollover(t *testing.T) {
	c := &clock{t: time.Date(2026, 1, 31, 23, 59, 59, 500_000_000, time.UTC)}
	ms := newMem(t, c)
	st := newSQLite(t, "")
	f := usage.NewFlusher(ms, st, &usage.FlusherOptions{Now: c.Now})

	jan := usage.Period(c.Now())
	charge(t, ms, f, f, "acme", jan, 3)
	c.Set(time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC))
	feb := usage.Period(c.Now())
	if jan != "2026-01" || feb != "2026-02" {
		t.Fatalf("periods %q, %q", jan, feb)
	}
	charge(t, ms, f, f, "acme", feb, 5)
	// A late correction of a January call still lands in January.
	if _, err := ms.Adjust(t.Context(), meter(t, "acme", jan), limit.Usage{Refunded: 1}); err != nil {
		t.Fatal(err)
	}
	f.Track(keyspace.Usage("acme", jan))
	if err := f.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	j := want(t, st, "acme", jan, limit.Usage{Charged: 3, Refunded: 1, Calls: 1})
	want(t, st, "acme", feb, limit.Usage{Charged: 5, Calls: 1})
	if !j.UpdatedAt.Equal(c.Now()) {
		t.Fatalf("UpdatedAt = %v, want the injected clock's %v", j.UpdatedAt, c.Now())
	}

	// After the grace, January's meter is gone from the live store; its
	// total stays in the durable one.
	c.Set(time.Date(2026, 2, 3, 0, 0, 1, 0, time.UTC))
	if _, ok, _ := ms.ReadMeter(t.Context(), keyspace.Usage("acme", jan)); ok {
		t.Fatal("January's meter outlived its grace")
	}
	want(t, st, "acme", jan, limit.Usage{Charged: 3, Refunded: 1, Calls: 1})
}

// A restarted memory store has no meters: the next call is re-seeded from the
// durable total, and later flushes raise it by exactly the new usage.
func TestReseedAfterRestart(t *testing.T) {
	st := newSQLite(t, "")
	ms := newMem(t, nil)
	f := usage.NewFlusher(ms, st, nil)
	for range 3 {
		charge(t, ms, f, f, "acme", period, 10)
	}
	if err := f.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}

	ms2 := newMem(t, nil) // the process restarted
	f2 := usage.NewFlusher(ms2, st, nil)
	if got := charge(t, ms2, f2, f2, "acme", period, 10); got != (limit.Usage{Charged: 40, Calls: 4}) {
		t.Fatalf("re-seeded meter after one call = %+v, want the durable total plus the call", got)
	}
	if err := f2.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	want(t, st, "acme", period, limit.Usage{Charged: 40, Calls: 4})

	// Seed of an unknown tenant is zero, and concurrent seeds agree.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			u, err := f2.Seed(t.Context(), "acme", period)
			if err != nil || u != (limit.Usage{Charged: 40, Calls: 4}) {
				t.Errorf("Seed = %+v, %v", u, err)
			}
			if u, err := f2.Seed(t.Context(), "nobody", period); err != nil || u != (limit.Usage{}) {
				t.Errorf("Seed(nobody) = %+v, %v", u, err)
			}
		})
	}
	wg.Wait()
}

// A meter no store can take (a malformed period) is reported and does not
// hold back the others.
func TestBadMeterDoesNotBlockOthers(t *testing.T) {
	ms := newMem(t, nil)
	st := newSQLite(t, "")
	var logs bytes.Buffer
	f := usage.NewFlusher(ms, st, &usage.FlusherOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	bad := limit.Meter{Key: keyspace.Usage("acme", "someday"), Tenant: "acme", Period: "someday",
		ExpireAt: time.Now().Add(time.Hour), Seeded: true}
	if _, _, err := ms.TakeMetered(t.Context(), nil, bad, 1); err != nil {
		t.Fatal(err)
	}
	f.Track(bad.Key)
	charge(t, ms, f, f, "acme", period, 2)
	if err := f.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	want(t, st, "acme", period, limit.Usage{Charged: 2, Calls: 1})
	if !bytes.Contains(logs.Bytes(), []byte("cannot be stored")) {
		t.Fatalf("the bad meter was not reported:\n%s", logs.String())
	}
}

// refusing is a usage.Store that refuses, as DynamoDB refuses a key it
// cannot hold, the records of one tenant that Record.Validate lets by; it
// puts the others in a real store.
type refusing struct {
	usage.Store
	tenant string
}

func (r refusing) Put(ctx context.Context, recs []usage.Record) error {
	for _, rec := range recs {
		if rec.Tenant == r.tenant {
			// DynamoDB attempts the other records all the same.
			_ = r.Store.Put(ctx, slices.DeleteFunc(slices.Clone(recs), func(x usage.Record) bool { return x.Tenant == r.tenant }))
			return fmt.Errorf("%w: the store refuses tenant %q", usage.ErrInvalidRecord, r.tenant)
		}
	}
	return r.Store.Put(ctx, recs)
}

// A meter the usage store refuses, though Validate lets it by, is reported
// and set aside: the other meters of its batch land, the flush succeeds, so
// Run keeps sweeping, and the usage of an instance that died (found by a
// sweep only) lands too, rather than every flush failing for ever.
func TestRefusedMeterDoesNotStopFlushesOrSweeps(t *testing.T) {
	ms := newMem(t, nil)
	st := newSQLite(t, "")
	var logs syncBuffer
	f := usage.NewFlusher(ms, refusing{Store: st, tenant: "refused"}, &usage.FlusherOptions{
		Interval: 10 * time.Millisecond, SweepEvery: 2, MaxBackoff: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	charge(t, ms, f, f, "refused", period, 3)
	charge(t, ms, f, f, "acme", period, 2)
	if err := f.Flush(t.Context()); err != nil {
		t.Fatalf("Flush with one meter refused = %v, want nil", err)
	}
	want(t, st, "acme", period, limit.Usage{Charged: 2, Calls: 1})
	usagetest.WantNone(t, st, "refused", period)
	if !strings.Contains(logs.String(), "refuses a meter") {
		t.Fatalf("the refused meter was not reported:\n%s", logs.String())
	}

	// This instance charges the refused tenant again; another one charged
	// "victim" and died: only a sweep finds its meter.
	charge(t, ms, f, f, "refused", period, 3)
	dead := usage.NewFlusher(ms, st, nil)
	charge(t, ms, dead, nil, "victim", period, 5)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for s := live(t, ms, "victim", period); s.Flushed != s.Live; s = live(t, ms, "victim", period) {
		if time.Now().After(deadline) {
			t.Fatalf("the dead instance's meter was not swept in 5 s: %+v (health %+v)", s, f.Health())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run's final flush: %v", err)
	}
	want(t, st, "victim", period, limit.Usage{Charged: 5, Calls: 1})
	usagetest.WantNone(t, st, "refused", period)
}

// syncBuffer is a bytes.Buffer that a Flusher's logger may write from Run
// while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestTrackAllocatesNothingWhenTracked(t *testing.T) {
	f := usage.NewFlusher(newMem(t, nil), newSQLite(t, ""), nil)
	key := keyspace.Usage("acme", period)
	f.Track(key)
	if n := testing.AllocsPerRun(1000, func() { f.Track(key) }); n != 0 {
		t.Fatalf("Track of a tracked key allocates %v times", n)
	}
}

func TestPeriod(t *testing.T) {
	cet := time.FixedZone("CET", 3600)
	for _, tc := range []struct {
		t    time.Time
		want string
	}{
		{time.Date(2026, 11, 30, 23, 59, 59, 0, time.UTC), "2026-11"},
		{time.Date(2026, 12, 1, 0, 30, 0, 0, cet), "2026-11"}, // still November in UTC
		{time.Date(2026, 12, 1, 1, 0, 0, 0, cet), "2026-12"},
	} {
		if got := usage.Period(tc.t); got != tc.want {
			t.Errorf("Period(%v) = %q, want %q", tc.t, got, tc.want)
		}
	}
	for period, end := range map[string]time.Time{
		"2026-11": time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		"2026-12": time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC),
		"2028-02": time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC),
	} {
		if got, err := usage.PeriodEnd(period); err != nil || !got.Equal(end) {
			t.Errorf("PeriodEnd(%q) = %v, %v; want %v", period, got, err, end)
		}
	}
	for _, bad := range []string{"", "2026-1", "2026-13", "2026-00", "26-11", "2026-11-01", "2026/11", " 2026-11"} {
		if _, err := usage.PeriodEnd(bad); err == nil {
			t.Errorf("PeriodEnd(%q) succeeded", bad)
		}
	}
}

// OnFailure hears of every failed flush and sweep, and of no successful one.
func TestOnFailureCountsFailedFlushes(t *testing.T) {
	ms := newMem(t, nil)
	st := newSQLite(t, "")
	var (
		mu  sync.Mutex
		ops []string
	)
	f := usage.NewFlusher(ms, st, &usage.FlusherOptions{Logger: quiet(), OnFailure: func(op string) {
		mu.Lock()
		ops = append(ops, op)
		mu.Unlock()
	}})
	charge(t, ms, f, f, "acme", period, 1)
	if err := f.Flush(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("Flush = %v", err)
	}
	charge(t, ms, f, f, "acme", period, 1)
	st.Close()
	if err := f.Flush(ctxT(t, 10*time.Second)); err == nil {
		t.Fatal("Flush to a closed store succeeded")
	}
	// The meter the failed flush left unflushed is the sweep's to write.
	if err := f.Sweep(ctxT(t, 10*time.Second)); err == nil {
		t.Fatal("Sweep to a closed store succeeded")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ops) != 2 || ops[0] != "flush" || ops[1] != "sweep" {
		t.Fatalf("OnFailure calls = %q, want [flush sweep]", ops)
	}
}
