package redisstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// On a Cluster, a metered request with an op id whose global half denies
// gets its tenant half given back, and the op's marker with it: placing
// the op again must charge it, not find it done. A request whose global
// half admits keeps its marker (the test can see one).
func TestClusterSplitUndoDropsOpMarker(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t)
	c := cl.Client(t)
	s := newStore(t, c, testTimeout)
	ctx := ctxT(t)
	id := fmt.Sprint(time.Now().UnixNano())
	tenant := "undo-" + id
	checks := tenantChecks(tenant, rule("tenant", limit.FixedWindow, 100, time.Hour))
	gr := rule("undo-global-"+id, limit.FixedWindow, 1, time.Hour)
	global := splitGlobal(t, gr, checks[0].Key)
	marker := func(m limit.Meter) bool {
		t.Helper()
		n, err := c.Do(ctx, c.B().Exists().Key(keyspace.MeterOp(m.Key, m.Op)).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	evaluate := func() (limit.Outcome, limit.Meter) {
		t.Helper()
		m := testMeter(tenant, 0)
		m.Op = limit.NewOp()
		o, err := s.Evaluate(ctx, limit.Request{Checks: checks, Global: []limit.Check{global}, Meter: &m, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		return o, m
	}
	o, m := evaluate() // the global rule's one unit
	if !o.Decision.Allowed || !marker(m) {
		t.Fatalf("first request: allowed %v, marker %v; want admitted with its marker", o.Decision.Allowed, marker(m))
	}
	o, m = evaluate() // the global rule is spent: the tenant half is undone
	if o.Decision.Allowed {
		t.Fatalf("second request admitted past a global limit of 1: %+v", o.Decision)
	}
	if marker(m) {
		t.Error("the undone request's op marker is still there: placing the op again would count nothing")
	}
	ms, ok, err := s.ReadMeter(ctx, m.Key)
	if err != nil || !ok || ms.Live.NetCalls() != 1 {
		t.Errorf("meter after one admitted and one undone request: %+v, %v, %v; want 1 net call", ms.Live, ok, err)
	}
}
