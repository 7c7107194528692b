package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// askUpstream is a go-sdk upstream (stateful, event streams) whose "ask"
// tool needs the caller's confirmation (MCP 2026-07-28 input requests; the
// SDK turns them into an elicitation/create over the call's stream for an
// older client).
func askUpstream(t *testing.T) (string, *int) {
	t.Helper()
	runs := new(int)
	srv := sdk.NewServer(&sdk.Implementation{Name: "ask-upstream", Version: "1"}, nil)
	type askIn struct {
		Q string `json:"q"`
	}
	sdk.AddTool(srv, &sdk.Tool{Name: "ask", Description: "asks the caller to confirm"},
		func(_ context.Context, req *sdk.CallToolRequest, in askIn) (*sdk.CallToolResult, any, error) {
			resp, ok := req.Params.InputResponses["confirm"].(*sdk.ElicitResult)
			if !ok {
				return &sdk.CallToolResult{InputRequests: sdk.InputRequestMap{"confirm": &sdk.ElicitParams{
					Mode: "form", Message: "confirm " + in.Q,
					RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"who": map[string]any{"type": "string"}}},
				}}}, nil, nil
			}
			*runs++
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: fmt.Sprintf("%s confirmed by %v", in.Q, resp.Content["who"])}}}, nil, nil
		})
	up := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil))
	t.Cleanup(up.Close)
	return up.URL, runs
}

func elicitingSession(t *testing.T, ctx context.Context, url, tenant, who, protocol string) *sdk.ClientSession {
	t.Helper()
	client := sdk.NewClient(&sdk.Implementation{Name: "gateway-test", Version: "1"}, &sdk.ClientOptions{
		ElicitationHandler: func(context.Context, *sdk.ElicitRequest) (*sdk.ElicitResult, error) {
			return &sdk.ElicitResult{Action: "accept", Content: map[string]any{"who": who}}, nil
		},
	})
	cs, err := client.Connect(ctx, transport(url, bearer{token: token(t, tenant, who)}), &sdk.ClientSessionOptions{ProtocolVersion: protocol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// A load during which the upstream asked its client something is not
// stored, per-tenant entries included: under a 2025 protocol the upstream
// asks the loader's client over the call's SSE answer, and that answer
// (alice's) must not be served to bob of the same tenant, nor to carol,
// whose 2026-07-28 protocol would have had her asked (input_required,
// TestCacheInputRequiredIsNotCached).
func TestCacheElicitedTenantEntryNotStored(t *testing.T) {
	t.Parallel()
	url, _ := askUpstream(t)
	e := newEnv(t, setup{UpstreamURL: url, Config: "tools:\n  ask:\n    cache: {ttl: 10m}\n"})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, c := range []struct{ who, protocol string }{{"alice", "2025-11-25"}, {"bob", "2025-11-25"}, {"carol", "2026-07-28"}} {
		cs := elicitingSession(t, ctx, e.mcpURL(0), "acme", c.who, c.protocol)
		res, err := callTool(ctx, cs, "ask", map[string]any{"q": "x"})
		if err != nil {
			t.Fatalf("%s: %v", c.who, err)
		}
		if got := resultText(res); got != "x confirmed by "+c.who {
			t.Errorf("%s (%s) got %q, want the answer to its own input", c.who, c.protocol, got)
		}
	}
}

// A go-sdk upstream answering calls as JSON (StreamableHTTPOptions.
// JSONResponse, stateful) sends its elicitation on the session's GET stream,
// not on the call's answer: the gateway sees the question there (and the
// client's answer POSTed in the session), and stores no shared entry that
// holds acme's answer for initech to read.
func TestCacheSharedEntryNotStoredWhenAskedOnGETStream(t *testing.T) {
	t.Parallel()
	runs := 0
	srv := sdk.NewServer(&sdk.Implementation{Name: "ask-upstream", Version: "1"}, nil)
	type askIn struct {
		Q string `json:"q"`
	}
	sdk.AddTool(srv, &sdk.Tool{Name: "ask", Description: "asks the caller to confirm"},
		func(ctx context.Context, req *sdk.CallToolRequest, in askIn) (*sdk.CallToolResult, any, error) {
			res, err := req.Session.Elicit(ctx, &sdk.ElicitParams{Mode: "form", Message: "confirm " + in.Q,
				RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"who": map[string]any{"type": "string"}}}})
			if err != nil {
				return nil, nil, err
			}
			runs++
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: fmt.Sprintf("%s confirmed by %v", in.Q, res.Content["who"])}}}, nil, nil
		})
	up := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv },
		&sdk.StreamableHTTPOptions{JSONResponse: true}))
	t.Cleanup(up.Close)
	e := newEnv(t, setup{UpstreamURL: up.URL, UpstreamYAML: "  timeout: 5s\n", Config: "tools:\n  ask:\n    cache: {ttl: 10m, shared: true}\n"})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, c := range []struct{ tenant, who string }{{"acme", "alice"}, {"initech", "bob"}} {
		cs := elicitingSession(t, ctx, e.mcpURL(0), c.tenant, c.who, "2025-11-25")
		res, err := callTool(ctx, cs, "ask", map[string]any{"q": "x"})
		if err != nil {
			t.Fatalf("%s: %v", c.who, err)
		}
		if got := resultText(res); got != "x confirmed by "+c.who {
			t.Errorf("%s of %s got %q, want the answer to its own client's input (upstream ran %d times)", c.who, c.tenant, got, runs)
		}
	}
}

// askedDuring reports a question or an answer counted for the load's
// session while it ran, and cannot tell for a session it does not track.
func TestAskedDuring(t *testing.T) {
	e := newEnv(t, setup{})
	tr := e.gws[0].tracker
	tr.add("s1", principal("acme", "alice"), enforce.SessionSlots{}, "", true)
	quiet := tr.askedDuring("s1")
	if quiet() {
		t.Error("a session nobody asked: asked")
	}
	asked := tr.askedDuring("s1")
	tr.askedClient("s2") // another session's question
	if asked() {
		t.Error("another session's question counted for s1")
	}
	tr.askedClient("s1")
	if !asked() {
		t.Error("a question in s1 while its load ran: not seen")
	}
	if quiet := tr.askedDuring("s1"); quiet() {
		t.Error("a question before the load started counted")
	}
	if !tr.askedDuring("untracked")() {
		t.Error("a session not tracked here: reported as not asked, though this instance cannot tell")
	}
	if tr.askedDuring("")() {
		t.Error("no session: reported as asked")
	}
	gone := tr.askedDuring("s1")
	tr.remove("s1")
	if !gone() {
		t.Error("a session that ended while its load ran: reported as not asked")
	}
}
