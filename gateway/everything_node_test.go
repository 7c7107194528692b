//lint:file-ignore SA1019 sampling is deprecated in MCP 2026-07-28 but still served; the federation relays it.

package gateway

// The reference MCP server of the TypeScript ecosystem,
// @modelcontextprotocol/server-everything (pinned in the npm project of
// internal/conformance/testdata/node), as a stdio upstream of a federated
// gateway, next to the Go SDK demo upstream over HTTP.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/policy"
)

// everythingEntry is server-everything's bin (dist/index.js) in the npm
// project: it serves stdio unless told otherwise ("stdio" says so).
var everythingEntry = filepath.Join("node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js")

// requireEverything returns the project's Node 22 and server-everything's
// stdio entry. When they are missing the test is skipped with the command
// that installs them, or fails when CI is true: CI never skips.
func requireEverything(t *testing.T) (node, entry string) {
	t.Helper()
	node, project := requireNode(t)
	entry = filepath.Join(project, everythingEntry)
	if _, err := os.Stat(entry); err != nil {
		msg := "@modelcontextprotocol/server-everything is not installed (" + err.Error() + "); scripts/test installs it " +
			"(by hand: npm ci --prefix internal/conformance/testdata/node --ignore-scripts && npm rebuild --prefix internal/conformance/testdata/node node)"
		testenv.Missing(t, msg)
	}
	return node, entry
}

// everythingGateway starts a gateway in front of two upstreams: the demo
// upstream over HTTP (name demo, default prefix demo__) and
// server-everything run by the gateway in stdio mode (prefix everything__).
// It returns the gateway's MCP endpoint.
func everythingGateway(t *testing.T) string {
	t.Helper()
	node, entry := requireEverything(t)
	demo := httptest.NewServer(upstream.New(nil).Handler())
	t.Cleanup(demo.Close)
	yaml := fmt.Sprintf(`upstream: {timeout: 20s}
upstreams:
  - {name: demo, url: %q}
  - {name: everything, command: [%q, %q, stdio], prefix: everything__}
auth:
  jwt: {hs256_secret_env: MCPGATE_GATEWAY_TEST_SECRET, issuer: %q, audience: %q}
`, demo.URL+"/mcp", node, entry, testIssuer, testAudience)
	cfg, err := policy.Parse("everything_test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("config:\n%s\n%v", yaml, err)
	}
	g := (&env{t: t}).newGateway(cfg, setup{})
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// everythingClient is what a client session of the test received from the
// gateway: progress notifications, log messages, sampling and elicitation
// requests.
type everythingClient struct {
	mu       sync.Mutex
	progress []*sdk.ProgressNotificationParams
	logs     []*sdk.LoggingMessageParams
	sampled  []*sdk.CreateMessageParams
	elicited []*sdk.ElicitParams
}

func (c *everythingClient) options() *sdk.ClientOptions {
	return &sdk.ClientOptions{
		CreateMessageHandler: func(_ context.Context, req *sdk.CreateMessageRequest) (*sdk.CreateMessageResult, error) {
			c.mu.Lock()
			c.sampled = append(c.sampled, req.Params)
			c.mu.Unlock()
			return &sdk.CreateMessageResult{Model: "test-model", Role: "assistant",
				Content: &sdk.TextContent{Text: "sampled by the Go test client"}}, nil
		},
		ElicitationHandler: func(_ context.Context, req *sdk.ElicitRequest) (*sdk.ElicitResult, error) {
			c.mu.Lock()
			c.elicited = append(c.elicited, req.Params)
			c.mu.Unlock()
			return &sdk.ElicitResult{Action: "accept", Content: map[string]any{"name": "Ada Lovelace"}}, nil
		},
		ProgressNotificationHandler: func(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
			c.mu.Lock()
			c.progress = append(c.progress, req.Params)
			c.mu.Unlock()
		},
		LoggingMessageHandler: func(_ context.Context, req *sdk.LoggingMessageRequest) {
			c.mu.Lock()
			c.logs = append(c.logs, req.Params)
			c.mu.Unlock()
		},
	}
}

// progressOf returns the progress notifications received with token.
func (c *everythingClient) progressOf(token string) []float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []float64
	for _, p := range c.progress {
		if p.ProgressToken == token {
			out = append(out, p.Progress)
		}
	}
	return out
}

func (c *everythingClient) logCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.logs)
}

// everythingConnect opens a session of the official Go SDK client to
// endpoint, speaking protocol ("" is the SDK's default).
func everythingConnect(t *testing.T, endpoint, protocol string, opts *sdk.ClientOptions) *sdk.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	client := sdk.NewClient(&sdk.Implementation{Name: "everything-test", Version: "1"}, opts)
	cs, err := client.Connect(ctx, transport(endpoint, bearer{token: token(t, "acme", "alice"), base: tr}),
		&sdk.ClientSessionOptions{ProtocolVersion: protocol})
	if err != nil {
		t.Fatalf("connect to the federated gateway (protocol %q): %v", protocol, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// everythingCall calls tool; a protocol error or a tool error fails the
// test. It returns the joined text of the result.
func everythingCall(t *testing.T, cs *sdk.ClientSession, params *sdk.CallToolParams) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		t.Fatalf("%s: %v", params.Name, err)
	}
	text := testenv.ToolText(res)
	if res.IsError {
		t.Fatalf("%s: tool error %q", params.Name, text)
	}
	return text
}

// The Go SDK client, through a gateway federating server-everything
// (stdio) and the demo upstream (HTTP): see everythingSessions and
// everythingStateless. The two share one gateway (server-everything, when
// stopped in its first second, takes the 5s the SDK grants it before its
// SIGTERM).
func TestFederationServerEverything(t *testing.T) {
	endpoint := everythingGateway(t)
	t.Run("sessions", func(t *testing.T) { everythingSessions(t, endpoint) })
	t.Run("stateless", func(t *testing.T) { everythingStateless(t, endpoint) })
}

// everythingSessions: a client of MCP 2025-11-25 (sessions) sees both
// upstreams' tools under their prefixes, calls tools, reads resources (a
// listed one and a template's) and gets prompts of both, and receives what
// server-everything sends it during a call: progress notifications, log
// messages, and sampling and elicitation requests, which it answers.
func everythingSessions(t *testing.T, endpoint string) {
	var got everythingClient
	cs := everythingConnect(t, endpoint, "2025-11-25", got.options())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatalf("tools/list: %v", err)
		}
		names = append(names, tool.Name)
	}
	for _, want := range []string{"demo__echo", "demo__slow", "everything__echo", "everything__get-sum",
		"everything__trigger-long-running-operation", "everything__toggle-simulated-logging"} {
		if !slices.Contains(names, want) {
			t.Errorf("tools/list: no %s in %q", want, names)
		}
	}
	// server-everything registers these only for a client that can sample
	// and elicit: the federation's shared stdio session serves every
	// client and can ask none of them (a request could not say whose call
	// it is for), so it says it cannot.
	for _, absent := range []string{"everything__trigger-sampling-request", "everything__trigger-elicitation-request"} {
		if slices.Contains(names, absent) {
			t.Errorf("tools/list: %s offered by a stdio server whose session cannot relay it", absent)
		}
	}
	for _, n := range names {
		if !strings.HasPrefix(n, "demo__") && !strings.HasPrefix(n, "everything__") {
			t.Errorf("tools/list: %s has neither prefix", n)
		}
	}

	// Tools of both upstreams.
	if s := everythingCall(t, cs, &sdk.CallToolParams{Name: "everything__echo", Arguments: map[string]any{"message": "hi"}}); s != "Echo: hi" {
		t.Errorf("everything__echo: %q, want %q", s, "Echo: hi")
	}
	if s := everythingCall(t, cs, &sdk.CallToolParams{Name: "everything__get-sum", Arguments: map[string]any{"a": 2, "b": 40}}); s != "The sum of 2 and 40 is 42." {
		t.Errorf("everything__get-sum: %q", s)
	}
	if s := everythingCall(t, cs, &sdk.CallToolParams{Name: "demo__echo", Arguments: map[string]any{"text": "hi"}}); s != "hi" {
		t.Errorf("demo__echo: %q, want %q", s, "hi")
	}

	// Resources: a listed one and a template's of server-everything, one of
	// the demo upstream.
	var static string
	for r, err := range cs.Resources(ctx, nil) {
		if err != nil {
			t.Fatalf("resources/list: %v", err)
		}
		if static == "" && strings.HasPrefix(r.URI, "demo://resource/static/document/") {
			static = r.URI
		}
	}
	if static == "" {
		t.Fatal("resources/list: no static document of server-everything")
	}
	for uri, want := range map[string]string{
		static:                              "",
		"demo://resource/dynamic/text/7":    "Resource 7: This is a plaintext resource",
		upstream.ResourceURIs[0]:            "contents of " + upstream.ResourceURIs[0],
		"file:///docs/from-the-template.md": "contents of file:///docs/from-the-template.md",
	} {
		res, err := cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: uri})
		if err != nil {
			t.Errorf("resources/read %s: %v", uri, err)
			continue
		}
		if len(res.Contents) != 1 || res.Contents[0].URI != uri || res.Contents[0].Text == "" || !strings.HasPrefix(res.Contents[0].Text, want) {
			t.Errorf("resources/read %s: %+v, want one text beginning %q", uri, res.Contents, want)
		}
	}

	// Prompts of both upstreams.
	for _, c := range []struct {
		name string
		args map[string]string
		want string
	}{
		{"everything__simple-prompt", nil, "This is a simple prompt without arguments."},
		{"everything__args-prompt", map[string]string{"city": "Paris"}, "What's weather in Paris?"},
		{"demo__summarize", map[string]string{"text": "x"}, "summarize: x"},
	} {
		res, err := cs.GetPrompt(ctx, &sdk.GetPromptParams{Name: c.name, Arguments: c.args})
		if err != nil {
			t.Errorf("prompts/get %s: %v", c.name, err)
			continue
		}
		if len(res.Messages) == 0 {
			t.Errorf("prompts/get %s: no messages", c.name)
			continue
		}
		if tc, ok := res.Messages[0].Content.(*sdk.TextContent); !ok || !strings.Contains(tc.Text, c.want) {
			t.Errorf("prompts/get %s: first message %+v, want a text with %q", c.name, res.Messages[0].Content, c.want)
		}
	}

	// Progress: trigger-long-running-operation reports each step to the
	// caller's token. (The Go SDK client runs its notification handlers
	// apart from the call that returns, so a notification sent just before
	// the answer may be handled just after CallTool returns: this waits for
	// them. Whether they come before the answer on the wire, as they must,
	// is checked with the TypeScript client, which handles messages in
	// order: TestFederationTypeScriptClient.)
	const steps = 3
	op := &sdk.CallToolParams{Name: "everything__trigger-long-running-operation", Arguments: map[string]any{"duration": 0.3, "steps": steps}}
	op.SetProgressToken("everything-progress")
	if s := everythingCall(t, cs, op); !strings.Contains(s, "Long running operation completed") {
		t.Errorf("trigger-long-running-operation: %q", s)
	}
	deadline := time.Now().Add(3 * time.Second)
	for len(got.progressOf("everything-progress")) < steps && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if p := got.progressOf("everything-progress"); !slices.Equal(p, []float64{1, 2, 3}) {
		t.Errorf("progress received: %v, want [1 2 3]", p)
	}

	// Log messages: the client asks for every level; toggle-simulated-logging
	// sends one at once (then one every 5s until toggled off). They go to
	// mcpgate's log, not to the client: on the shared stdio session they
	// cannot say which client's call they are of.
	if err := cs.SetLoggingLevel(ctx, &sdk.SetLoggingLevelParams{Level: "debug"}); err != nil {
		t.Fatalf("logging/setLevel: %v", err)
	}
	if s := everythingCall(t, cs, &sdk.CallToolParams{Name: "everything__toggle-simulated-logging"}); !strings.Contains(s, "Started simulated") {
		t.Errorf("toggle-simulated-logging: %q", s)
	}
	if s := everythingCall(t, cs, &sdk.CallToolParams{Name: "everything__toggle-simulated-logging"}); !strings.Contains(s, "Stopped simulated") {
		t.Errorf("toggle-simulated-logging (off): %q", s)
	}
	if n := got.logCount(); n != 0 {
		t.Errorf("%d log messages of the shared stdio session reached a client", n)
	}
}

// everythingStateless: a client of MCP 2026-07-28 (the Go SDK's default:
// stateless, no session) calls the tools of both upstreams too.
func everythingStateless(t *testing.T, endpoint string) {
	cs := everythingConnect(t, endpoint, "", nil)
	if v := cs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
		t.Logf("note: the Go SDK client negotiated %s, not 2026-07-28", v)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"everything__get-sum", map[string]any{"a": 1, "b": 2}, "The sum of 1 and 2 is 3."},
		{"demo__echo", map[string]any{"text": "stateless"}, "stateless"},
	} {
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: c.tool, Arguments: c.args})
		if err != nil {
			t.Errorf("%s: %v", c.tool, err)
			continue
		}
		if got := testenv.ToolText(res); res.IsError || got != c.want {
			t.Errorf("%s: %q (isError %t), want %q", c.tool, got, res.IsError, c.want)
		}
	}
}
