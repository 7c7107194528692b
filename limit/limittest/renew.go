package limittest

import (
	"context"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// RunRenew holds a limit.Renewer to the semantics of Renew: a held lease
// gets a full period from the renewal (so it outlives its first period), a
// released or expired one is not held and not taken again, and a renewal
// takes no extra slot. The store of newHarness must implement limit.Renewer.
func RunRenew(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	h := newHarness(t)
	rn, ok := h.Store.(limit.Renewer)
	if !ok {
		t.Fatalf("%T does not implement limit.Renewer", h.Store)
	}
	ctx := context.Background()
	const period = 10 * time.Second
	rule := limit.Rule{Name: "sessions", Algorithm: limit.Concurrency, Limit: 2, Period: period}
	checks := []limit.Check{
		{Rule: rule, Key: "mcpgate:rl:{renew-" + t.Name() + "}:a"},
		{Rule: limit.Rule{Name: "calls", Algorithm: limit.FixedWindow, Limit: 100, Period: time.Minute}, Key: "mcpgate:rl:{renew-" + t.Name() + "}:b"},
	}
	take := func() limit.Decision {
		t.Helper()
		d, err := h.Store.Take(ctx, checks, 1)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	renew := func(lease string) bool {
		t.Helper()
		held, err := rn.Renew(ctx, checks, lease)
		if err != nil {
			t.Fatal(err)
		}
		return held
	}
	a := take()
	if !a.Allowed || a.Lease == "" {
		t.Fatalf("first take: %+v", a)
	}
	// Renewing twice within each period keeps the lease three periods on.
	for range 6 {
		h.Advance(period / 2)
		if !renew(a.Lease) {
			t.Fatal("a held lease reports not held")
		}
	}
	// A renewal with a short period never shortens the lease: it only
	// tells whether the lease is held.
	short := []limit.Check{{Rule: limit.Rule{Name: "sessions", Algorithm: limit.Concurrency, Limit: 2, Period: time.Millisecond}, Key: checks[0].Key}}
	if held, err := rn.Renew(ctx, short, a.Lease); err != nil || !held {
		t.Fatalf("renewal with a short period: held %v, err %v", held, err)
	}
	h.Advance(period / 2)
	b := take()
	if !b.Allowed || b.Remaining != 0 {
		t.Fatalf("second take after renewals: %+v (want admitted, 0 left: a renewal takes no slot)", b)
	}
	if d := take(); d.Allowed {
		t.Fatalf("third take: %+v (want denied, the renewed lease still holds its slot)", d)
	}
	if err := h.Store.Release(ctx, checks, b.Lease); err != nil {
		t.Fatal(err)
	}
	if renew(b.Lease) {
		t.Error("a released lease reports held")
	}
	h.Advance(period + time.Second)
	if renew(a.Lease) {
		t.Error("an expired lease reports held")
	}
	if d := take(); !d.Allowed || d.Remaining != 1 {
		t.Errorf("take after expiry: %+v (want admitted, 1 left: renewing a dead lease takes nothing)", d)
	}
	if renew("") {
		t.Error("the empty lease reports held")
	}
	if held, err := rn.Renew(ctx, checks[1:], "x"); err != nil || !held {
		t.Errorf("batch without a concurrency check: held %v, err %v (want held)", held, err)
	}
}
