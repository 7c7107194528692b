package gosdk_test

import (
	"context"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Under MCP 2026-07-28 (the go-sdk's stateless handler) list results carry
// the caching hint cacheScope, "public" by default: any intermediary may
// serve them to any caller. ScopeMiddleware trims tools/list to the
// caller's scopes but leaves it "public", so one caller's trimmed list may
// be served to another. The gateway makes every list it filtered "private"
// (mcp.Filter.Private, docs/design.md "MCP 2026-07-28 caching hints").
func TestTrimmedListIsPrivate(t *testing.T) {
	s := newToolServerOpts(t, "", func(srv *mcp.Server) {
		for _, name := range []string{"echo", "secret_admin_tool"} {
			mcp.AddTool(srv, &mcp.Tool{Name: name}, func(_ context.Context, _ *mcp.CallToolRequest, in textIn) (*mcp.CallToolResult, any, error) {
				return text(in.Text), nil, nil
			})
		}
	}, &mcp.StreamableHTTPOptions{Stateless: true}, &mcp.ServerOptions{
		// The server's full list may be cached a minute by anyone.
		SetCacheable: func(_ context.Context, _ mcp.Request, c *mcp.Cacheable) { c.TTLMs = 60000 },
	})
	cs := s.connect(t, sign(t, claims("scope-co", "bob", "tools:echo")))
	list, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("protocol %s; tools/list for scope tools:echo: %d tool(s), cacheScope %q ttlMs %d", cs.InitializeResult().ProtocolVersion, len(list.Tools), list.CacheScope, list.TTLMs)
	if len(list.Tools) != 1 || list.Tools[0].Name != "echo" {
		t.Fatalf("tools = %+v, want echo alone", list.Tools)
	}
	if list.CacheScope != "private" {
		t.Fatalf("a tools/list trimmed to the caller's scopes says cacheScope %q: an intermediary may serve it to other callers (the gateway says \"private\")", list.CacheScope)
	}
}
