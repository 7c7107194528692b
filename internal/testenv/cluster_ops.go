package testenv

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id, addr string
	master   bool
	slots    [][2]int
}

// nodes reads CLUSTER NODES from the first running node that answers.
func (c *Cluster) nodes() ([]clusterNode, error) {
	var last error = errors.New("no node running")
	for _, r := range c.Nodes {
		if !r.Running() {
			continue
		}
		conn, err := dialRESP(r.Addr, nil, time.Second)
		if err != nil {
			last = err
			continue
		}
		s, err := conn.doString("CLUSTER", "NODES")
		conn.Close()
		if err != nil {
			last = err
			continue
		}
		var out []clusterNode
		for line := range strings.SplitSeq(s, "\n") {
			f := strings.Fields(line)
			if len(f) < 8 {
				continue
			}
			n := clusterNode{id: f[0], addr: strings.Split(f[1], "@")[0],
				master: strings.Contains(f[2], "master") && !strings.Contains(f[2], "fail")}
			for _, r := range f[8:] {
				if strings.HasPrefix(r, "[") { // a slot being migrated or imported
					continue
				}
				lo, hi, ok := strings.Cut(r, "-")
				if !ok {
					hi = lo
				}
				l, err1 := strconv.Atoi(lo)
				h, err2 := strconv.Atoi(hi)
				if err1 == nil && err2 == nil {
					n.slots = append(n.slots, [2]int{l, h})
				}
			}
			out = append(out, n)
		}
		return out, nil
	}
	return nil, last
}

// MasterOf returns the index in Nodes of the master serving slot, as a
// running node sees the cluster. It fails the test when no master serves it.
func (c *Cluster) MasterOf(tb testing.TB, slot uint16) int {
	tb.Helper()
	ns, err := c.nodes()
	if err != nil {
		tb.Fatalf("testenv: CLUSTER NODES: %v", err)
	}
	for _, n := range ns {
		if !n.master {
			continue
		}
		for _, r := range n.slots {
			if r[0] <= int(slot) && int(slot) <= r[1] {
				if i := slices.Index(c.Addrs, n.addr); i >= 0 { // Nodes are in the order of Addrs
					return i
				}
			}
		}
	}
	tb.Fatalf("testenv: no master serves slot %d", slot)
	return -1
}

// WaitStateOK polls the running nodes (but those at the indexes in except,
// e.g. a frozen one) every 5ms until each of them reports cluster_state:ok
// and returns when that was first seen; it fails the test after timeout.
// Use it after killing a master: the survivors report cluster_state:fail
// until a replica has been promoted.
func (c *Cluster) WaitStateOK(tb testing.TB, timeout time.Duration, except ...int) time.Time {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, seen := true, 0
		for i, r := range c.Nodes {
			if !r.Running() || slices.Contains(except, i) {
				continue
			}
			if state, err := clusterState(r.Addr); err != nil || state != "ok" {
				ok = false
				break
			}
			seen++
		}
		if ok && seen > 0 {
			return time.Now()
		}
		if time.Now().After(deadline) {
			tb.Fatalf("testenv: cluster_state not ok on every running node after %v", timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// WaitStateFail polls the running nodes (but those in except) until one
// reports a cluster_state other than ok (the survivors noticed a dead
// master), for at most timeout. It returns false when none did.
func (c *Cluster) WaitStateFail(timeout time.Duration, except ...int) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for i, r := range c.Nodes {
			if !r.Running() || slices.Contains(except, i) {
				continue
			}
			if state, err := clusterState(r.Addr); err == nil && state != "ok" {
				return true
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

// clusterState returns the cluster_state the node at addr reports in
// CLUSTER INFO ("ok", "fail").
func clusterState(addr string) (string, error) {
	conn, err := dialRESP(addr, nil, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	info, err := conn.doString("CLUSTER", "INFO")
	if err != nil {
		return "", err
	}
	return infoField(info, "cluster_state"), nil
}

// MoveSlot migrates slot from the master at index from to the master at
// index to, the way `redis-cli --cluster reshard` does it: CLUSTER SETSLOT
// IMPORTING on the target, MIGRATING on the source, then MIGRATE of the
// slot's keys batch keys at a time (pausing pause between batches, so that
// traffic meanwhile meets ASK and TRYAGAIN), then SETSLOT NODE on every
// master. It fails the test on any error.
func (c *Cluster) MoveSlot(tb testing.TB, slot uint16, from, to, batch int, pause time.Duration) (moved int) {
	tb.Helper()
	src, dst := c.Nodes[from], c.Nodes[to]
	sc, err := dialRESP(src.Addr, nil, StartTimeout)
	if err != nil {
		tb.Fatal(err)
	}
	defer sc.Close()
	dc, err := dialRESP(dst.Addr, nil, StartTimeout)
	if err != nil {
		tb.Fatal(err)
	}
	defer dc.Close()
	srcID, err := sc.doString("CLUSTER", "MYID")
	if err != nil {
		tb.Fatal(err)
	}
	dstID, err := dc.doString("CLUSTER", "MYID")
	if err != nil {
		tb.Fatal(err)
	}
	s := strconv.Itoa(int(slot))
	must := func(conn *respConn, args ...string) any {
		tb.Helper()
		v, err := conn.do(args...)
		if err != nil {
			tb.Fatalf("testenv: %s: %v", strings.Join(args, " "), err)
		}
		return v
	}
	must(dc, "CLUSTER", "SETSLOT", s, "IMPORTING", srcID)
	must(sc, "CLUSTER", "SETSLOT", s, "MIGRATING", dstID)
	host, port, _ := strings.Cut(dst.Addr, ":")
	for {
		v := must(sc, "CLUSTER", "GETKEYSINSLOT", s, strconv.Itoa(batch))
		keys, _ := v.([]any)
		if len(keys) == 0 {
			break
		}
		args := []string{"MIGRATE", host, port, "", "0", "5000", "REPLACE", "KEYS"}
		for _, k := range keys {
			args = append(args, fmt.Sprint(k))
		}
		must(sc, args...)
		moved += len(keys)
		time.Sleep(pause)
	}
	// The target first, as redis-cli does, so that it owns the slot before
	// the source starts answering MOVED.
	must(dc, "CLUSTER", "SETSLOT", s, "NODE", dstID)
	must(sc, "CLUSTER", "SETSLOT", s, "NODE", dstID)
	for _, r := range c.Nodes {
		if r == src || r == dst || !r.Running() {
			continue
		}
		conn, err := dialRESP(r.Addr, nil, time.Second)
		if err != nil {
			continue
		}
		// A replica refuses; it learns the new owner by gossip.
		_, _ = conn.do("CLUSTER", "SETSLOT", s, "NODE", dstID)
		conn.Close()
	}
	return moved
}

// Do sends one command to the node at index i and returns its reply
// (string, int64, nil, []any) or error; for test set-up (FUNCTION FLUSH,
// DEBUG SLEEP, ...).
func (c *Cluster) Do(i int, args ...string) (any, error) {
	conn, err := dialRESP(c.Nodes[i].Addr, nil, StartTimeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.do(args...)
}

// Healthy returns nil when every node sees a complete, healthy cluster (as
// StartCluster waits for: cluster_state:ok, all slots ok, six nodes, every
// master with its replica), else why not. Poll it after restarting a node.
func (c *Cluster) Healthy() error {
	for _, r := range c.Nodes {
		if err := nodeReady(r.Addr); err != nil {
			return fmt.Errorf("%s: %w", r.Addr, err)
		}
	}
	return nil
}
