package enforce

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/memstore"
)

// peek on a batch of concurrency checks alone (the path with the added
// denying check): a held slot shows as one fewer remaining, the reads take
// no slot, and the reset time is 0 only when no slot is held.
func TestPeekConcurrencyTakesNoSlot(t *testing.T) {
	t.Parallel()
	s, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	r := limit.Rule{Name: "slots", Algorithm: limit.Concurrency, Limit: 2, Period: time.Minute}
	ch := limit.Check{Rule: r, Key: keyspace.Counter(keyspace.PerTenant, string(r.Algorithm), r.Name, keyspace.Owner{Tenant: "acme"})}
	ctx := t.Context()
	read := func(label string, remaining int64, idle bool) {
		t.Helper()
		for range 3 {
			res, err := peek(ctx, s, "acme", []limit.Check{ch})
			if err != nil || res[0].Remaining != remaining || (res[0].ResetAfter == 0) != idle {
				t.Fatalf("%s: %+v, %v; want remaining %d", label, res, err, remaining)
			}
		}
	}
	read("idle", 2, true)
	if d, err := s.Take(ctx, []limit.Check{ch}, 1); err != nil || !d.Allowed {
		t.Fatalf("take: %+v %v", d, err)
	}
	read("one held", 1, false)
	if d, err := s.Take(ctx, []limit.Check{ch}, 1); err != nil || !d.Allowed {
		t.Fatalf("second slot: %+v %v", d, err)
	}
	read("all held", 0, false)
}
