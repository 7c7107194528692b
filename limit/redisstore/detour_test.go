package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// nodeID is the cluster node id of cl.Nodes[i].
func nodeID(t *testing.T, cl *testenv.Cluster, i int) string {
	t.Helper()
	v, err := cl.Do(i, "CLUSTER", "MYID")
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(v)
}

// waitFor polls cond every 10ms for at most d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not after %v", what, d)
		}
	}
}

// How a Cluster store finds and uses a slot's owner without the client's
// slot map: owner names the master (before a failover and after it, the
// dead master answering nothing), a detoured call runs on the node the slot
// is detoured to, a detour to a node that does not own the slot is dropped
// on its MOVED and the call goes through the client (run once: the
// counter says so), a watch of a slot the client serves ends at once, and
// Close ends the watches (calls go on without them).
func TestClusterDetour(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t)
	c := cl.Client(t)
	s := newStore(t, c, testTimeout)
	ctx := ctxT(t)
	tenant := "detour-" + fmt.Sprint(time.Now().UnixNano())
	fw := rule("detour", limit.FixedWindow, 100, time.Hour)
	checks := tenantChecks(tenant, fw)
	slot := keyspace.Slot(checks[0].Key)
	take := func() limit.Decision {
		t.Helper()
		d, err := s.Take(ctx, checks, 1)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := take(); d.Remaining != 99 {
		t.Fatalf("first take: remaining %d, want 99", d.Remaining)
	}
	master := cl.MasterOf(t, slot)
	lookCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if o := s.owner(lookCtx, slot); o == nil || o.id != nodeID(t, cl, master) {
		t.Fatalf("owner of slot %d: %+v, want node %d (%s)", slot, o, master, nodeID(t, cl, master))
	}

	// A detour to a node that does not own the slot (any other node
	// answers MOVED): dropped, the call goes through the client and is
	// charged once.
	d := s.detours.add(slot)
	if d == nil {
		t.Fatal("add: no watch")
	}
	for addr, n := range c.Nodes() {
		if addr != cl.Addrs[master] {
			id, err := n.Do(ctx, n.B().ClusterMyid().Build()).ToString()
			if err != nil {
				t.Fatal(err)
			}
			d.to.Store(&node{id: id, client: n})
			break
		}
	}
	if d.to.Load() == nil {
		t.Fatal("the client knows no node but the slot's master")
	}
	if got := take(); got.Remaining != 98 {
		t.Errorf("take through a wrong detour: remaining %d, want 98 (run once, on the owner)", got.Remaining)
	}
	if d.to.Load() != nil {
		t.Error("the detour that answered MOVED was kept")
	}
	// A detour to the owner itself serves the calls.
	for id, n := range c.Nodes() {
		if id == cl.Addrs[master] {
			d.to.Store(&node{id: nodeID(t, cl, master), client: n})
		}
	}
	if got := take(); got.Remaining != 97 {
		t.Errorf("take through the owner's detour: remaining %d, want 97", got.Remaining)
	}
	s.detours.remove(slot, d)
	s.detours.wg.Done() // the watch add counted, never started

	// A watch of a slot the client serves ends at once.
	b := batches.Get().(*batch)
	b.build(opTake, 0, checks, 1, "")
	s.observe(b, context.DeadlineExceeded)
	if s.detours.n.Load() != 1 {
		t.Fatal("a timed-out call started no watch")
	}
	waitFor(t, 10*time.Second, "the watch of a served slot to end", func() bool { return s.detours.n.Load() == 0 })
	s.observe(b, context.Canceled)
	if s.detours.n.Load() != 0 {
		t.Error("a call its caller cancelled started a watch")
	}
	b.release()

	// The master dies; once a replica took over, owner names it.
	cl.Nodes[master].Kill()
	before := time.Now()
	cl.WaitStateOK(t, 30*time.Second, master)
	var o *node
	waitFor(t, 10*time.Second, "owner to name the promoted replica", func() bool {
		lctx, cancel := context.WithTimeout(ctx, lookTimeout)
		defer cancel()
		o = s.owner(lctx, slot)
		return o != nil
	})
	promoted := cl.MasterOf(t, slot)
	if promoted == master || o.id != nodeID(t, cl, promoted) {
		t.Errorf("owner after the failover: %s, want node %d (%s)", o.id, promoted, nodeID(t, cl, promoted))
	}
	// Decisions go on (through a detour or the refreshed client).
	waitFor(t, 10*time.Second, "a decision after the failover", func() bool {
		_, err := s.Take(ctx, checks, 1)
		return err == nil
	})
	t.Logf("first decision %v after the kill", time.Since(before).Round(time.Millisecond))

	// Close ends the watches; calls after it still work.
	b = batches.Get().(*batch)
	b.build(opTake, 0, checks, 1, "")
	s.observe(b, context.DeadlineExceeded)
	s.Close()
	if n := s.detours.n.Load(); n != 0 {
		t.Errorf("%d slots still watched after Close", n)
	}
	s.observe(b, context.DeadlineExceeded)
	if n := s.detours.n.Load(); n != 0 {
		t.Error("a watch started after Close")
	}
	b.release()
	// Without detours, decisions wait for the client's own refresh.
	waitFor(t, 10*time.Second, "a decision after Close", func() bool {
		_, err := s.Take(ctx, checks, 1)
		return err == nil
	})
}
