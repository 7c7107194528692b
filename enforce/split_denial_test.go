package enforce_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit/redisstore"
)

// On a Cluster, a call that a node up and answering denies is denied
// while the node of the request's other half is down, under on_error:
// open (the default): a tenant over its limit while the global rules'
// master is down, a call over a global limit while the tenant's master is
// down. The store knows the denial; were it to answer with the other
// half's error, the failure policy would admit the call.
func TestClusterKnownDenialStandsWhileOtherNodeIsDown(t *testing.T) {
	cl := testenv.StartCluster(t)
	gm := cl.MasterOf(t, keyspace.Slot(keyspace.Counter(keyspace.PerGlobal, "fixed_window", "all", keyspace.Owner{})))
	master := func(tenant string) int { return cl.MasterOf(t, keyspace.Slot(keyspace.TenantCounters(tenant)+"x")) }
	// tenant a's master is neither the global rules' nor tenant b's
	var ta, tb string
	for i := 0; ta == "" || tb == ""; i++ {
		tenant := fmt.Sprint("acme-", i)
		switch m := master(tenant); {
		case m == gm:
		case ta == "":
			ta = tenant
		case tb == "" && m != master(ta):
			tb = tenant
		}
	}
	yaml := `upstream: {url: "http://127.0.0.1:1/mcp"}
store: {timeout: 2s}
global:
  - {name: all, algorithm: fixed_window, limit: 2, period: 1h}
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: 1, period: 1h}
`
	mk := func() *enforce.Engine {
		rs, err := redisstore.New(cl.Client(t), &redisstore.Options{Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rs.Close)
		return newEngine(t, yaml, enforce.Options{Shared: rs, Probe: func(context.Context) error { return nil }})
	}
	// Another gateway spends each tenant's only call, and with them the
	// global limit of 2.
	e1, e2 := mk(), mk()
	a := enforce.Call{Tenant: ta, Subject: "a", Name: "search"}
	b := enforce.Call{Tenant: tb, Subject: "b", Name: "search"}
	for _, call := range []enforce.Call{a, b} {
		mustAdmit(t, e2, call).Done(context.Background(), enforce.Outcome{})
	}
	if tk, d := e2.Admit(context.Background(), a); d.Allowed {
		tk.Done(context.Background(), enforce.Outcome{})
		t.Fatal("a tenant's second call admitted with every node up")
	}

	t.Run("global_denies_tenant_node_down", func(t *testing.T) {
		cl.Nodes[master(tb)].Kill()
		tk, d := e1.Admit(context.Background(), b)
		tk.Done(context.Background(), enforce.Outcome{})
		if d.Allowed {
			t.Errorf("a call over the global limit (all 2/h, spent; its node up and denying) was admitted: %+v", d)
		}
	})
	t.Run("tenant_denies_global_node_down", func(t *testing.T) {
		cl.Nodes[gm].Kill()
		tk, d := e1.Admit(context.Background(), a)
		tk.Done(context.Background(), enforce.Outcome{})
		if d.Allowed {
			t.Errorf("a call of a tenant over its limit (per_tenant 1/h, spent; its node up and denying) was admitted: %+v", d)
		}
	})
}
