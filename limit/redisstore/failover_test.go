package redisstore

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// layeredLoad runs callers goroutines of calls layered requests each (a
// tenant of its own per caller, one shared global rule) and counts the
// admissions and the errors.
func layeredLoad(t *testing.T, s *Store, callers, calls int, pause time.Duration, global limit.Check, tenants string, meter func(tenant string) *limit.Meter) (admitted, failed int64) {
	t.Helper()
	var a, f atomic.Int64
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			tenant := tenants + strconv.Itoa(i)
			tr := rule("tenant", limit.FixedWindow, 1000, time.Hour)
			req := limit.Request{
				Checks: []limit.Check{{Rule: tr, Key: keyspace.RateLimit(keyspace.PerTenant, tr.Name, keyspace.Owner{Tenant: tenant})}},
				Global: []limit.Check{global},
				Meter:  meter(tenant),
				Cost:   1,
			}
			for range calls {
				o, err := s.Evaluate(context.Background(), req)
				switch {
				case err != nil:
					f.Add(1)
					time.Sleep(10 * time.Millisecond)
				case o.Decision.Allowed:
					a.Add(1)
				}
				time.Sleep(pause)
			}
		})
	}
	wg.Wait()
	return a.Load(), f.Load()
}

// flushedDuring runs load while calling flush every every, and returns
// how many flushes succeeded.
func flushedDuring(every time.Duration, flush func() bool, load func()) int {
	stop, flushed := make(chan struct{}), make(chan int)
	go func() {
		n := 0
		defer func() { flushed <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(every):
			}
			if flush() {
				n++
			}
		}
	}()
	load()
	close(stop)
	return <-flushed
}

// netCalls sums the net calls of the meters (testMeter's) of the tenants
// layeredLoad names with prefix, n callers.
func netCalls(ctx context.Context, s *Store, prefix string, n int) int64 {
	var used int64
	for i := range n {
		if ms, ok, err := s.ReadMeter(ctx, testMeter(prefix+strconv.Itoa(i), 0).Key); err == nil && ok {
			used += ms.Live.NetCalls()
		}
	}
	return used
}

// On a Cluster, layered calls (the tenant's and the global slot: two calls
// sent together) stay exact while every master drops its functions and
// scripts under load (FUNCTION FLUSH, SCRIPT FLUSH: the reload and the
// EVALSHA/EVAL fallback run), and never admit more than the limit across
// the failover of the master holding the global slot; the new master has
// the library (replicated) and the store goes on.
func TestClusterLayeredFlushAndFailover(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t)
	c := cl.Client(t)
	s := newStore(t, c, testTimeout)
	ctx := ctxT(t)
	id := strconv.FormatInt(time.Now().UnixNano(), 36)
	meter := func(tenant string) *limit.Meter {
		m := testMeter(tenant, 0)
		return &m
	}

	// Flushes under load.
	const L = 150
	gr := rule("global-"+id, limit.FixedWindow, L, time.Hour)
	gc := limit.Check{Rule: gr, Key: keyspace.RateLimit(keyspace.PerGlobal, gr.Name, keyspace.Owner{})}
	fallbacks := func() (n int64) { // function loads and EVALs, every node
		for _, node := range c.Nodes() {
			for _, cmd := range []string{"function|load", "eval"} {
				calls, _ := commandCalls(t, node, cmd)
				n += calls
			}
		}
		return n
	}
	fallbacksBefore := fallbacks()
	var admitted, failed int64
	nflushes := flushedDuring(15*time.Millisecond, func() bool {
		for _, node := range c.Nodes() {
			_ = node.Do(ctx, node.B().FunctionFlush().Build()).Error() // replicas refuse: READONLY
			_ = node.Do(ctx, node.B().ScriptFlush().Build()).Error()
		}
		return true
	}, func() { admitted, failed = layeredLoad(t, s, 8, 40, 0, gc, "flush-"+id+"-", meter) })
	nfallbacks := fallbacks() - fallbacksBefore
	t.Logf("%d flushes of every node during the load, %d function loads and EVALs", nflushes, nfallbacks)
	if nflushes > 0 && nfallbacks == 0 {
		t.Error("the flushes sent no call down the fallback path (FUNCTION LOAD, EVAL)")
	}
	if failed != 0 || admitted != L {
		t.Errorf("8 callers x 40 layered calls under a global limit of %d, flushed meanwhile: %d admitted, %d errors; want %d and 0", L, admitted, failed, L)
	}
	if used := netCalls(ctx, s, "flush-"+id+"-", 8); used != L {
		t.Errorf("meters hold %d net calls, want %d (denied calls given back)", used, L)
	}

	// Failover of the global slot's master, under load.
	const L2 = 2000
	gr2 := rule("global2-"+id, limit.FixedWindow, L2, time.Hour)
	gc2 := limit.Check{Rule: gr2, Key: keyspace.RateLimit(keyspace.PerGlobal, gr2.Name, keyspace.Owner{})}
	owner := slotOwner(t, ctx, cl, keyspace.Slot(gc2.Key))
	killed := time.Now().Add(300 * time.Millisecond)
	go func() {
		time.Sleep(time.Until(killed))
		cl.Nodes[owner].Kill()
	}()
	// about 4s of calls, the failover (cluster-node-timeout 2s) within
	admitted, failed = layeredLoad(t, s, 8, 400, 10*time.Millisecond, gc2, "failover-"+id+"-", meter)
	t.Logf("across the failover: %d admitted, %d errors (calls ended %v after the kill)", admitted, failed, time.Since(killed).Round(time.Millisecond))
	// Redis Cluster replicates asynchronously: charges the killed master
	// acknowledged but had not yet sent to its replica are lost with it,
	// and the promoted replica admits them again (seen: up to 6 % over in
	// some runs). That is Redis's bound, not the store's: logged, and only
	// a gross excess (a store bug, such as refunds given twice) fails.
	if admitted > L2 {
		t.Logf("%d admitted under a global limit of %d: %d writes lost with the killed master", admitted, L2, admitted-L2)
	}
	if admitted > L2+L2/4 {
		t.Errorf("%d admitted under a global limit of %d: more than asynchronous replication can lose", admitted, L2)
	}
	if failed == 0 {
		t.Log("no call failed: the failover was quicker than the callers")
	}
	// The store works on the new master, with the library it replicated.
	var err error
	var o limit.Outcome
	for range 100 {
		tr := rule("tenant", limit.FixedWindow, 10, time.Hour)
		o, err = s.Evaluate(ctx, limit.Request{
			Checks: []limit.Check{{Rule: tr, Key: keyspace.RateLimit(keyspace.PerTenant, tr.Name, keyspace.Owner{Tenant: "after-" + id})}},
			Global: []limit.Check{gc2}, Cost: 1,
		})
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("after the failover: %v", err)
	}
	if s.lib.mode.Load() != modeFunctions {
		t.Errorf("after the failover the store runs mode %d, want functions", s.lib.mode.Load())
	}
	t.Logf("after the failover: %+v", o.Decision)
}

// slotOwner returns the index in cl.Nodes of the master serving slot.
func slotOwner(t *testing.T, ctx context.Context, cl *testenv.Cluster, slot uint16) int {
	t.Helper()
	for i, addr := range cl.Addrs {
		n, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		nodes, err := n.Do(ctx, n.B().ClusterNodes().Build()).ToString()
		n.Close()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) < 9 || !strings.Contains(f[2], "myself") || !strings.Contains(f[2], "master") {
				continue
			}
			for _, r := range f[8:] {
				lo, hi, ok := strings.Cut(r, "-")
				if !ok {
					hi = lo
				}
				l, err1 := strconv.Atoi(lo)
				h, err2 := strconv.Atoi(hi)
				if err1 == nil && err2 == nil && l <= int(slot) && int(slot) <= h {
					return i
				}
			}
		}
	}
	t.Fatalf("no master serves slot %d", slot)
	return -1
}
