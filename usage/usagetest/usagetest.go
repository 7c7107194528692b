// Package usagetest is the conformance suite every usage.Store passes: the
// same tests run against each backend's real server (an SQLite file, a
// DynamoDB emulator), so the backends agree on what Put, Get, Init and Check
// mean.
package usagetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
)

// Open returns a new, empty and uninitialized store, closed when t ends.
type Open func(t *testing.T) usage.Store

// Run runs the conformance tests, each on a store of its own from open.
func Run(t *testing.T, open Open) {
	tests := []struct {
		name string
		fn   func(*testing.T, Open)
	}{
		{"InitIdempotent", testInitIdempotent},
		{"NotInitialized", testNotInitialized},
		{"Monotonic", testMonotonic},
		{"UnorderedMerge", testUnorderedMerge},
		{"BatchOfMany", testBatchOfMany},
		{"InvalidRecord", testInvalidRecord},
		{"ConcurrentSnapshots", testConcurrentSnapshots},
		{"Closed", testClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open) })
	}
}

// Ctx returns a context that ends with the test or after d.
func Ctx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// Ready returns a new store with Init done.
func Ready(t *testing.T, open Open) usage.Store {
	t.Helper()
	s := open(t)
	if err := s.Init(Ctx(t, 30*time.Second)); err != nil {
		t.Fatalf("Init: %v", err)
	}
	return s
}

// Want fails t unless the store holds exactly u for tenant in period.
func Want(t *testing.T, s usage.Store, tenant, period string, u limit.Usage) usage.Record {
	t.Helper()
	rec, ok, err := s.Get(Ctx(t, 10*time.Second), tenant, period)
	switch {
	case err != nil:
		t.Fatalf("Get(%q, %q): %v", tenant, period, err)
	case !ok:
		t.Fatalf("Get(%q, %q): no record, want %+v", tenant, period, u)
	case rec.Usage != u || rec.Tenant != tenant || rec.Period != period:
		t.Fatalf("Get(%q, %q) = %+v, want %+v", tenant, period, rec, u)
	}
	return rec
}

// WantNone fails t unless the store holds nothing for tenant in period.
func WantNone(t *testing.T, s usage.Store, tenant, period string) {
	t.Helper()
	rec, ok, err := s.Get(Ctx(t, 10*time.Second), tenant, period)
	if err != nil || ok {
		t.Fatalf("Get(%q, %q) = %+v, %v, %v; want no record", tenant, period, rec, ok, err)
	}
}

func put(t *testing.T, s usage.Store, recs ...usage.Record) {
	t.Helper()
	if err := s.Put(Ctx(t, 30*time.Second), recs); err != nil {
		t.Fatalf("Put: %v", err)
	}
}

func rec(tenant, period string, u limit.Usage, at time.Time) usage.Record {
	return usage.Record{Tenant: tenant, Period: period, Usage: u, UpdatedAt: at}
}

func u(c, r, n, rn int64) limit.Usage {
	return limit.Usage{Charged: c, Refunded: r, Calls: n, RefundedCalls: rn}
}

var t0 = time.Date(2026, 11, 3, 10, 0, 0, 123456789, time.UTC)

func testInitIdempotent(t *testing.T, open Open) {
	s := open(t)
	ctx := Ctx(t, 30*time.Second)
	for i := range 2 {
		if err := s.Init(ctx); err != nil {
			t.Fatalf("Init #%d: %v", i+1, err)
		}
		if err := s.Check(ctx); err != nil {
			t.Fatalf("Check after Init #%d: %v", i+1, err)
		}
	}
	// A third Init after data was written keeps it.
	put(t, s, rec("acme", "2026-11", u(5, 1, 2, 0), t0))
	if err := s.Init(ctx); err != nil {
		t.Fatalf("Init over data: %v", err)
	}
	Want(t, s, "acme", "2026-11", u(5, 1, 2, 0))
}

func testNotInitialized(t *testing.T, open Open) {
	s := open(t)
	ctx := Ctx(t, 30*time.Second)
	if err := s.Check(ctx); !errors.Is(err, usage.ErrNotInitialized) {
		t.Fatalf("Check before Init = %v, want ErrNotInitialized", err)
	}
	if err := s.Put(ctx, []usage.Record{rec("acme", "2026-11", u(1, 0, 1, 0), t0)}); !errors.Is(err, usage.ErrNotInitialized) {
		t.Fatalf("Put before Init = %v, want ErrNotInitialized", err)
	}
	if _, _, err := s.Get(ctx, "acme", "2026-11"); !errors.Is(err, usage.ErrNotInitialized) {
		t.Fatalf("Get before Init = %v, want ErrNotInitialized", err)
	}
}

func testMonotonic(t *testing.T, open Open) {
	s := Ready(t, open)
	const tenant, period = "acme", "2026-11"
	WantNone(t, s, tenant, period)

	put(t, s, rec(tenant, period, u(10, 2, 5, 1), t0))
	got := Want(t, s, tenant, period, u(10, 2, 5, 1))
	if !got.UpdatedAt.Equal(t0) {
		t.Fatalf("UpdatedAt = %v, want %v", got.UpdatedAt, t0)
	}

	// A lower snapshot (an older flush landing late) and an equal one (a
	// retried flush) change nothing, not even UpdatedAt.
	put(t, s, rec(tenant, period, u(7, 1, 3, 0), t0.Add(time.Minute)))
	put(t, s, rec(tenant, period, u(10, 2, 5, 1), t0.Add(2*time.Minute)))
	put(t, s, rec(tenant, period, u(10, 2, 5, 1), t0.Add(3*time.Minute)))
	if got := Want(t, s, tenant, period, u(10, 2, 5, 1)); !got.UpdatedAt.Equal(t0) {
		t.Fatalf("UpdatedAt moved to %v by a write that added nothing", got.UpdatedAt)
	}

	// A higher one is applied; retrying it counts nothing twice.
	later := t0.Add(4 * time.Minute)
	for range 3 {
		put(t, s, rec(tenant, period, u(25, 4, 12, 1), later))
	}
	if got := Want(t, s, tenant, period, u(25, 4, 12, 1)); !got.UpdatedAt.Equal(later) {
		t.Fatalf("UpdatedAt = %v, want %v", got.UpdatedAt, later)
	}
	// One field higher is enough.
	put(t, s, rec(tenant, period, u(25, 4, 12, 2), later))
	Want(t, s, tenant, period, u(25, 4, 12, 2))

	// Tenants and periods are independent.
	put(t, s, rec(tenant, "2026-12", u(1, 0, 1, 0), later), rec("other", period, u(3, 0, 3, 0), later))
	Want(t, s, tenant, period, u(25, 4, 12, 2))
	Want(t, s, tenant, "2026-12", u(1, 0, 1, 0))
	Want(t, s, "other", period, u(3, 0, 3, 0))
	WantNone(t, s, "other", "2026-12")
}

// Two counters of one period (a re-seeded meter racing a late flush of the
// one it replaced) give snapshots that are not ordered: no field may go down.
func testUnorderedMerge(t *testing.T, open Open) {
	s := Ready(t, open)
	put(t, s, rec("acme", "2026-11", u(10, 5, 3, 1), t0))
	put(t, s, rec("acme", "2026-11", u(12, 2, 3, 0), t0))
	Want(t, s, "acme", "2026-11", u(12, 5, 3, 1))
	put(t, s, rec("acme", "2026-11", u(11, 6, 4, 0), t0))
	Want(t, s, "acme", "2026-11", u(12, 6, 4, 1))
}

func testBatchOfMany(t *testing.T, open Open) {
	s := Ready(t, open)
	const n = 250 // more than one flusher batch, more than any write bound
	recs := make([]usage.Record, n)
	for i := range recs {
		recs[i] = rec(fmt.Sprintf("tenant-%03d", i), "2026-11", u(int64(i+1), 0, int64(i+1), 0), t0)
	}
	put(t, s, recs...)
	put(t, s, recs...) // a retried flush of the whole batch
	for _, i := range []int{0, 1, 99, 100, 101, 249} {
		Want(t, s, recs[i].Tenant, "2026-11", recs[i].Usage)
	}
}

// Both backends refuse the same records, before writing any of the Put:
// among them tenants that are not valid tenant ids (usage.CheckTenant),
// which one backend would store apart and another merge (DynamoDB's
// encoding replaces invalid UTF-8, so "acme\xff" and "acme\xfe" would be
// billed as one tenant) or refuse as a key (over 2048 bytes) as if the store
// were down.
func testInvalidRecord(t *testing.T, open Open) {
	s := Ready(t, open)
	good := rec("acme", "2026-11", u(1, 0, 1, 0), t0)
	for _, bad := range []usage.Record{
		rec("", "2026-11", u(1, 0, 1, 0), t0),
		rec("acme\xff", "2026-11", u(1, 0, 1, 0), t0),
		rec("acme\xfe", "2026-11", u(1, 0, 1, 0), t0),
		rec(strings.Repeat("t", usage.MaxTenantBytes+1), "2026-11", u(1, 0, 1, 0), t0),
		rec(strings.Repeat("t", 2100), "2026-11", u(1, 0, 1, 0), t0),
		rec("ac\nme", "2026-11", u(1, 0, 1, 0), t0),
		rec("acme", "2026-13", u(1, 0, 1, 0), t0),
		rec("acme", "202611", u(1, 0, 1, 0), t0),
		rec("acme", "2026-11", u(1, -1, 1, 0), t0),
	} {
		err := s.Put(Ctx(t, 10*time.Second), []usage.Record{good, bad})
		if !errors.Is(err, usage.ErrInvalidRecord) {
			t.Fatalf("Put(tenant %.40q period %q usage %+v) = %v, want ErrInvalidRecord", bad.Tenant, bad.Period, bad.Usage, err)
		}
	}
	// Nothing of a refused batch is written.
	WantNone(t, s, "acme", "2026-11")
	if err := s.Put(Ctx(t, 10*time.Second), nil); err != nil {
		t.Fatalf("Put(nil) = %v", err)
	}
	// The longest tenant id allowed, in characters of several bytes, is
	// stored as it is.
	longest := strings.Repeat("é", usage.MaxTenantBytes/2)
	put(t, s, rec(longest, "2026-11", u(3, 0, 2, 0), t0))
	Want(t, s, longest, "2026-11", u(3, 0, 2, 0))
}

// Flushers of several instances write snapshots of one counter in any
// order: the store ends at the largest, whatever the interleaving.
func testConcurrentSnapshots(t *testing.T, open Open) {
	s := Ready(t, open)
	const (
		writers   = 8
		snapshots = 40
		tenants   = 3
	)
	// Snapshot k of tenant j: every field non-decreasing in k.
	snap := func(j, k int) limit.Usage {
		return u(int64(10*k+j), int64(k/3), int64(k), int64(k/7))
	}
	order := rand.Perm(snapshots * tenants)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			// Each writer puts its share, two records at a time, in a
			// shuffled order: later snapshots often land first.
			var batch []usage.Record
			for i := w; i < len(order); i += writers {
				j, k := order[i]%tenants, order[i]/tenants+1
				batch = append(batch, rec(fmt.Sprintf("t%d", j), "2026-11", snap(j, k), t0.Add(time.Duration(k)*time.Second)))
				if len(batch) == 2 {
					if err := s.Put(t.Context(), batch); err != nil {
						errs <- err
						return
					}
					batch = batch[:0]
				}
			}
			if len(batch) > 0 {
				if err := s.Put(t.Context(), batch); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent Put: %v", err)
	}
	for j := range tenants {
		got := Want(t, s, fmt.Sprintf("t%d", j), "2026-11", snap(j, snapshots))
		if want := t0.Add(snapshots * time.Second); !got.UpdatedAt.Equal(want) {
			t.Errorf("tenant %d: UpdatedAt = %v, want %v (that of the largest snapshot)", j, got.UpdatedAt, want)
		}
	}
}

func testClosed(t *testing.T, open Open) {
	s := Ready(t, open)
	put(t, s, rec("acme", "2026-11", u(1, 0, 1, 0), t0))
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ctx := Ctx(t, 10*time.Second)
	if err := s.Put(ctx, []usage.Record{rec("acme", "2026-11", u(2, 0, 2, 0), t0)}); !errors.Is(err, usage.ErrUnavailable) {
		t.Fatalf("Put after Close = %v, want ErrUnavailable", err)
	}
	if _, _, err := s.Get(ctx, "acme", "2026-11"); !errors.Is(err, usage.ErrUnavailable) {
		t.Fatalf("Get after Close = %v, want ErrUnavailable", err)
	}
}
