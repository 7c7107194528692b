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

// Apply checks the attribution of the federation's tools against the
// file's upstreams (g.fed.check(cfg) on the file), not against the
// upstreams in force (inForce keeps the prefixes the federation started
// with). A reload that gives upstream a (bare) limits while changing b's
// prefix from "" to "b__" (a start-only field, only warned about) passes
// that check: in the file a is the only bare upstream. In force both are
// still bare, so a's bare tool names read as no upstream's and a's new
// limits count none of its calls (b exposes only "b__other", which reads
// as b's under the file and as no one's at start): the config in force is one Parse
// refuses ("not allowed on an upstream with prefix \"\" while another has
// prefix \"\" too"), and calls that should be stopped go through.
func TestReloadAttributionCheckedAgainstFileNotInForce(t *testing.T) {
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
