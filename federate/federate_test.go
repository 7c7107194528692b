//lint:file-ignore SA1019 sampling, elicitation, roots and logging are deprecated in MCP 2026-07-28 but still served; the federation relays them.
package federate_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// start returns a Federator over ups and a client session to it.
func start(t *testing.T, opts federate.Options, copts *mcp.ClientOptions) (*federate.Federator, *mcp.ClientSession) {
	t.Helper()
	f, url := serve(t, opts)
	return f, connect(t, url, newClient("test-client", copts))
}

// serve returns a Federator over opts (logging nowhere unless
// opts.Logger is set), closed with the test, and the URL of its handler.
func serve(t *testing.T, opts federate.Options) (*federate.Federator, string) {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	f, err := federate.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	ts := httptest.NewServer(f.Handler())
	t.Cleanup(ts.Close)
	return f, ts.URL
}

func newClient(name string, copts *mcp.ClientOptions) *mcp.Client {
	return mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, copts)
}

// connect opens a session of c to url (MCP 2025-11-25), closed with the
// test.
func connect(t *testing.T, url string, c *mcp.Client) *mcp.ClientSession {
	t.Helper()
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func callText(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return testenv.ToolText(res), res.IsError
}

// Two HTTP upstreams (one with bare names) and a stdio one: the lists
// merge under the exposed names and every call, read and get reaches the
// upstream that exposes it, and only that one.
func TestMergedListsAndRouting(t *testing.T) {
	a := startHTTPUpstream(t, "a", nil)
	b := startHTTPUpstream(t, "b", nil)
	f, cs := start(t, federate.Options{Upstreams: []federate.Upstream{
		{Name: "a", URL: a.URL(), Prefix: "a__"},
		{Name: "b", URL: b.URL(), Prefix: ""},
		{Name: "c", Command: stdioCommand(t), Env: map[string]string{stdioEnv: "c"}, Prefix: "c__"},
	}}, nil)
	ctx := context.Background()

	var tools []string
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		tools = append(tools, tool.Name)
	}
	for _, want := range []string{"a__echo", "echo", "c__echo", "a__sample", "sample", "c__crash"} {
		if !slices.Contains(tools, want) {
			t.Errorf("tools/list lacks %q: %v", want, tools)
		}
	}
	if len(tools) != 27 {
		t.Errorf("%d tools, want 3 upstreams × 9: %v", len(tools), tools)
	}
	for tool, want := range map[string]string{"a__echo": "a: hi", "echo": "b: hi", "c__echo": "c: hi"} {
		if got, isErr := callText(t, cs, tool, map[string]any{"text": "hi"}); got != want || isErr {
			t.Errorf("%s = %q (isError %v), want %q", tool, got, isErr, want)
		}
	}
	if a.calls.get("echo") != 1 || b.calls.get("echo") != 1 {
		t.Errorf("echo calls: a %d, b %d; want 1 each", a.calls.get("echo"), b.calls.get("echo"))
	}
	if up, ok := f.UpstreamOf("echo"); !ok || up != "b" {
		t.Errorf("UpstreamOf(echo) = %q, %v", up, ok)
	}

	p, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "c__greet"})
	if err != nil || p.Messages[0].Content.(*mcp.TextContent).Text != "hello from c" {
		t.Errorf("c__greet: %v, %v", p, err)
	}
	for uri, want := range map[string]string{"test://a/info": "info of a", "test://c/items/7": "item of c", "test://b/items/x": "item of b"} {
		r, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err != nil || r.Contents[0].Text != want {
			t.Errorf("read %s: %v, %v; want %q", uri, r, err, want)
		}
	}
}

// Two upstreams exposing the same name cannot start: the error names both.
func TestConflictIsAStartupError(t *testing.T) {
	a := startHTTPUpstream(t, "a", nil)
	b := startHTTPUpstream(t, "b", nil)
	_, err := federate.New(context.Background(), federate.Options{Upstreams: []federate.Upstream{
		{Name: "a", URL: a.URL()}, {Name: "b", URL: b.URL()},
	}})
	if !errors.Is(err, federate.ErrConflict) || !strings.Contains(err.Error(), `upstream "a"`) || !strings.Contains(err.Error(), `upstream "b"`) {
		t.Fatalf("err = %v, want ErrConflict naming a and b", err)
	}
}

// A command that cannot start fails New at once, naming the upstream.
func TestStdioThatWillNotStart(t *testing.T) {
	_, err := federate.New(context.Background(), federate.Options{StartTimeout: 10 * time.Second, Upstreams: []federate.Upstream{
		{Name: "files", Command: []string{"/nonexistent/mcp-server"}},
	}})
	if !errors.Is(err, federate.ErrStart) || !strings.Contains(err.Error(), `upstream "files"`) {
		t.Fatalf("err = %v, want ErrStart naming files", err)
	}
	// A process that exits at once: its stderr is in the error.
	_, err = federate.New(context.Background(), federate.Options{StartTimeout: 10 * time.Second, Upstreams: []federate.Upstream{
		{Name: "bad", Command: []string{"sh", "-c", "echo no config here >&2; exit 2"}},
	}})
	if !errors.Is(err, federate.ErrStart) || !strings.Contains(err.Error(), "no config here") {
		t.Fatalf("err = %v, want ErrStart quoting the stderr", err)
	}
}

// An HTTP upstream dies: its tools fail with a tool error naming it, then
// (breaker open) without reaching it; the other upstream keeps serving; once
// it is back and the cooldown has passed, a probe closes the breaker.
func TestUpstreamBreaker(t *testing.T) {
	a := startHTTPUpstream(t, "a", nil)
	b := startHTTPUpstream(t, "b", nil)
	var states atomic.Value
	f, cs := start(t, federate.Options{Failures: 2, Cooldown: 300 * time.Millisecond, Upstreams: []federate.Upstream{
		{Name: "a", URL: a.URL(), Prefix: "a__"}, {Name: "b", URL: b.URL(), Prefix: "b__"},
	}, OnState: func(up string, s federate.State) { states.Store(up + ":" + string(s)) }}, nil)
	if got, _ := callText(t, cs, "a__echo", map[string]any{"text": "x"}); got != "a: x" {
		t.Fatalf("a__echo = %q", got)
	}
	a.stop()
	for i := range 2 {
		got, isErr := callText(t, cs, "a__echo", map[string]any{"text": "x"})
		if !isErr || !strings.Contains(got, `upstream "a" is unavailable`) {
			t.Fatalf("call %d to a dead upstream = %q (isError %v)", i, got, isErr)
		}
	}
	got, isErr := callText(t, cs, "a__echo", map[string]any{"text": "x"})
	if !isErr || !strings.Contains(got, "circuit is open") || !strings.Contains(got, "retry in") {
		t.Fatalf("call with the breaker open = %q (isError %v)", got, isErr)
	}
	if h := f.Health()[0]; h.State != federate.StateOpen || h.Failures != 2 {
		t.Errorf("health of a = %+v, want open after 2 failures", h)
	}
	if got, _ := callText(t, cs, "b__echo", map[string]any{"text": "y"}); got != "b: y" {
		t.Errorf("b__echo while a is down = %q", got)
	}
	a.start()
	// The cooldown ends: the state moves to half open by itself (no call,
	// no Health), for the gateway's metrics.
	testenv.Eventually(t, waitLong, "a's state to move to half_open", func() bool { s, _ := states.Load().(string); return s == "a:half_open" })
	if got, isErr := callText(t, cs, "a__echo", map[string]any{"text": "back"}); got != "a: back" || isErr {
		t.Fatalf("a__echo after recovery = %q (isError %v)", got, isErr)
	}
	if h := f.Health()[0]; h.State != federate.StateUp {
		t.Errorf("health of a after the probe = %+v", h)
	}
	if s, _ := states.Load().(string); s != "a:up" {
		t.Errorf("last state change = %q, want a:up", s)
	}
}

// An upstream answering 429 with Retry-After is not called again before
// that time, and the caller is told when to retry.
func TestRetryAfter(t *testing.T) {
	var limited atomic.Bool
	var reached atomic.Int64
	a := startHTTPUpstream(t, "a", func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if limited.Load() && r.Method == http.MethodPost {
				reached.Add(1)
				w.Header().Set("Retry-After", "30")
				http.Error(w, "slow down", http.StatusTooManyRequests)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	_, cs := start(t, federate.Options{Upstreams: []federate.Upstream{{Name: "a", URL: a.URL(), Prefix: "a__"}}}, nil)
	if got, _ := callText(t, cs, "a__echo", map[string]any{"text": "x"}); got != "a: x" {
		t.Fatalf("a__echo = %q", got)
	}
	limited.Store(true)
	got, isErr := callText(t, cs, "a__echo", map[string]any{"text": "x"})
	if !isErr || !strings.Contains(got, "429") || !strings.Contains(got, "retry in 30s") {
		t.Fatalf("call answered 429 = %q (isError %v)", got, isErr)
	}
	n := reached.Load()
	got, isErr = callText(t, cs, "a__echo", map[string]any{"text": "x"})
	if !isErr || !strings.Contains(got, "retry in") {
		t.Fatalf("call within Retry-After = %q (isError %v)", got, isErr)
	}
	if reached.Load() != n {
		t.Errorf("a call within Retry-After reached the upstream")
	}
}

// A stdio process that crashes is restarted and calls resume.
func TestStdioRestart(t *testing.T) {
	f, cs := start(t, federate.Options{Upstreams: []federate.Upstream{
		{Name: "c", Command: stdioCommand(t), Env: map[string]string{stdioEnv: "c"}, Prefix: "c__"},
	}}, nil)
	if got, _ := callText(t, cs, "c__echo", map[string]any{"text": "1"}); got != "c: 1" {
		t.Fatalf("c__echo = %q", got)
	}
	// The process dies mid-call: a JSON-RPC error naming the upstream, as
	// the gateway answers for a single upstream that breaks off.
	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "c__crash"}); err == nil || !strings.Contains(err.Error(), `upstream "c" failed`) {
		t.Fatalf("c__crash: err = %v, want one naming upstream c", err)
	}
	testenv.Eventually(t, 20*time.Second, "an answer from the restarted process", func() bool {
		got, isErr := callText(t, cs, "c__echo", map[string]any{"text": "2"})
		return got == "c: 2" && !isErr
	})
	if h := f.Health()[0]; h.Restarts != 1 || h.State != federate.StateUp || h.Transport != "stdio" {
		t.Errorf("health = %+v, want up after 1 restart", h)
	}
}

// What an upstream asks of its client on the client's own session (HTTP)
// reaches the client: sampling (ids mapped by each side), log messages and
// progress (the client's own token). On a shared session (stdio) only
// progress does: see TestSharedSessionRequestsAreRefused and
// TestSharedSessionLogsStayInTheGateway.
func TestServerToClientRelay(t *testing.T) {
	a := startHTTPUpstream(t, "a", nil)
	logs := make(chan string, 10)
	progress := make(chan any, 10)
	_, cs := start(t, federate.Options{Upstreams: []federate.Upstream{
		{Name: "a", URL: a.URL(), Prefix: "a__"},
		{Name: "c", Command: stdioCommand(t), Env: map[string]string{stdioEnv: "c"}, Prefix: "c__"},
	}}, &mcp.ClientOptions{
		CreateMessageHandler: func(ctx context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			return &mcp.CreateMessageResult{Role: "assistant", Model: "m",
				Content: &mcp.TextContent{Text: "re: " + req.Params.Messages[0].Content.(*mcp.TextContent).Text}}, nil
		},
		LoggingMessageHandler: func(ctx context.Context, req *mcp.LoggingMessageRequest) {
			logs <- req.Params.Data.(string)
		},
		ProgressNotificationHandler: func(ctx context.Context, req *mcp.ProgressNotificationClientRequest) {
			progress <- req.Params.ProgressToken
		},
	})
	if got, isErr := callText(t, cs, "a__sample", map[string]any{"text": "q"}); got != "a sampled: re: q" || isErr {
		t.Errorf("a__sample = %q (isError %v)", got, isErr)
	}
	ctx := context.Background()
	if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
		t.Fatal(err)
	}
	for _, up := range []string{"a", "c"} {
		params := &mcp.CallToolParams{Name: up + "__notify", Arguments: map[string]any{"text": "hi"}}
		params.SetProgressToken("tok-" + up)
		if _, err := cs.CallTool(ctx, params); err != nil {
			t.Fatal(err)
		}
		if up == "a" {
			select {
			case got := <-logs:
				if got != up+" says hi" {
					t.Errorf("log = %q", got)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("no log message from %s", up)
			}
		}
		select {
		case got := <-progress:
			if got != "tok-"+up {
				t.Errorf("progress token = %v, want the client's own", got)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no progress from %s", up)
		}
	}
	// A call's log messages are relayed before its answer: had c's been
	// relayed, it would be here.
	select {
	case got := <-logs:
		t.Errorf("a log message of the shared session reached the client: %q", got)
	default:
	}
}

// An upstream asking for the client's roots gets the client's own on the
// client's own upstream session (HTTP); on the shared one (stdio) the
// request is refused.
func TestRootsRelay(t *testing.T) {
	a := startHTTPUpstream(t, "a", nil)
	c := newClient("roots-client", nil)
	c.AddRoots(&mcp.Root{URI: "file:///work", Name: "work"})
	_, url := serve(t, federate.Options{Upstreams: []federate.Upstream{
		{Name: "a", URL: a.URL(), Prefix: "a__"},
		{Name: "c", Command: stdioCommand(t), Env: map[string]string{stdioEnv: "c"}, Prefix: "c__"},
	}})
	cs := connect(t, url, c)
	if got, isErr := callText(t, cs, "a__roots", nil); got != "a roots: file:///work" || isErr {
		t.Errorf("a__roots = %q (isError %v)", got, isErr)
	}
	if got, isErr := callText(t, cs, "c__roots", nil); !isErr || strings.Contains(got, "file:///work") {
		t.Errorf("c__roots = %q (isError %v), want a refusal", got, isErr)
	}
}

// The idle timeout cuts a silent call with a JSON-RPC error naming the
// upstream; progress starts it again, so a call that reports progress
// outlives it.
func TestIdleTimeout(t *testing.T) {
	a := startHTTPUpstream(t, "a", nil)
	_, cs := start(t, federate.Options{Upstreams: []federate.Upstream{{Name: "a", URL: a.URL(), Prefix: "a__", Timeout: 5 * time.Second}},
		ToolTimeouts: map[string]time.Duration{"a__slow": time.Second}}, nil)
	_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "a__slow", Arguments: map[string]any{"ms": 4000}})
	if err == nil || !strings.Contains(err.Error(), `upstream "a" timed out: it sent nothing for 1s`) {
		t.Fatalf("silent slow call: err = %v", err)
	}
	// Progress every 50ms, for 2.5 times the idle timeout.
	params := &mcp.CallToolParams{Name: "a__slow", Arguments: map[string]any{"ms": 2500}}
	params.SetProgressToken("p")
	res, err := cs.CallTool(context.Background(), params)
	if err != nil || res.IsError {
		t.Fatalf("slow call with progress: %v, %+v", err, res)
	}
}

// A client's cancellation reaches the upstream serving the call, and only
// that call: the upstream's handler sees its context end.
func TestCancellationReachesTheUpstream(t *testing.T) {
	a := startHTTPUpstream(t, "a", nil)
	_, cs := start(t, federate.Options{Upstreams: []federate.Upstream{
		{Name: "a", URL: a.URL(), Prefix: "a__"},
		{Name: "c", Command: stdioCommand(t), Env: map[string]string{stdioEnv: "c"}, Prefix: "c__"},
	}}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "a__slow", Arguments: map[string]any{"ms": 30000}})
		done <- err
	}()
	testenv.Eventually(t, waitLong, "the slow call to reach a", func() bool { return a.calls.get("slow") == 1 })
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a cancelled call returned a result")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled call did not return")
	}
	testenv.Eventually(t, waitLong, "a to see the cancellation", func() bool { return a.calls.get("slow-cancelled") == 1 })
	// The session is still good.
	if got, _ := callText(t, cs, "a__echo", map[string]any{"text": "after"}); got != "a: after" {
		t.Errorf("a__echo after a cancellation = %q", got)
	}
}

// An upstream's list changes at run time: the federation lists it again
// and its clients are told (notifications/tools/list_changed), under the
// exposed name.
func TestListChangedReachesTheClient(t *testing.T) {
	a := startHTTPUpstream(t, "a", nil)
	changed := make(chan struct{}, 10)
	_, cs := start(t, federate.Options{Upstreams: []federate.Upstream{{Name: "a", URL: a.URL(), Prefix: "a__"}}},
		&mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} }})
	if got, _ := callText(t, cs, "a__echo", map[string]any{"text": "x"}); got != "a: x" { // opens a's session for this client
		t.Fatalf("a__echo = %q", got)
	}
	a.mu.Lock()
	srv := a.mcp
	a.mu.Unlock()
	mcp.AddTool(srv, &mcp.Tool{Name: "added"}, func(ctx context.Context, req *mcp.CallToolRequest, _ textArgs) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "new"}}}, nil, nil
	})
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no tools/list_changed reached the client")
	}
	testenv.Eventually(t, waitLong, "a__added to be listed", func() bool {
		for tool, err := range cs.Tools(context.Background(), nil) {
			if err == nil && tool.Name == "a__added" {
				return true
			}
		}
		return false
	})
	if got, isErr := callText(t, cs, "a__added", nil); got != "new" || isErr {
		t.Errorf("a__added = %q (isError %v)", got, isErr)
	}
}

// waitLong bounds the waits on the upstreams and the Federator's
// goroutines (testenv.Eventually).
const waitLong = 15 * time.Second

// The progress an upstream sends right before its answer reaches the
// client before the answer, through HTTP and stdio upstreams alike: the
// SDK client queues notifications but not responses, and the federation
// waits for its relays. Read on the wire: an SDK client would itself
// queue what it got.
func TestProgressBeforeTheAnswer(t *testing.T) {
	a := startHTTPUpstream(t, "a", nil)
	_, url := serve(t, federate.Options{Upstreams: []federate.Upstream{
		{Name: "a", URL: a.URL(), Prefix: "a__"},
		{Name: "c", Command: stdioCommand(t), Env: map[string]string{stdioEnv: "c"}, Prefix: "c__"},
	}})
	rc := &rawClient{t: t, url: url}
	initialize(rc)
	for i := range 20 {
		for _, up := range []string{"a", "c"} {
			events := rc.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"%s__burst","_meta":{"progressToken":"t%d"}}}`, i+1, up, i))
			if kinds := eventKinds(events); kinds != "progress,progress,progress,result" {
				t.Fatalf("%s__burst #%d: events in order %s, want 3 progress then the result", up, i, kinds)
			}
		}
	}
}

// rawClient speaks Streamable HTTP by hand, to see the order of events.
type rawClient struct {
	t       *testing.T
	url     string
	session string
}

// post sends one message and returns the data of each event of the answer
// (or the JSON body).
func (c *rawClient) post(body string) []string {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	if c.session != "" {
		req.Header.Set("Mcp-Session-Id", c.session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	if id := resp.Header.Get("Mcp-Session-Id"); id != "" {
		c.session = id
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		c.t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return []string{string(b)}
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if d, ok := strings.CutPrefix(line, "data:"); ok {
			out = append(out, strings.TrimSpace(d))
		}
	}
	return out
}

// A call without arguments reaches the upstream with {} (not null, which
// schema-checking servers refuse).
func TestCallWithoutArguments(t *testing.T) {
	var bodies sync.Map
	a := startHTTPUpstream(t, "a", func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			if bytes.Contains(b, []byte(`"tools/call"`)) {
				bodies.Store(string(b), true)
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
			h.ServeHTTP(w, r)
		})
	})
	_, url := serve(t, federate.Options{Upstreams: []federate.Upstream{{Name: "a", URL: a.URL(), Prefix: "a__"}}})
	// A raw request: the SDK client would add {} itself.
	resp, out := postRaw(t, url, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a__echo"}}`)
	if !strings.Contains(string(out), "a: ") {
		t.Fatalf("answer: %d %s", resp.StatusCode, out)
	}
	n := 0
	bodies.Range(func(k, _ any) bool {
		n++
		if strings.Contains(k.(string), `"arguments":null`) || !strings.Contains(k.(string), `"arguments":{}`) {
			t.Errorf("the upstream got %s", k)
		}
		return true
	})
	if n != 1 {
		t.Errorf("%d tools/call bodies reached the upstream, want 1", n)
	}
}

// An upstream refusing one request (HTTP 4xx) answered: the client gets a
// JSON-RPC error naming it, the breaker stays closed however many such
// answers come, and the session goes on. An upstream that lost the session
// (404) gets a new one and the request again, unseen by the client.
func TestRefusedRequestsAndLostSessions(t *testing.T) {
	var refuse, lose atomic.Int64
	a := startHTTPUpstream(t, "a", func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(b))
			if r.Method == http.MethodPost && bytes.Contains(b, []byte(`"tools/call"`)) {
				if refuse.Load() > 0 {
					refuse.Add(-1)
					http.Error(w, "no", http.StatusBadRequest)
					return
				}
				if lose.Load() > 0 {
					lose.Add(-1)
					http.Error(w, "session not found", http.StatusNotFound)
					return
				}
			}
			h.ServeHTTP(w, r)
		})
	})
	var mu sync.Mutex
	outcomes := map[federate.Outcome]int{}
	f, cs := start(t, federate.Options{Failures: 2, Upstreams: []federate.Upstream{{Name: "a", URL: a.URL(), Prefix: "a__"}},
		OnCall: func(up string, o federate.Outcome) {
			mu.Lock()
			outcomes[o]++
			mu.Unlock()
		}}, nil)
	if got, _ := callText(t, cs, "a__echo", map[string]any{"text": "1"}); got != "a: 1" {
		t.Fatalf("a__echo = %q", got)
	}
	refuse.Store(5)
	for range 5 {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "a__echo", Arguments: map[string]any{"text": "x"}})
		if err == nil || !strings.Contains(err.Error(), `upstream "a" refused the request: HTTP 400`) {
			t.Fatalf("refused call: err = %v", err)
		}
	}
	if h := f.Health()[0]; h.State != federate.StateUp || h.Failures != 0 {
		t.Fatalf("after 5 refused requests: %+v, want up", h)
	}
	lose.Store(1)
	if got, isErr := callText(t, cs, "a__echo", map[string]any{"text": "2"}); got != "a: 2" || isErr {
		t.Fatalf("a__echo after a lost session = %q (isError %v)", got, isErr)
	}
	if n := a.calls.get("echo"); n != 2 {
		t.Errorf("a served %d echo calls, want 2", n)
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[federate.Outcome]int{federate.OutcomeOK: 2, federate.OutcomeError: 5, federate.OutcomeRetried: 1}
	if !maps.Equal(outcomes, want) {
		t.Errorf("outcomes %v, want %v", outcomes, want)
	}
}

// A stdio server gets the variables of Upstream.Env and what programs need
// (PATH, HOME, ...), never the rest of mcpgate's environment (its secrets).
func TestStdioEnvironment(t *testing.T) {
	t.Setenv("MCPGATE_TEST_SECRET", "s3cret")
	_, cs := start(t, federate.Options{Upstreams: []federate.Upstream{
		{Name: "c", Command: stdioCommand(t), Env: map[string]string{stdioEnv: "c", "GIVEN": "yes"}, Prefix: "c__"},
	}}, nil)
	for name, want := range map[string]string{"MCPGATE_TEST_SECRET": "", "GIVEN": "yes", "PATH": os.Getenv("PATH")} {
		if got, _ := callText(t, cs, "c__env", map[string]any{"text": name}); got != want {
			t.Errorf("$%s in the stdio server = %q, want %q", name, got, want)
		}
	}
}

// An upstream whose initialize result has no capabilities is served (it
// exposes nothing), and a client's logging/setLevel does not trip on it.
func TestUpstreamWithoutCapabilities(t *testing.T) {
	a := startHTTPUpstream(t, "a", nil)
	_, cs := start(t, federate.Options{Upstreams: []federate.Upstream{
		{Name: "a", URL: a.URL(), Prefix: "a__"},
		{Name: "raw", Command: stdioCommand(t), Env: map[string]string{rawEnv: "1"}},
	}}, nil)
	if err := cs.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := callText(t, cs, "a__echo", map[string]any{"text": "x"}); got != "a: x" {
		t.Fatalf("a__echo = %q", got)
	}
}

// An HTTP upstream restarts (every client's session on it is lost): each
// client's next call opens a new session and goes through; none counts as
// a failure, so the breaker stays closed for everyone.
func TestUpstreamRestartKeepsTheBreakerClosed(t *testing.T) {
	a := startHTTPUpstream(t, "a", nil)
	f, url := serve(t, federate.Options{Failures: 2, Upstreams: []federate.Upstream{{Name: "a", URL: a.URL(), Prefix: "a__"}}})
	var clients []*mcp.ClientSession
	for range 3 {
		cs := connect(t, url, newClient("c", nil))
		clients = append(clients, cs)
		if got, _ := callText(t, cs, "a__echo", map[string]any{"text": "1"}); got != "a: 1" {
			t.Fatalf("a__echo = %q", got)
		}
	}
	a.stop()
	a.start()
	for i, cs := range clients {
		got, isErr := callText(t, cs, "a__echo", map[string]any{"text": "2"})
		if isErr && strings.Contains(got, "cannot be reached") && strings.HasSuffix(got, "EOF") {
			// Go's HTTP client sent the call on a kept-alive connection the
			// stopped server had closed, before it read that close: a POST
			// is not sent again (it may have been served), so the call is
			// refused as unreachable, once. Not the session handling under
			// test; the next call opens a new connection.
			t.Logf("client %d: a stale connection: %q", i, got)
			got, isErr = callText(t, cs, "a__echo", map[string]any{"text": "2"})
		}
		if got != "a: 2" || isErr {
			t.Errorf("client %d after the restart: %q (isError %v)", i, got, isErr)
		}
	}
	if h := f.Health()[0]; h.State != federate.StateUp || h.Failures != 0 {
		t.Errorf("health after the restart: %+v, want up with no failure", h)
	}
}

// postRaw POSTs body to url as a client without a session (MCP
// 2025-06-18) and returns the answer, its body read.
func postRaw(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, out
}
