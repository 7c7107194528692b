package enforce_test

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
)

// A call settled with Outcome.Running (its request was cut and nothing
// could stop it on its server) keeps its concurrency slot until its lease
// lapses, instead of freeing it while the server may still run it; the
// rest of Done (the cost) is unchanged. A call settled without it frees its
// slot at once.
func TestRunningCallKeepsItsSlotUntilItsLeaseLapses(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			e := engines(t, store, 1, `
tiers:
  free:
    limits:
      - {name: one, per: tenant, algorithm: concurrency, limit: 1, period: 2s}
`, "")[0]
			call := enforce.Call{Tenant: "acme", Subject: "a", Name: "slow"}
			first := mustAdmit(t, e, call)
			if charged := first.Done(t.Context(), enforce.Outcome{Status: enforce.Failed, Running: true}); charged != 1 {
				t.Fatalf("Done charged %d, want the call's cost 1", charged)
			}
			if _, d := e.Admit(t.Context(), call); d.Allowed {
				t.Fatal("a call was admitted while the one cut before it may still run: its slot was freed by Done")
			}
			var next *enforce.Ticket
			deadline := time.Now().Add(20 * time.Second)
			for next == nil {
				if time.Now().After(deadline) {
					t.Fatal("the slot of the running call never lapsed")
				}
				time.Sleep(100 * time.Millisecond)
				if tk, d := e.Admit(t.Context(), call); d.Allowed {
					next = tk
				}
			}
			next.Done(t.Context(), enforce.Outcome{})
			if _, d := e.Admit(t.Context(), call); !d.Allowed {
				t.Fatalf("a call settled without Running kept its slot: %+v", d)
			}
		})
	}
}

// HoldSlots takes the call's concurrency slots again, and nothing else: it
// is refused while the slot is taken, frees it on release, and counts no
// rate rule (a fixed window of one call stays unspent).
func TestHoldSlotsTakesOnlyTheConcurrencySlots(t *testing.T) {
	t.Parallel()
	e := engines(t, "memory", 1, `
tiers:
  free:
    limits:
      - {name: one, per: tenant, algorithm: concurrency, limit: 1, period: 1m}
      - {name: once, per: tenant, algorithm: fixed_window, limit: 2, period: 1h}
`, "")[0]
	call := enforce.Call{Tenant: "acme", Subject: "a", Name: "slow"}
	first := mustAdmit(t, e, call)
	if _, ok := first.HoldSlots(t.Context()); ok {
		t.Fatal("HoldSlots took a slot the call itself holds under a limit of one")
	}
	first.Done(t.Context(), enforce.Outcome{})
	release, ok := first.HoldSlots(t.Context())
	if !ok {
		t.Fatal("HoldSlots was refused a free slot")
	}
	if _, d := e.Admit(t.Context(), call); d.Allowed {
		t.Fatal("a call was admitted beside the held slot")
	}
	release(t.Context())
	for range 3 {
		release, ok := first.HoldSlots(t.Context())
		if !ok {
			t.Fatal("HoldSlots was refused after the release")
		}
		release(t.Context())
	}
	// The window of two holds the first call and this one: the holds
	// counted nothing.
	mustAdmit(t, e, call).Done(t.Context(), enforce.Outcome{})
}
