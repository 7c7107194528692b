package enforce_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/usage"
)

// undoReplyLost is a Cluster client that, once armed, (1) answers the next
// split request's global half (the DoMulti call carrying a {~g} key) with a
// timeout without sending it, then (2) sends the next DoMulti (the undo of
// the tenant half) and loses its replies (as a timeout after it ran).
type undoReplyLost struct {
	rueidis.Client
	stage atomic.Int32 // 0 idle, 1 fail the global half, 2 lose the undo's replies
}

func isGlobal(cmd rueidis.Completed) bool {
	for _, a := range cmd.Commands() {
		if strings.Contains(a, "{~g}") {
			return true
		}
	}
	return false
}

func (c *undoReplyLost) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	switch c.stage.Load() {
	case 1:
		gi := -1
		for i, cmd := range cmds {
			if isGlobal(cmd) {
				gi = i
			}
		}
		if gi < 0 || len(cmds) < 2 {
			break
		}
		c.stage.Store(2)
		var rest []rueidis.Completed
		for i, cmd := range cmds {
			if i != gi {
				rest = append(rest, cmd)
			}
		}
		rs := c.Client.DoMulti(ctx, rest...)
		out := make([]rueidis.RedisResult, 0, len(cmds))
		for i := range cmds {
			if i == gi {
				out = append(out, rueidis.NewErrorResult(context.DeadlineExceeded))
				continue
			}
			out = append(out, rs[0])
			rs = rs[1:]
		}
		return out
	case 2:
		c.stage.Store(0)
		rs := c.Client.DoMulti(ctx, cmds...) // the undo runs...
		for i := range rs {
			rs[i] = rueidis.NewErrorResult(context.DeadlineExceeded) // ...its replies are lost
		}
		return rs
	}
	return c.Client.DoMulti(ctx, cmds...)
}

// On a Cluster, a layered call whose global half times out has its tenant
// half undone (its meter charge given back), and the engine then places
// the call's op again: to take it back when its failure policy refuses
// the call (closed), to keep it when it admits it (open). The undo's reply
// can be lost after it ran. The durable usage must still count each
// admitted call once and a refused one not at all: neither a credit to
// the tenant (the op placed again finding it done, then refunded) nor an
// admitted call billed nothing.
func TestClusterSplitUndoReplyLostBilledOnce(t *testing.T) {
	cl := testenv.StartCluster(t)
	for _, tc := range []struct {
		onErr string
		want  int64 // calls admitted and billed of 3
	}{{"closed", 2}, {"open", 3}} {
		t.Run(tc.onErr, func(t *testing.T) {
			lc := &undoReplyLost{Client: cl.Client(t)}
			rs, err := redisstore.New(lc, &redisstore.Options{Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(rs.Close)
			shared := newFaultyStore(rs)
			us := openSQLite(t)
			tenant := "acme-" + tc.onErr
			e := newEngine(t, `upstream: {url: "http://127.0.0.1:1/mcp"}
store: {timeout: 2s, on_error: `+tc.onErr+`}
usage: {flush_interval: 1h}
global:
  - {name: all, algorithm: fixed_window, limit: 1000, period: 1h}
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: 100, period: 1h}
tools:
  llm: {cost: 3}
`, enforce.Options{Usage: us, Shared: shared, Probe: func(context.Context) error { return nil }})
			<-shared.swept
			call := enforce.Call{Tenant: tenant, Subject: "a", Name: "llm"}
			var admitted int64
			for i := range 3 {
				if i == 1 {
					lc.stage.Store(1)
				}
				tk, d := e.Admit(context.Background(), call)
				if d.Allowed {
					admitted++
				}
				tk.Done(context.Background(), enforce.Outcome{})
				if i == 1 && lc.stage.Load() != 0 {
					t.Fatalf("fault not injected (stage %d)", lc.stage.Load())
				}
			}
			if admitted != tc.want {
				t.Fatalf("%d admitted, want %d", admitted, tc.want)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			rec, _, err := us.Get(context.Background(), tenant, usage.Period(time.Now()))
			if err != nil {
				t.Fatal(err)
			}
			if rec.NetCalls() != admitted || rec.Used() != 3*admitted {
				t.Errorf("durable usage %+v: %d net calls, %d units; want %d calls, %d units",
					rec.Usage, rec.NetCalls(), rec.Used(), admitted, 3*admitted)
			}
		})
	}
}
