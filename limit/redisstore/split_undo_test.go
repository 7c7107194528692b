package redisstore

import (
	"context"
	"errors"
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

// giveBackFault is a Cluster client that, once armed, lets the next split
// request (a DoMulti carrying a global key) through and then faults the
// send after it, the give-back of the half that admitted: faultDrop fails
// it unsent (the node's connection broke), faultLose sends it and loses
// its replies (a timeout after it ran).
type giveBackFault struct {
	rueidis.Client
	mode  int
	stage atomic.Int32 // 0 idle, 1 armed, 2 fault the next send
}

const (
	faultDrop = iota
	faultLose
)

func (c *giveBackFault) arm() { c.stage.Store(1) }

// fired reports whether the armed fault was injected.
func (c *giveBackFault) fired() bool { return c.stage.Load() == 0 }

func (c *giveBackFault) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	if c.stage.Load() == 2 {
		return c.fault(len(cmds), func() []rueidis.RedisResult { return c.Client.DoMulti(ctx, cmds...) })
	}
	if c.stage.Load() == 1 && len(cmds) >= 2 {
		for _, cmd := range cmds {
			if strings.Contains(strings.Join(cmd.Commands(), " "), "{~g}") {
				c.stage.Store(2)
			}
		}
	}
	return c.Client.DoMulti(ctx, cmds...)
}

func (c *giveBackFault) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if c.stage.Load() == 2 {
		return c.fault(1, func() []rueidis.RedisResult { return []rueidis.RedisResult{c.Client.Do(ctx, cmd)} })[0]
	}
	return c.Client.Do(ctx, cmd)
}

func (c *giveBackFault) fault(n int, send func() []rueidis.RedisResult) []rueidis.RedisResult {
	c.stage.Store(0)
	err := errors.New("connection reset by peer")
	if c.mode == faultLose {
		send()
		err = context.DeadlineExceeded
	}
	out := make([]rueidis.RedisResult, n)
	for i := range out {
		out[i] = rueidis.NewErrorResult(err)
	}
	return out
}

// On a Cluster, the give-back of a split request's admitted half can fail
// (the node's connection broke). The concurrency slot that half took must
// not stay taken for the lease's period (the rule's): releasing a lease is
// idempotent, so the store releases it as it does a failed call's.
func TestClusterSplitFailedGiveBackReleasesSlot(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t)
	uc := &giveBackFault{Client: cl.Client(t), mode: faultDrop}
	s := newStore(t, uc, testTimeout)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name   string
		slotIn string // the half whose slot is given back: the other denies
	}{{"tenant_slot", "tenant"}, {"global_slot", "global"}} {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprint(time.Now().UnixNano())
			slotRule := rule("slots-"+id, limit.Concurrency, 1, time.Hour)
			spentRule := rule("spent-"+id, limit.FixedWindow, 1, time.Hour)
			tr, gr := slotRule, spentRule
			if tc.slotIn == "global" {
				tr, gr = spentRule, slotRule
			}
			tenant := []limit.Check{{Rule: tr, Key: keyspace.RateLimit(keyspace.PerTenant, tr.Name, keyspace.Owner{Tenant: "t" + id})}}
			global := []limit.Check{splitGlobal(t, gr, tenant[0].Key)}
			slot, spent := tenant, global
			if tc.slotIn == "global" {
				slot, spent = global, tenant
			}
			if d, err := s.Take(ctx, spent, 1); err != nil || !d.Allowed {
				t.Fatal(d, err) // the other half's rule is spent
			}
			uc.arm()
			o, err := s.Evaluate(ctx, limit.Request{Checks: tenant, Global: global, Cost: 1})
			if err != nil || o.Decision.Allowed {
				t.Fatalf("%+v %v; want a denial", o.Decision, err)
			}
			if !uc.fired() {
				t.Fatal("fault not injected")
			}
			s.lost.wg.Wait() // the background releases are done
			d, err := s.Take(ctx, slot, 1)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				t.Errorf("the only slot is still held by the denied request (retry after %v): kept for the lease's period", d.RetryAfter)
			}
		})
	}
}

// On a Cluster, a metered request with an op id whose global half denies
// has its tenant half's meter charge given back by an undo that applies
// once. Whatever becomes of the undo's send, and whenever the op is placed
// again (the engine places it again when the request failed, and keeps it
// when its failure policy admits the call), the meter ends with the calls
// the caller's view says: the denied request billed nothing, the op placed
// again billed once.
func TestClusterSplitMeterUndoAppliesOnce(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t)
	c := cl.Client(t)
	for _, tc := range []struct {
		name  string
		mode  int
		place string // "": the op is not placed again; "after": after the undo's fate is known; "before": before the undo ran
		want  int64  // net calls on the meter
	}{
		{"reply_lost", faultLose, "", 0},
		{"reply_lost_op_placed_again", faultLose, "after", 1},
		{"send_failed_sent_again", faultDrop, "", 0},
		{"send_failed_op_placed_again_first", faultDrop, "before", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uc := &giveBackFault{Client: c, mode: tc.mode}
			s := newStore(t, uc, testTimeout)
			ctx := ctxT(t)
			id := fmt.Sprint(time.Now().UnixNano())
			tenant := "undo-" + id
			checks := tenantChecks(tenant, rule("tenant", limit.FixedWindow, 100, time.Hour))
			gr := rule("undo-global-"+id, limit.FixedWindow, 1, time.Hour)
			global := []limit.Check{splitGlobal(t, gr, checks[0].Key)}
			if d, err := s.Take(ctx, global, 1); err != nil || !d.Allowed {
				t.Fatal(d, err) // spend the global rule
			}
			m := testMeter(tenant, 0)
			m.Op = limit.NewOp()
			placeAgain := func() {
				t.Helper()
				if _, err := s.Adjust(ctx, m, limit.Usage{Charged: 1, Calls: 1}); err != nil {
					t.Fatal(err)
				}
			}
			uc.arm()
			o, err := s.Evaluate(ctx, limit.Request{Checks: checks, Global: global, Meter: &m, Cost: 1})
			if err != nil || o.Decision.Allowed {
				t.Fatalf("%+v %v; want a global denial", o.Decision, err)
			}
			if !uc.fired() {
				t.Fatal("fault not injected")
			}
			if tc.place == "before" {
				placeAgain() // the undo has not run yet: it is sent again later
			}
			s.lost.wg.Wait() // the undo sent again, if it is
			if tc.place == "after" {
				placeAgain()
			}
			ms, ok, err := s.ReadMeter(ctx, m.Key)
			if err != nil || !ok || ms.Live.NetCalls() != tc.want {
				t.Errorf("meter %+v (%v, %v): %d net calls, want %d", ms.Live, ok, err, ms.Live.NetCalls(), tc.want)
			}
		})
	}
}
