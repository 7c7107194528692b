package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/examples/upstream"
)

// A reload that gives upstream a (bare) limits while changing b's prefix
// from "" to "b__" (a start-only field, only warned about) is either
// refused or enforced: in force both are still bare (b exposes only
// "b__other"), so accepted, a's limits must still stop a's calls. (Once,
// Apply checked the attribution against the file's upstreams, where a is
// the only bare one, accepted the reload, and a's bare tool names read as
// no upstream's: its limits counted none of its calls, under a config in
// force that Parse refuses.)
func TestReloadGivingBareUpstreamLimitsRefusedOrEnforced(t *testing.T) {
	t.Parallel()
	ua := startFedHTTP(t, upstream.New(&upstream.Options{Name: "upstream-a"}))
	sb := sdk.NewServer(&sdk.Implementation{Name: "upstream-b", Version: "1"}, nil)
	sdk.AddTool(sb, &sdk.Tool{Name: "b__other"}, func(ctx context.Context, req *sdk.CallToolRequest, a fedText) (*sdk.CallToolResult, any, error) {
		return textResult("b"), nil, nil
	})
	hb := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return sb }, nil))
	t.Cleanup(hb.Close)

	cfg := reloadFedConfig(t, "start.yaml", fmt.Sprintf("upstreams:\n  - {name: a, url: %q, prefix: \"\"}\n  - {name: b, url: %q, prefix: \"\"}\n", ua.URL(), hb.URL+"/mcp"))
	g := (&env{t: t}).newGateway(cfg, setup{})
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)

	next := reloadFedConfig(t, "reload.yaml", fmt.Sprintf(`upstreams:
  - name: a
    url: %q
    prefix: ""
    limits: [{name: a_calls, algorithm: fixed_window, limit: 1, period: 1m}]
  - {name: b, url: %q, prefix: "b__"}
`, ua.URL(), hb.URL+"/mcp"))
	if err := g.Apply(next, authFor(t, next, nil)); err != nil {
		t.Logf("reload refused (acceptable): %v", err)
		return
	}
	cs := fedConnect(t, srv.URL+"/mcp", token(t, "acme", "alice"), "", nil)
	if _, isErr := fedCall(t, cs, "echo", map[string]any{"text": "1"}); isErr {
		t.Fatal("first echo failed")
	}
	_, err := callTool(t.Context(), cs, "echo", map[string]any{"text": "2"})
	if !isRateLimited(err) {
		t.Fatalf("reload accepted with upstream a's limit a_calls (1/min), but the second call to a's tool echo was admitted (err = %v): in force a and b are both bare, so echo reads as no upstream's and a's limits count nothing", err)
	}
}
