package gosdk_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/enforce"
)

// An early refresh (XFetch) a hit starts runs its handler under the
// tenant's concurrency slots: the hit's call keeps its slot until the
// refresh ends, or the refresh takes one of its own. A call made while it
// runs is refused under a limit of one, never run beside it. The hit was
// settled at once, and the refresh ran outside every slot: a tenant at its
// limit ran extra handlers through hits.
func TestEarlyRefreshRunsUnderTheTenantsSlot(t *testing.T) {
	var running, overlaps, started atomic.Int64
	var blockAll atomic.Bool
	release := make(chan struct{})
	s := newToolServerWith(t, `
tools:
  block:
    cache: {ttl: 10m}
    limits:
      - {name: block_one, per: tenant_tool, algorithm: concurrency, limit: 1, period: 1m}
`, func(srv *mcp.Server) {
		mcp.AddTool(srv, &mcp.Tool{Name: "block"}, func(_ context.Context, _ *mcp.CallToolRequest, in struct {
			K int `json:"k"`
		}) (*mcp.CallToolResult, any, error) {
			if running.Add(1) > 1 {
				overlaps.Add(1)
			}
			defer running.Add(-1)
			started.Add(1)
			if blockAll.Load() {
				<-release
			}
			return text("v"), nil, nil
		})
	}, nil, nil, func(o *enforce.Options) {
		store, err := cache.NewMemoryStore(nil)
		if err != nil {
			t.Fatal(err)
		}
		c, err := cache.New(store, &cache.Options{Beta: 1e9}) // every hit refreshes
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		o.Cache = c
	})
	defer close(release) // before the server's cleanups
	cs := s.connect(t, token(t, "acme", "alice"))
	ctx := context.Background()
	if _, err := call(ctx, cs, "block", map[string]any{"k": 1}); err != nil {
		t.Fatalf("the loading call: %v", err)
	}
	blockAll.Store(true) // the refresh blocks in its handler
	deadline := time.Now().Add(10 * time.Second)
	for started.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no hit's refresh reached the handler")
		}
		if _, err := call(ctx, cs, "block", map[string]any{"k": 1}); err != nil && rpcError(err) == nil {
			t.Fatalf("the hit: %v", err)
		}
	}
	// The refresh runs: a call of another key must not run beside it.
	_, err := call(ctx, cs, "block", map[string]any{"k": 2})
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("a handler ran beside the refresh (%d overlaps); the call got %v", n, err)
	}
	if d := denial(t, err); d.Rule != "block_one" {
		t.Fatalf("a call while the refresh runs: denial %+v, want block_one", d)
	}
}
