package testenv

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

const (
	clusterMasters  = 3
	clusterNodes    = 2 * clusterMasters // one replica per master
	clusterAttempts = 3
	// clusterCreateTimeout bounds `redis-cli --cluster create`, which
	// itself polls once a second while the nodes meet.
	clusterCreateTimeout = 30 * time.Second
)

// Cluster is a running 6-node Redis Cluster started by StartCluster: 3
// masters covering all 16384 slots, each with one replica. Nodes are plain
// (no password, no TLS) on 127.0.0.1.
type Cluster struct {
	// Addrs are the nodes' host:port, masters and replicas alike.
	Addrs []string
	// Nodes are the nodes, in the order of Addrs. Killing and restarting
	// one simulates a node crash: the cluster fails it over after
	// cluster-node-timeout (2s), and a restarted node rejoins with the
	// node identity kept in its directory.
	Nodes []*Redis
}

// StartCluster starts six cluster-enabled redis-servers (cluster bus on its
// own free port, cluster-node-timeout 2000), joins them with `redis-cli
// --cluster create ... --cluster-replicas 1 --cluster-yes` (the way an
// operator makes a cluster), and waits until
// every node reports cluster_state:ok, all 16384 slots assigned and ok, six
// known nodes, and every replica's link to its master up. When a start
// fails (usually a port taken by another process meanwhile), it is retried
// from scratch with new ports, up to 3 times. It takes 2.1 to 3.1s, most of
// it redis's own 2s delay before a new master reports cluster_state:ok; a
// package with several cluster tests should share one cluster. The nodes
// are killed when the test ends. Missing binaries skip or fail the test as
// RequireBinary does.
func StartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	return startClusterWith(tb, true)
}

// startClusterWith is StartCluster; withRedisCLI joins the nodes with
// `redis-cli --cluster create` instead of join. Both make the same cluster;
// redis-cli sleeps a second at a time while the nodes meet. Either way the
// masters report cluster_state:ok no sooner than 2s after they started
// (CLUSTER_WRITABLE_DELAY, hard-coded in redis), so StartCluster takes about
// 2.1s with join and 2.1 to 3.1s with redis-cli. The redis-cli way is kept,
// and tested, as the reference that join must match.
func startClusterWith(tb testing.TB, withRedisCLI bool) *Cluster {
	tb.Helper()
	bin := RequireBinary(tb, "redis-server")
	var cli string
	if withRedisCLI {
		cli = RequireBinary(tb, "redis-cli")
	}
	began := time.Now()
	var last error
	for range clusterAttempts {
		c, err := startCluster(tb, bin, cli)
		if err == nil {
			tb.Logf("testenv: cluster %v ready in %v", c.Addrs, time.Since(began).Round(time.Millisecond))
			return c
		}
		// Usually a port taken meanwhile (errPortInUse), but any failure
		// is retried from scratch: a half-made cluster is not reusable.
		tb.Logf("testenv: cluster start failed, retrying: %v", err)
		last = err
	}
	tb.Fatalf("testenv: cluster did not start after %d attempts; last error: %v", clusterAttempts, last)
	return nil
}

// startCluster makes one attempt; cli is redis-cli's path to join the nodes
// with it, "" to join them with direct commands.
func startCluster(tb testing.TB, bin, cli string) (_ *Cluster, err error) {
	began := time.Now()
	ports, err := freePorts(2 * clusterNodes)
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	procs := make([]*process, 0, clusterNodes)
	defer func() {
		// A failed attempt leaves nothing running (the nodes' cleanups
		// would kill them only at the end of the test).
		if err != nil {
			for _, p := range procs {
				_ = p.kill()
			}
			c.kill()
		}
	}()
	// Launch all six, then wait for them: they boot in parallel.
	for i := range clusterNodes {
		r, err := newRedis(tb, bin, nil)
		if err != nil {
			return nil, err
		}
		if err := r.configure(ports[i], ports[clusterNodes+i]); err != nil {
			return nil, err
		}
		p, err := r.launch()
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
		c.Nodes = append(c.Nodes, r)
		c.Addrs = append(c.Addrs, r.Addr)
	}
	var errs []error
	for i, r := range c.Nodes {
		// waitLaunched kills a process that failed; the others are owned
		// by their node from here on.
		if err := r.waitLaunched(procs[i]); err != nil {
			errs = append(errs, err)
			continue
		}
		r.mu.Lock()
		r.proc = procs[i]
		r.mu.Unlock()
	}
	procs = nil
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	nodesUp := time.Now()
	create := c.join
	if cli != "" {
		create = func() error { return c.joinRedisCLI(cli) }
	}
	if err := create(); err != nil {
		return nil, err
	}
	created := time.Now()
	if err := c.waitReady(StartTimeout); err != nil {
		return nil, err
	}
	tb.Logf("testenv: cluster nodes up in %v, joined in %v, converged in %v",
		nodesUp.Sub(began).Round(time.Millisecond), created.Sub(nodesUp).Round(time.Millisecond), time.Since(created).Round(time.Millisecond))
	return c, nil
}

// join makes the cluster with the commands redis-cli would send: slots
// split evenly over the first three nodes, a distinct config epoch per node,
// every node meeting every other, then nodes 3..5 replicating nodes 0..2.
func (c *Cluster) join() error {
	conns := make([]*respConn, len(c.Nodes))
	defer func() {
		for _, conn := range conns {
			if conn != nil {
				conn.Close()
			}
		}
	}()
	ids := make([]string, len(c.Nodes))
	for i, r := range c.Nodes {
		conn, err := dialRESP(r.Addr, nil, StartTimeout)
		if err != nil {
			return fmt.Errorf("testenv: cluster join: %w", err)
		}
		conns[i] = conn
		if ids[i], err = conn.doString("CLUSTER", "MYID"); err != nil {
			return fmt.Errorf("testenv: CLUSTER MYID on %s: %w", r.Addr, err)
		}
	}
	do := func(i int, args ...string) error {
		if _, err := conns[i].do(args...); err != nil {
			return fmt.Errorf("testenv: %s on %s: %w", strings.Join(args, " "), c.Nodes[i].Addr, err)
		}
		return nil
	}
	const slots = 16384
	for i := range clusterMasters {
		first, last := i*slots/clusterMasters, (i+1)*slots/clusterMasters-1
		if err := do(i, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(first), strconv.Itoa(last)); err != nil {
			return err
		}
	}
	// Distinct epochs up front spare the nodes the slow collision
	// resolution; redis-cli does the same.
	for i := range c.Nodes {
		if err := do(i, "CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i+1)); err != nil {
			return err
		}
	}
	// Every node meets every other: gossip alone would spread the nodes
	// in about a second, direct handshakes take one cluster cron tick.
	for i := range c.Nodes {
		for j, r := range c.Nodes {
			if i == j {
				continue
			}
			if err := do(i, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(r.port), strconv.Itoa(r.busPort)); err != nil {
				return err
			}
		}
	}
	// A replica can only follow a master it has heard of: retry until the
	// gossip has reached it.
	deadline := time.Now().Add(StartTimeout)
	for i := clusterMasters; i < len(c.Nodes); i++ {
		for {
			err := do(i, "CLUSTER", "REPLICATE", ids[i-clusterMasters])
			if err == nil {
				break
			}
			var re respError
			if !errors.As(err, &re) || time.Now().After(deadline) {
				return err
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// joinRedisCLI makes the cluster with `redis-cli --cluster create`.
func (c *Cluster) joinRedisCLI(cli string) error {
	ctx, cancel := context.WithTimeout(context.Background(), clusterCreateTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, args...)
	cmd.SysProcAttr = sysProcAttr()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("testenv: redis-cli %s: %v\n%s", strings.Join(args, " "), err, tail(string(out), 40))
	}
	return nil
}

// waitReady polls every node until all report a healthy cluster.
func (c *Cluster) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var notReady []string
		for _, r := range c.Nodes {
			if err := nodeReady(r.Addr); err != nil {
				notReady = append(notReady, r.Addr+": "+err.Error())
			}
		}
		if len(notReady) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: cluster not ready after %v:\n  %s", timeout, strings.Join(notReady, "\n  "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nodeReady returns why the node at addr does not (yet) see a complete,
// healthy cluster, or nil.
func nodeReady(addr string) error {
	conn, err := dialRESP(addr, nil, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	info, err := conn.doString("CLUSTER", "INFO")
	if err != nil {
		return err
	}
	for _, want := range []struct{ field, value string }{
		{"cluster_state", "ok"},
		{"cluster_slots_assigned", "16384"},
		{"cluster_slots_ok", "16384"},
		{"cluster_known_nodes", fmt.Sprint(clusterNodes)},
		{"cluster_size", fmt.Sprint(clusterMasters)},
	} {
		if got := infoField(info, want.field); got != want.value {
			return fmt.Errorf("%s is %q, want %q", want.field, got, want.value)
		}
	}
	repl, err := conn.doString("INFO", "replication")
	if err != nil {
		return err
	}
	switch role := infoField(repl, "role"); role {
	case "master":
		if n := infoField(repl, "connected_slaves"); n != "1" {
			return fmt.Errorf("master has %q connected replicas, want 1", n)
		}
	case "slave":
		if s := infoField(repl, "master_link_status"); s != "up" {
			return fmt.Errorf("replica link to master is %q", s)
		}
	default:
		return fmt.Errorf("role %q", role)
	}
	return nil
}

// kill kills every node.
func (c *Cluster) kill() {
	for _, r := range c.Nodes {
		r.mu.Lock()
		_ = r.killLocked()
		r.mu.Unlock()
	}
}

// ClientOption returns rueidis options for the cluster: every node as an
// init address (rueidis then discovers the slot map with CLUSTER SLOTS or
// CLUSTER SHARDS and runs in cluster mode), client-side caching off.
func (c *Cluster) ClientOption() rueidis.ClientOption {
	return rueidis.ClientOption{
		InitAddress:  append([]string(nil), c.Addrs...),
		DisableCache: true,
	}
}

// Client returns a connected rueidis cluster client (ClientOption), closed
// when the test ends. It fails the test if it cannot connect.
func (c *Cluster) Client(tb testing.TB) rueidis.Client {
	tb.Helper()
	return newClient(tb, c.ClientOption())
}
