package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// tenantOnMaster returns a tenant whose counters' slot is served by a
// master other than those of avoid (indexes in cl.Nodes), and that
// master's index.
func tenantOnMaster(t *testing.T, cl *testenv.Cluster, prefix string, avoid ...int) (string, int) {
	t.Helper()
	for i := range 10000 {
		tenant := fmt.Sprintf("%s-%d", prefix, i)
		key := keyspace.RateLimit(keyspace.PerTenant, "x", keyspace.Owner{Tenant: tenant})
		m := cl.MasterOf(t, keyspace.Slot(key))
		ok := true
		for _, a := range avoid {
			ok = ok && m != a
		}
		if ok {
			return tenant, m
		}
	}
	t.Fatal("no tenant found on another master")
	return "", -1
}

// On a Cluster, a layered request whose one half is denied by its node
// (a definitive answer) while the other half's node is down is denied: the
// denial is known, and answering with the other half's error would have
// the caller apply its failure policy, which admits the call when open (a
// tenant over its limit admitted whenever the global rules' master is
// down, a call over a global limit whenever the tenant's is).
func TestClusterSplitDenialStandsWhenOtherNodeIsDown(t *testing.T) {
	cl := testenv.StartCluster(t)
	s := newStore(t, cl.Client(t), time.Second)
	ctx := ctxT(t)
	id := fmt.Sprint(time.Now().UnixNano())
	open := rule("g-"+id, limit.FixedWindow, 1000, time.Hour)
	openKey := keyspace.RateLimit(keyspace.PerGlobal, open.Name, keyspace.Owner{})
	gm := cl.MasterOf(t, keyspace.Slot(openKey)) // every global key shares one slot
	spent := rule("gspent-"+id, limit.FixedWindow, 1, time.Hour)
	spentGlobal := []limit.Check{{Rule: spent, Key: keyspace.RateLimit(keyspace.PerGlobal, spent.Name, keyspace.Owner{})}}
	// tenant a's master is neither the global rules' nor tenant b's
	ta, am := tenantOnMaster(t, cl, "ta"+id, gm)
	tb, bm := tenantOnMaster(t, cl, "tb"+id, gm, am)
	spentTenant := tenantChecks(ta, rule("x", limit.FixedWindow, 1, time.Hour))
	openTenant := tenantChecks(tb, rule("x", limit.FixedWindow, 1000, time.Hour))
	warmUp(t, func() error { _, err := s.Take(ctx, spentTenant, 1); return err })
	if d, err := s.Take(ctx, spentGlobal, 1); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}

	t.Run("global_denies_tenant_node_down", func(t *testing.T) {
		cl.Nodes[bm].Kill()
		o, err := s.Evaluate(ctx, limit.Request{Checks: openTenant, Global: spentGlobal, Cost: 1})
		if err != nil || o.Decision.Allowed {
			t.Fatalf("Evaluate = allowed %v, err %v; want a denial by the global rule (its node answered: spent)", o.Decision.Allowed, err)
		}
		if o.Decision.Rule != spent || !o.GlobalDecides || o.Decision.RetryAfter <= 0 {
			t.Errorf("denial %+v (global decides %v); want the spent global rule's, with its retry time", o.Decision, o.GlobalDecides)
		}
	})
	t.Run("tenant_denies_global_node_down", func(t *testing.T) {
		cl.Nodes[gm].Kill()
		o, err := s.Evaluate(ctx, limit.Request{Checks: spentTenant, Global: []limit.Check{{Rule: open, Key: openKey}}, Cost: 1})
		if err != nil || o.Decision.Allowed {
			t.Fatalf("Evaluate = allowed %v, err %v; want a denial by the tenant rule (its node answered: spent)", o.Decision.Allowed, err)
		}
		if o.Decision.Rule != spentTenant[0].Rule || o.GlobalDecides || o.Decision.RetryAfter <= 0 || len(o.Decision.Results) != 1 {
			t.Errorf("denial %+v (global decides %v); want the spent tenant rule's, with its retry time", o.Decision, o.GlobalDecides)
		}
	})
}

// tenantReplyLost is a Cluster client that, once armed, sends the next
// split request (a DoMulti carrying a global key) and loses the replies of
// its tenant half, as a timeout after it ran.
type tenantReplyLost struct {
	rueidis.Client
	armed atomic.Bool
}

func (c *tenantReplyLost) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	// The commands are read before the send: rueidis recycles them after.
	global := make([]bool, len(cmds))
	split := false
	for i, cmd := range cmds {
		global[i] = isGlobalCmd(cmd)
		split = split || global[i]
	}
	rs := c.Client.DoMulti(ctx, cmds...)
	if len(cmds) < 2 || !split || !c.armed.CompareAndSwap(true, false) {
		return rs
	}
	for i := range rs {
		if !global[i] {
			rs[i] = rueidis.NewErrorResult(context.DeadlineExceeded)
		}
	}
	return rs
}

func isGlobalCmd(cmd rueidis.Completed) bool {
	for _, a := range cmd.Commands() {
		if strings.Contains(a, "{~g}") { // the global keys' hash tag
			return true
		}
	}
	return false
}

// On a Cluster, a metered request whose global half denies and whose
// tenant half's reply is lost (it may have charged the meter) is denied,
// and the meter charge its tenant half may have made is given back (an
// undo that applies once, sent until answered): the denied call is not
// billed.
func TestClusterSplitGlobalDenialUndoesLostTenantCharge(t *testing.T) {
	cl := testenv.StartCluster(t)
	c := &tenantReplyLost{Client: cl.Client(t)}
	s := newStore(t, c, testTimeout)
	ctx := ctxT(t)
	id := fmt.Sprint(time.Now().UnixNano())
	tenant := "lost-" + id
	checks := tenantChecks(tenant, rule("tenant", limit.FixedWindow, 100, time.Hour))
	global := []limit.Check{splitGlobal(t, rule("spent-"+id, limit.FixedWindow, 1, time.Hour), checks[0].Key)}
	if d, err := s.Take(ctx, global, 1); err != nil || !d.Allowed {
		t.Fatal(d, err) // spend the global rule
	}
	m := testMeter(tenant, 0)
	m.Op = limit.NewOp()
	c.armed.Store(true)
	o, err := s.Evaluate(ctx, limit.Request{Checks: checks, Global: global, Meter: &m, Cost: 1})
	if c.armed.Load() {
		t.Fatalf("fault not injected: %+v %v", o.Decision, err)
	}
	if err != nil || o.Decision.Allowed || !o.GlobalDecides {
		t.Fatalf("%+v (global decides %v) %v; want the global rule's denial", o.Decision, o.GlobalDecides, err)
	}
	s.lost.wg.Wait() // the undo sent in the background
	ms, ok, err := s.ReadMeter(ctx, m.Key)
	if err != nil || !ok || ms.Live.NetCalls() != 0 {
		t.Errorf("meter %+v (%v, %v): %d net calls, want 0: the denied call is billed", ms.Live, ok, err, ms.Live.NetCalls())
	}
}
