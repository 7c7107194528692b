package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// hintingUpstream is a stateless go-sdk server (MCP 2026-07-28) with two
// tools and two prompts whose list results say they may be cached by
// anyone for a minute.
func hintingUpstream(t *testing.T) string {
	t.Helper()
	s := sdk.NewServer(&sdk.Implementation{Name: "hinting", Version: "1"}, &sdk.ServerOptions{
		SetCacheable: func(_ context.Context, _ sdk.Request, c *sdk.Cacheable) {
			c.TTLMs, c.CacheScope = 60_000, "public"
		},
	})
	for _, name := range []string{"echo", "secret"} {
		sdk.AddTool(s, &sdk.Tool{Name: name}, func(context.Context, *sdk.CallToolRequest, map[string]any) (*sdk.CallToolResult, any, error) {
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "ok"}}}, nil, nil
		})
		s.AddPrompt(&sdk.Prompt{Name: name}, func(context.Context, *sdk.GetPromptRequest) (*sdk.GetPromptResult, error) {
			return &sdk.GetPromptResult{}, nil
		})
	}
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, &sdk.StreamableHTTPOptions{Stateless: true})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// An SDK client speaking 2026-07-28 through the gateway gets the tools and
// prompts lists trimmed to its scopes marked cacheScope "private" (the
// upstream said "public"), with the upstream's ttlMs; the same client
// straight to the upstream sees "public", so the gateway made the change.
func TestFilteredListsArePrivateEndToEnd(t *testing.T) {
	t.Parallel()
	up := hintingUpstream(t)
	e := newEnv(t, setup{UpstreamURL: up})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tok := sign(t, claims("acme", "alice", "tools:echo prompts:echo"))

	direct := connect(t, up, tok, "2026-07-28")
	dt, err := direct.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if dt.CacheScope != "public" || dt.TTLMs != 60_000 || len(dt.Tools) != 2 {
		t.Fatalf("upstream's own tools/list: scope %q ttl %d, %d tools", dt.CacheScope, dt.TTLMs, len(dt.Tools))
	}

	cs := connect(t, e.mcpURL(0), tok, "2026-07-28")
	if got := cs.InitializeResult().ProtocolVersion; got != "2026-07-28" {
		t.Fatalf("negotiated %s", got)
	}
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tools.Tools) != 1 || tools.Tools[0].Name != "echo" {
		t.Fatalf("tools/list through the gateway: %v", tools.Tools)
	}
	if tools.CacheScope != "private" || tools.TTLMs != 60_000 {
		t.Fatalf("tools/list: cacheScope %q ttlMs %d, want private and 60000", tools.CacheScope, tools.TTLMs)
	}
	prompts, err := cs.ListPrompts(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(prompts.Prompts) != 1 || prompts.CacheScope != "private" || prompts.TTLMs != 60_000 {
		t.Fatalf("prompts/list: %d prompts, cacheScope %q ttlMs %d", len(prompts.Prompts), prompts.CacheScope, prompts.TTLMs)
	}
}
