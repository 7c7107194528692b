package redisstore

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// On a Cluster the listing asks only the tenant's slot, on its owner: a
// master elsewhere that hangs (a frozen process) neither fails it nor
// makes it wait for the deadline.
func TestClusterHeldCountersSkipsOtherNodes(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t)
	c := cl.Client(t)
	s := newStore(t, c, testTimeout)
	r := rule("held", limit.FixedWindow, 5, time.Hour)
	var want []string
	for _, tool := range []string{"search", "echo"} {
		o := keyspace.Owner{Tenant: "acme", Tool: tool}
		ch := limit.Check{Rule: r, Key: keyspace.Counter(keyspace.PerTenantTool, string(r.Algorithm), r.Name, o)}
		if d, err := s.Take(ctxT(t), []limit.Check{ch}, 1); err != nil || !d.Allowed {
			t.Fatalf("take: %+v %v", d, err)
		}
		want = append(want, ch.Key)
	}
	prefix := keyspace.ToolCounters(keyspace.PerTenantTool, string(r.Algorithm), r.Name, keyspace.Owner{Tenant: "acme"})
	owner := cl.MasterOf(t, keyspace.Slot(prefix))
	other := -1 // another master
	for slot := uint16(0); slot < 16384 && other < 0; slot += 512 {
		if m := cl.MasterOf(t, slot); m != owner {
			other = m
		}
	}
	if other < 0 {
		t.Fatal("no other master to freeze")
	}
	thaw := cl.Nodes[other].Freeze(t)
	defer thaw()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	keys, err := s.HeldCounters(ctx, prefix)
	slices.Sort(keys)
	slices.Sort(want)
	if err != nil || !slices.Equal(keys, want) {
		t.Fatalf("with master %d frozen (the tenant's slot on %d): %q, %v; want %q", other, owner, keys, err, want)
	}
}
