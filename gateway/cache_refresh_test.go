package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/examples/upstream"
)

// gateCached makes the test's gate tool cacheable (per tenant).
const gateCached = `
tools:
  gate:
    cache: {ttl: 10m}
`

// gateTool is an upstream tool whose first call answers at once and whose
// later calls (the early refreshes) run until released, counting those
// that were cancelled instead.
type gateTool struct {
	calls     atomic.Int64
	started   chan struct{} // one per later call, when it starts
	release   func()
	released  chan struct{}
	ended     chan struct{} // one per later call, when it returns
	cancelled atomic.Int64
}

func addGateTool(t *testing.T, up *upstream.Server) *gateTool {
	g := &gateTool{started: make(chan struct{}, 8), ended: make(chan struct{}, 8), released: make(chan struct{})}
	g.release = sync.OnceFunc(func() { close(g.released) })
	t.Cleanup(g.release)
	sdk.AddTool(up.MCPServer(), &sdk.Tool{Name: "gate"}, func(ctx context.Context, _ *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, any, error) {
		n := g.calls.Add(1)
		if n > 1 {
			g.started <- struct{}{}
			defer func() { g.ended <- struct{}{} }()
			select {
			case <-g.released:
			case <-ctx.Done():
				g.cancelled.Add(1)
				return nil, nil, ctx.Err()
			}
		}
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: fmt.Sprintf("gate %d", n)}}}, nil, nil
	})
	return g
}

// An early refresh that a hit starts runs upstream after that call was
// answered, in the caller's session: it goes there under an id of the
// gateway's own, never the caller's. Under the caller's id, a late
// notifications/cancelled naming the answered call (MCP allows it; the
// client cannot know a load carries its id) went upstream and cancelled the
// refresh, and the client's next request reusing the id (JSON-RPC allows
// it once answered) got the upstream's 400 for a duplicate id in flight.
func TestEarlyRefreshRunsUpstreamUnderTheGatewaysID(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		// during runs while the refresh runs upstream.
		during func(t *testing.T, e *env, a *agent)
	}{
		{"late cancellation of the answered call", func(t *testing.T, e *env, a *agent) {
			r := a.post(0, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2,"reason":"late"}}`)
			if r.Status != http.StatusAccepted {
				t.Fatalf("cancellation: %d %s", r.Status, r.Body)
			}
			// It names no call of the gateway's, so it goes upstream, where
			// it must name none either.
			eventually(t, 10*time.Second, "the cancellation to reach the upstream", func() bool {
				return e.up.Requests("notifications/cancelled") == 1
			})
		}},
		{"next request reusing the answered call's id", func(t *testing.T, _ *env, a *agent) {
			r := a.post(0, callBody(2, "echo", map[string]any{"text": "hi"}))
			if r.Status != http.StatusOK || r.Msg.Error != nil || !strings.Contains(string(r.Msg.Result), "hi") {
				t.Fatalf("a request reusing the id of an answered call: %d %s", r.Status, r.Body)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, setup{Config: gateCached, Upstream: upstream.Options{}, CacheOptions: &cache.Options{Beta: 1e9}})
			gate := addGateTool(t, e.up)
			a := newAgent(t, e, "acme", "alice", false)
			if r := a.post(0, callBody(1, "gate", nil)); cacheSrc(r) != "miss" || r.Msg.Result == nil {
				t.Fatalf("first call: %d %s", r.Status, r.Body)
			}
			if r := a.post(0, callBody(2, "gate", nil)); cacheSrc(r) != "hit" || r.Msg.Result == nil {
				t.Fatalf("second call: %d %s", r.Status, r.Body)
			}
			<-gate.started // call 2 was answered; the refresh it started runs upstream
			c.during(t, e, a)
			gate.release()
			<-gate.ended
			if n := gate.cancelled.Load(); n != 0 {
				t.Fatalf("the gateway's early refresh was cancelled upstream (%d)", n)
			}
			// The refresh's answer, matched to its own id, was stored.
			id := 10
			eventually(t, 10*time.Second, "the refreshed value to be served", func() bool {
				id++
				r := a.post(0, callBody(id, "gate", nil))
				return r.Msg.Result != nil && !strings.Contains(string(r.Msg.Result), "gate 1")
			})
		})
	}
}
