//lint:file-ignore SA1019 sampling is deprecated in MCP 2026-07-28 but still served; the federation relays it.

package gateway

// Harness of the federation tests (upstreams:): two HTTP upstreams built
// with the official Go SDK (examples/upstream, which counts the calls that
// reach it) on loopback ports that survive a restart, and a stdio upstream
// that is this test binary run again as a go-sdk server (TestMain), all
// behind one or more Gateways built as newEnv builds them.

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/policy"
)

// fedStdioEnv makes the test binary a stdio MCP server (newStdioServer)
// named by its value: the gateway runs it as it runs any upstreams[].command.
const fedStdioEnv = "MCPGATE_GATEWAY_TEST_STDIO_SERVER"

func TestMain(m *testing.M) {
	if name := os.Getenv(fedStdioEnv); name != "" {
		if err := newStdioServer(name).Run(context.Background(), &sdk.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, "stdio server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type fedText struct {
	Text string `json:"text,omitempty"`
}

func textResult(s string) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: s}}}
}

// addRelayTools adds the tools that ask things of the client: sample (a
// sampling/createMessage request; its answer is returned as
// "<name> sampled: <text>") and notify (a log message "<name> says <text>"
// at info, and one progress notification on the caller's token).
func addRelayTools(s *sdk.Server, name string) {
	sdk.AddTool(s, &sdk.Tool{Name: "sample"}, func(ctx context.Context, req *sdk.CallToolRequest, a fedText) (*sdk.CallToolResult, any, error) {
		res, err := req.Session.CreateMessage(ctx, &sdk.CreateMessageParams{MaxTokens: 10,
			Messages: []*sdk.SamplingMessage{{Role: "user", Content: &sdk.TextContent{Text: a.Text}}}})
		if err != nil {
			return nil, nil, err
		}
		tc, _ := res.Content.(*sdk.TextContent)
		if tc == nil {
			return nil, nil, fmt.Errorf("sampling answered %T", res.Content)
		}
		return textResult(name + " sampled: " + tc.Text), nil, nil
	})
	sdk.AddTool(s, &sdk.Tool{Name: "notify"}, func(ctx context.Context, req *sdk.CallToolRequest, a fedText) (*sdk.CallToolResult, any, error) {
		if err := req.Session.Log(ctx, &sdk.LoggingMessageParams{Level: "info", Data: name + " says " + a.Text}); err != nil {
			return nil, nil, err
		}
		if tok := req.Params.GetProgressToken(); tok != nil {
			if err := req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Total: 2, Message: name}); err != nil {
				return nil, nil, err
			}
		}
		return textResult("notified"), nil, nil
	})
}

// newStdioServer is the stdio upstream: tools echo ("<name>: <text>"),
// count (how many echo calls this process served: the test's only way to
// count what reached a process it does not share memory with), crash
// (exits with status 3), sample and notify (addRelayTools); a prompt greet
// ("hello from <name>") and a resource test://<name>/info.
func newStdioServer(name string) *sdk.Server {
	s := sdk.NewServer(&sdk.Implementation{Name: "stdio-" + name, Version: "1"}, nil)
	var echoes atomic.Int64
	sdk.AddTool(s, &sdk.Tool{Name: "echo"}, func(ctx context.Context, req *sdk.CallToolRequest, a fedText) (*sdk.CallToolResult, any, error) {
		echoes.Add(1)
		return textResult(name + ": " + a.Text), nil, nil
	})
	sdk.AddTool(s, &sdk.Tool{Name: "count"}, func(ctx context.Context, req *sdk.CallToolRequest, a fedText) (*sdk.CallToolResult, any, error) {
		return textResult(strconv.FormatInt(echoes.Load(), 10)), nil, nil
	})
	sdk.AddTool(s, &sdk.Tool{Name: "crash"}, func(ctx context.Context, req *sdk.CallToolRequest, a fedText) (*sdk.CallToolResult, any, error) {
		os.Exit(3)
		return nil, nil, nil
	})
	addRelayTools(s, name)
	s.AddPrompt(&sdk.Prompt{Name: "greet"}, func(ctx context.Context, req *sdk.GetPromptRequest) (*sdk.GetPromptResult, error) {
		return &sdk.GetPromptResult{Messages: []*sdk.PromptMessage{{Role: "user", Content: &sdk.TextContent{Text: "hello from " + name}}}}, nil
	})
	s.AddResource(&sdk.Resource{URI: "test://" + name + "/info", Name: name + "-info"}, func(ctx context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
		return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{{URI: req.Params.URI, Text: "info of " + name}}}, nil
	})
	return s
}

// The exposed tools of each upstream of a fedEnv, sorted.
var (
	fedToolsA = prefixed("a__", append(slices.Clone(upstream.ToolNames), "notify", "sample"))
	fedToolsB = prefixed("b__", upstream.ToolNames)
	fedToolsC = prefixed("c__", []string{"count", "crash", "echo", "notify", "sample"})
)

func prefixed(p string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = p + n
	}
	slices.Sort(out)
	return out
}

// fedHTTP is an HTTP upstream of a fedEnv: a demo upstream (its counters
// survive restarts) served on a loopback address that stop and start keep.
type fedHTTP struct {
	*upstream.Server
	t    *testing.T
	mu   sync.Mutex
	srv  *httptest.Server
	addr string
	// traceparents are the Traceparent headers of the POSTs received, in
	// order ("" for none).
	traceparents []string
}

// seenTraceparents returns the Traceparent of every POST received so far.
func (u *fedHTTP) seenTraceparents() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.traceparents)
}

func startFedHTTP(t *testing.T, up *upstream.Server) *fedHTTP {
	u := &fedHTTP{Server: up, t: t}
	u.start()
	t.Cleanup(u.stop)
	return u
}

func (u *fedHTTP) URL() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return "http://" + u.addr + "/mcp"
}

// start serves the upstream, on its previous address after a stop.
func (u *fedHTTP) start() {
	u.mu.Lock()
	defer u.mu.Unlock()
	h := u.Handler()
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			u.mu.Lock()
			u.traceparents = append(u.traceparents, r.Header.Get("Traceparent"))
			u.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
	if u.addr != "" {
		var ln net.Listener
		testenv.Eventually(u.t, 10*time.Second, "the upstream's address "+u.addr+" to be free again", func() bool {
			var err error
			ln, err = net.Listen("tcp", u.addr)
			return err == nil
		})
		ts.Listener.Close()
		ts.Listener = ln
	}
	ts.Start()
	u.srv, u.addr = ts, ts.Listener.Addr().String()
}

// stop kills the server: its listener and every connection.
func (u *fedHTTP) stop() {
	u.mu.Lock()
	ts := u.srv
	u.srv = nil
	u.mu.Unlock()
	if ts != nil {
		ts.CloseClientConnections()
		ts.Close()
	}
}

// fedSetup describes a federation environment.
type fedSetup struct {
	// Config is YAML appended after the upstreams and auth sections (store,
	// tiers, tools, ...); "@@REDIS@@" is replaced by Redis's URL.
	Config string
	// ALimits is upstreams[a].limits as a YAML flow sequence ("" for none).
	ALimits string
	// Redis, when set, is the limit store shared by every instance.
	Redis *testenv.Redis
	// Instances is how many gateways (each with its own federation and
	// stdio process) share the HTTP upstreams; 0 means 1.
	Instances int
	Logger    *slog.Logger
	// TracerProvider is Options.TracerProvider of every instance.
	TracerProvider trace.TracerProvider
}

// fedEnv is a running federation environment: upstreams a (HTTP, with
// resources, sample and notify), b (HTTP, without resources) and c (stdio),
// exposed with their default prefixes a__, b__ and c__.
type fedEnv struct {
	t    *testing.T
	a, b *fedHTTP
	gws  []*Gateway
	base []string
	cfg  *policy.Config
}

func (e *fedEnv) mcpURL(i int) string { return e.base[i%len(e.base)] + "/mcp" }

func newFedEnv(t *testing.T, s fedSetup) *fedEnv {
	t.Helper()
	e := &fedEnv{t: t}
	ua := upstream.New(&upstream.Options{Name: "upstream-a"})
	addRelayTools(ua.MCPServer(), "a")
	// b lists no resources: two demo upstreams list the same URIs (which
	// then go to the first); without them every resource has one owner.
	ub := upstream.New(&upstream.Options{Name: "upstream-b"})
	ub.MCPServer().RemoveResources(upstream.ResourceURIs...)
	ub.MCPServer().RemoveResourceTemplates(upstream.ResourceTemplates...)
	e.a, e.b = startFedHTTP(t, ua), startFedHTTP(t, ub)

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var y strings.Builder
	fmt.Fprintf(&y, "upstreams:\n  - name: a\n    url: %s\n", e.a.URL())
	if s.ALimits != "" {
		fmt.Fprintf(&y, "    limits: %s\n", s.ALimits)
	}
	fmt.Fprintf(&y, "  - name: b\n    url: %s\n", e.b.URL())
	fmt.Fprintf(&y, "  - name: c\n    command: [%q, \"-test.run=^$\"]\n    env: {%s: c}\n", exe, fedStdioEnv)
	fmt.Fprintf(&y, "auth:\n  jwt:\n    hs256_secret_env: MCPGATE_GATEWAY_TEST_SECRET\n    issuer: %s\n    audience: %s\n", testIssuer, testAudience)
	cfgYAML := s.Config
	if s.Redis != nil {
		cfgYAML = strings.ReplaceAll(cfgYAML, redisPlaceholder, s.Redis.URL)
	}
	y.WriteString(cfgYAML)
	cfg, err := policy.Parse("federation_test.yaml", []byte(y.String()))
	if err != nil {
		t.Fatalf("config:\n%s\n%v", y.String(), err)
	}
	e.cfg = cfg
	builder := &env{t: t}
	for range max(s.Instances, 1) {
		g := builder.newGateway(cfg, setup{Logger: cmp.Or(s.Logger, quietLogger()), TracerProvider: s.TracerProvider})
		srv := httptest.NewServer(g)
		t.Cleanup(srv.Close)
		e.gws = append(e.gws, g)
		e.base = append(e.base, srv.URL)
	}
	return e
}

// fedConnect opens an SDK client session to endpoint with tok, over a
// transport of its own (a test that closes servers drops the idle
// connections of http.DefaultTransport) and without retries (a retried
// POST would blur exact counts). protocol "" is the SDK's default.
func fedConnect(t *testing.T, endpoint, tok, protocol string, opts *sdk.ClientOptions) *sdk.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	c := sdk.NewClient(&sdk.Implementation{Name: "federation-test", Version: "1"}, opts)
	cs, err := c.Connect(ctx, transport(endpoint, bearer{token: tok, base: tr}), &sdk.ClientSessionOptions{ProtocolVersion: protocol})
	if err != nil {
		t.Fatalf("connect to %s (protocol %q): %v", endpoint, protocol, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// fedCall calls tool and fails the test on a protocol error; it returns the
// result's text and isError.
func fedCall(t *testing.T, cs *sdk.ClientSession, tool string, args map[string]any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := callTool(ctx, cs, tool, args)
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return testenv.ToolText(res), res.IsError
}

// wantCall calls tool and fails the test unless it answers want.
func wantCall(t *testing.T, cs *sdk.ClientSession, tool string, args map[string]any, want string) {
	t.Helper()
	if got, isErr := fedCall(t, cs, tool, args); got != want || isErr {
		t.Fatalf("%s = %q (isError %v), want %q", tool, got, isErr, want)
	}
}

// toolNames is the sorted tools/list of cs.
func toolNames(t *testing.T, cs *sdk.ClientSession) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	var out []string
	for _, tool := range res.Tools {
		out = append(out, tool.Name)
	}
	slices.Sort(out)
	return out
}

// readyz returns the body of base/readyz (which must answer 200).
func readyz(t *testing.T, base string) string {
	t.Helper()
	r := get(t, base+"/readyz", "")
	if r.Status != http.StatusOK {
		t.Fatalf("/readyz: %d %s", r.Status, r.Body)
	}
	return string(r.Body)
}
