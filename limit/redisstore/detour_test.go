package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/rueidis"

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

// setDetour makes slot watched (key one of its keys) with its calls going to
// to, without a watcher; nil to ends the watch. Its range is the slot
// alone.
func setDetour(s *Store, slot uint16, key string, to *node) {
	ds := &s.detours
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if ds.slots == nil {
		ds.slots, ds.done = map[uint16]*watch{}, make(chan struct{})
	}
	if to == nil {
		delete(ds.slots, slot)
	} else {
		ds.slots[slot] = &watch{key: key, since: time.Now(), to: to, lo: slot, hi: slot}
	}
	ds.publishLocked()
}

// How a Cluster store finds and uses a slot's owner without the client's
// slot map: owners names the master (before a failover and after it, the
// dead master answering nothing), a detoured call runs on the node the slot
// is detoured to, a detour to a node that does not own the slot is dropped
// on its MOVED and the call goes through the client (run once: the
// counter says so), a watch of a slot the client serves ends without a
// detour, calls that say nothing about the slot start no watch, and Close
// ends the watches (calls go on without them).
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
	take := taker(t, ctx, s, checks)
	if d := take(); d.Remaining != 99 {
		t.Fatalf("first take: remaining %d, want 99", d.Remaining)
	}
	master := cl.MasterOf(t, slot)
	ownerOf := func() (owner, bool) {
		// Far above lookTimeout: a starved test process must not read
		// as a node that did not answer.
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		o, ok := s.owners(lctx, []uint16{slot})[slot]
		return o, ok
	}
	owner := func() *node {
		o, _ := ownerOf()
		return o.node
	}
	if o := owner(); o == nil || o.id != nodeID(t, cl, master) {
		t.Fatalf("owner of slot %d: %+v, want node %d (%s)", slot, o, master, nodeID(t, cl, master))
	}

	// A detour to a node that does not own the slot (any other node
	// answers MOVED): dropped, the call goes through the client and is
	// charged once.
	var wrong, right *node
	for addr, n := range c.Nodes() {
		id, err := n.Do(ctx, n.B().ClusterMyid().Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		if addr == cl.Addrs[master] {
			right = &node{id: id, client: n}
		} else if wrong == nil {
			wrong = &node{id: id, client: n}
		}
	}
	if wrong == nil || right == nil {
		t.Fatalf("the client knows no node but the slot's master, or not the master: %v", c.Nodes())
	}
	setDetour(s, slot, checks[0].Key, wrong)
	if got := take(); got.Remaining != 98 {
		t.Errorf("take through a wrong detour: remaining %d, want 98 (run once, on the owner)", got.Remaining)
	}
	if to, watched := s.detours.watchedSlots()[slot]; !watched || to != nil {
		t.Errorf("after MOVED: watched %v, detour %+v; want watched, no detour", watched, to)
	}
	// A detour to the owner itself serves the calls, alone and in a
	// layered request whose global half goes through the client in the
	// same round trip.
	setDetour(s, slot, checks[0].Key, right)
	if got := take(); got.Remaining != 97 {
		t.Errorf("take through the owner's detour: remaining %d, want 97", got.Remaining)
	}
	gr := rule("detour-global", limit.FixedWindow, 1000, time.Hour)
	global := limit.Check{Rule: gr, Key: keyspace.RateLimit(keyspace.PerGlobal, gr.Name+tenant, keyspace.Owner{})}
	if keyspace.Slot(global.Key) == slot {
		t.Fatal("the global key shares the tenant's slot: the test proves nothing")
	}
	lo, err := s.Evaluate(ctx, limit.Request{Checks: checks, Global: []limit.Check{global}, Cost: 1})
	if err != nil || !lo.Decision.Allowed || lo.Decision.Remaining != 96 {
		t.Errorf("layered request with a detoured tenant slot: %+v, %v; want allowed, remaining 96", lo.Decision, err)
	}
	if to := s.detours.watchedSlots()[slot]; to == nil || to.id != right.id {
		t.Errorf("the detour to the owner was not kept: %+v", to)
	}
	// The detour covers the range its node claims: a slot in it goes
	// there too, unwatched; one outside it goes through the client.
	own, ok := ownerOf()
	if !ok || own.lo > slot || slot > own.hi {
		t.Fatalf("owner of slot %d: %+v, %v; want a range holding it", slot, own, ok)
	}
	s.detours.detour(slot, right, own.lo, own.hi)
	var in, out []limit.Check
	for i := 0; in == nil || out == nil; i++ {
		cs := tenantChecks(fmt.Sprintf("%s-%d", tenant, i), fw)
		switch sl := keyspace.Slot(cs[0].Key); {
		case sl == slot:
		case own.lo <= sl && sl <= own.hi:
			in = cs
		default:
			out = cs
		}
	}
	for _, tc := range []struct {
		checks []limit.Check
		want   rueidis.Client
	}{{in, right.client}, {out, c}} {
		b := batches.Get().(*batch)
		b.build(opTake, 0, tc.checks, 1, "")
		got, watched := s.route(b)
		b.release()
		if got != tc.want || watched {
			t.Errorf("slot %d (range %d-%d detoured): routed to the node: %v, watched %v; want %v, false",
				keyspace.Slot(tc.checks[0].Key), own.lo, own.hi, got == right.client, watched, tc.want == right.client)
		}
		if d := taker(t, ctx, s, tc.checks)(); d.Remaining != 99 {
			t.Errorf("a take routed by the range: remaining %d, want 99", d.Remaining)
		}
	}
	setDetour(s, slot, "", nil)

	// Calls that say nothing about the slot start no watch.
	b := batches.Get().(*batch)
	defer b.release()
	b.build(opTake, 0, checks, 1, "")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for _, c := range []struct {
		parent context.Context
		err    error
	}{
		{ctx, context.Canceled},
		{ctx, rueidis.ErrClosing},
		{cancelled, context.DeadlineExceeded}, // the caller's own deadline or cancellation
	} {
		s.observe(c.parent, b, c.err)
		if n := len(s.detours.watchedSlots()); n != 0 {
			t.Errorf("observe(%v, %v) started a watch", c.parent.Err(), c.err)
			setDetour(s, slot, "", nil)
		}
	}
	// A watch of a slot the client serves ends; a detour meanwhile (only
	// when the client's read missed a look's deadline on a starved
	// machine) can only be to the slot's master.
	begun := func() int {
		s.detours.mu.Lock()
		defer s.detours.mu.Unlock()
		return s.detours.begun
	}
	n := begun()
	s.observe(ctx, b, context.DeadlineExceeded)
	// (the watch may already have ended: the watcher looks at once)
	if begun() != n+1 {
		t.Fatal("a call that reached the store's deadline started no watch")
	}
	waitFor(t, 10*time.Second, "the watch of a served slot to end", func() bool {
		if to := s.detours.watchedSlots()[slot]; to != nil && to.id != right.id {
			t.Fatalf("a served slot was detoured to %s, not its master %s", to.id, right.id)
		}
		return s.detours.view.Load() == nil
	})

	// The master dies; once a replica took over, owners names it.
	cl.Nodes[master].Kill()
	before := time.Now()
	cl.WaitStateFail(10*time.Second, master)
	cl.WaitStateOK(t, 30*time.Second, master)
	var o *node
	waitFor(t, 10*time.Second, "owners to name the promoted replica", func() bool {
		o = owner()
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
	s.observe(ctx, b, context.DeadlineExceeded)
	s.Close()
	if n := len(s.detours.watchedSlots()); n != 0 {
		t.Errorf("%d slots still watched after Close", n)
	}
	s.observe(ctx, b, context.DeadlineExceeded)
	if n := len(s.detours.watchedSlots()); n != 0 {
		t.Error("a watch started after Close")
	}
	// Without detours, decisions wait for the client's own refresh.
	waitFor(t, 10*time.Second, "a decision after Close", func() bool {
		_, err := s.Take(ctx, checks, 1)
		return err == nil
	})
}
