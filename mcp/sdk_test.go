package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/examples/upstream"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// End-to-end: an SDK client talks to examples/upstream (a real SDK server)
// through a gateway handler that reads, parses, checks and forwards with
// Proxy.

// seenRequest is what the upstream received.
type seenRequest struct {
	method string
	header http.Header
}

type e2e struct {
	up      *upstream.Server
	gw      *gateway
	gwURL   string
	mu      sync.Mutex
	seen    []seenRequest
	session *sdk.ClientSession
}

// clientTransport adds what a real agent sends and the upstream must never
// see: its own bearer token, a cookie, a forged identity header.
type clientTransport struct{}

func (clientTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer client-token")
	r.Header.Set("Cookie", "sid=client")
	r.Header.Set("X-Mcp-Tenant", "forged")
	return http.DefaultTransport.RoundTrip(r)
}

func newE2E(t *testing.T, opts upstream.Options, protocol string, tweak ...func(*ProxyOptions)) *e2e {
	t.Helper()
	e := &e2e{}
	opts.OnRequest = func(r *http.Request) {
		e.mu.Lock()
		e.seen = append(e.seen, seenRequest{r.Method, r.Header.Clone()})
		e.mu.Unlock()
	}
	e.up = upstream.New(&opts)
	us := httptest.NewServer(e.up.Handler())
	t.Cleanup(us.Close)
	popts := ProxyOptions{
		Upstream: us.URL + "/mcp",
		Headers:  http.Header{"Authorization": {"Bearer upstream-credential"}},
	}
	for _, f := range tweak {
		f(&popts)
	}
	g, gs := newGateway(t, popts)
	g.allow = func(name string) bool { return name != "update_product" && name != "fail" }
	g.header = http.Header{"X-Mcp-Tenant": {"acme"}, "X-Mcp-Subject": {"alice"}}
	e.gw, e.gwURL = g, gs.URL

	client := sdk.NewClient(&sdk.Implementation{Name: "e2e", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &sdk.StreamableClientTransport{
		Endpoint:   gs.URL,
		HTTPClient: &http.Client{Transport: clientTransport{}},
		MaxRetries: -1,
	}, &sdk.ClientSessionOptions{ProtocolVersion: protocol})
	if err != nil {
		t.Fatalf("connect through the proxy: %v", err)
	}
	e.session = cs
	t.Cleanup(func() { _ = cs.Close() })
	return e
}

func (e *e2e) requests() []seenRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.seen)
}

// served returns the records of the Serve calls that have returned.
func (e *e2e) served() []*served {
	e.gw.mu.Lock()
	defer e.gw.mu.Unlock()
	return slices.Clone(e.gw.logs)
}

func TestSDKThroughProxy(t *testing.T) {
	modes := []struct {
		name      string
		opts      upstream.Options
		protocol  string
		wantProto string
		sessions  bool
		// handshake requests: the SDK's default client first tries
		// server/discover (2026-07-28); a stateful server answers it with
		// only legacy versions, and the client falls back to initialize.
		handshakes int
	}{
		{"sse-sessions", upstream.Options{}, "", "2025-11-25", true, 2},
		{"json-sessions", upstream.Options{JSONResponse: true}, "", "2025-11-25", true, 2},
		{"sse-stateless", upstream.Options{Stateless: true}, "", "2026-07-28", false, 1},
		{"json-stateless", upstream.Options{Stateless: true, JSONResponse: true}, "", "2026-07-28", false, 1},
		{"sse-sessions-2025-06-18", upstream.Options{}, "2025-06-18", "2025-06-18", true, 1},
		{"json-stateless-2025-11-25", upstream.Options{Stateless: true, JSONResponse: true}, "2025-11-25", "2025-11-25", false, 1},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			e := newE2E(t, m.opts, m.protocol)
			cs := e.session
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			if got := cs.InitializeResult().ProtocolVersion; got != m.wantProto {
				t.Errorf("negotiated %s, want %s", got, m.wantProto)
			}

			// tools/list is filtered by AllowTool.
			tools, err := cs.ListTools(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, tool := range tools.Tools {
				names = append(names, tool.Name)
				if tool.InputSchema == nil {
					t.Errorf("tool %s lost its input schema in filtering", tool.Name)
				}
			}
			slices.Sort(names)
			if want := []string{"echo", "llm_complete", "search", "slow"}; !slices.Equal(names, want) {
				t.Fatalf("tools %v, want %v", names, want)
			}

			res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "through the gateway"}})
			if err != nil {
				t.Fatal(err)
			}
			if tc, ok := res.Content[0].(*sdk.TextContent); !ok || tc.Text != "through the gateway" {
				t.Fatalf("echo = %v", res.Content)
			}
			res, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "llm_complete", Arguments: map[string]any{"prompt": "p", "tokens": 42}})
			if err != nil {
				t.Fatal(err)
			}
			if usage, _ := res.Meta["usage"].(map[string]any); usage["tokens"] != float64(42) {
				t.Fatalf("llm_complete meta %v", res.Meta)
			}
			// The proxy does not enforce scopes (the gateway does): a hidden
			// tool still answers, and its isError reaches Answer.
			res, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "fail"})
			if err != nil || !res.IsError {
				t.Fatalf("fail: %v %v", res, err)
			}

			if e.up.Calls("echo") != 1 || e.up.Calls("llm_complete") != 1 || e.up.Calls("fail") != 1 || e.up.TotalCalls() != 3 {
				t.Fatalf("upstream calls: echo %d llm %d fail %d total %d", e.up.Calls("echo"), e.up.Calls("llm_complete"), e.up.Calls("fail"), e.up.TotalCalls())
			}
			if e.up.Requests("tools/list") != 1 {
				t.Fatalf("upstream tools/list %d", e.up.Requests("tools/list"))
			}

			// Answer saw each call's response exactly once: the handshake
			// (server/discover and/or initialize), tools/list and three calls.
			// The client may see a response before Serve has returned, so
			// wait for the records.
			var results []string
			for deadline := time.Now().Add(5 * time.Second); ; {
				results = results[:0]
				for _, s := range e.served() {
					if s.reported > 1 {
						t.Fatalf("Answer reported %d times", s.reported)
					}
					if s.reported == 1 {
						results = append(results, string(s.result)+string(s.rpcErr))
					}
				}
				if len(results) >= m.handshakes+4 || time.Now().After(deadline) {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			if len(results) != m.handshakes+4 {
				t.Fatalf("%d Answer reports, want %d:\n%s", len(results), m.handshakes+4, strings.Join(results, "\n"))
			}
			if e.up.Requests("server/discover")+e.up.Requests("initialize") != int64(m.handshakes) {
				t.Fatalf("upstream handshakes: discover %d initialize %d", e.up.Requests("server/discover"), e.up.Requests("initialize"))
			}
			joined := strings.Join(results, "\n")
			for _, want := range []string{`"text":"through the gateway"`, `"usage":{"tokens":42}`, `"isError":true`, `"name":"echo"`} {
				if !strings.Contains(joined, want) {
					t.Errorf("Answer results lack %s:\n%s", want, joined)
				}
			}
			if strings.Contains(joined, `"name":"update_product"`) {
				t.Errorf("Answer saw an unfiltered tools/list")
			}

			// What reached the upstream.
			var sessionIDs []string
			for _, r := range e.requests() {
				if v := r.header.Values("Authorization"); len(v) != 1 || v[0] != "Bearer upstream-credential" {
					t.Fatalf("%s reached the upstream with Authorization %q", r.method, v)
				}
				if r.header.Get("Cookie") != "" {
					t.Fatalf("cookie forwarded")
				}
				if v := r.header.Values("X-Mcp-Tenant"); len(v) != 1 || v[0] != "acme" {
					t.Fatalf("X-Mcp-Tenant %q", v)
				}
				if id := r.header.Get("Mcp-Session-Id"); id != "" {
					sessionIDs = append(sessionIDs, id)
				}
				if m.wantProto == "2026-07-28" && r.method == http.MethodPost && r.header.Get("Mcp-Method") == "" {
					t.Fatalf("2026-07-28 POST without Mcp-Method")
				}
			}
			if m.sessions {
				if len(sessionIDs) == 0 || slices.ContainsFunc(sessionIDs, func(s string) bool { return s != sessionIDs[0] }) {
					t.Fatalf("session ids seen upstream: %v", sessionIDs)
				}
			} else if len(sessionIDs) != 0 {
				t.Fatalf("stateless upstream got session ids %v", sessionIDs)
			}
			if m.wantProto == "2026-07-28" {
				found := false
				for _, r := range e.requests() {
					found = found || (r.header.Get("Mcp-Method") == "tools/call" && r.header.Get("Mcp-Name") == "llm_complete")
				}
				if !found {
					t.Fatal("Mcp-Method/Mcp-Name not forwarded")
				}
			}

			if !m.sessions {
				return
			}
			// DELETE ends the session upstream; the id is then unknown there.
			sid := sessionIDs[0]
			if err := cs.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			deleted := false
			for _, r := range e.requests() {
				deleted = deleted || (r.method == http.MethodDelete && r.header.Get("Mcp-Session-Id") == sid)
			}
			if !deleted {
				t.Fatal("DELETE did not reach the upstream")
			}
			resp := post(t, e.gwURL, `{"jsonrpc":"2.0","id":99,"method":"tools/list"}`, http.Header{
				"Mcp-Session-Id": {sid}, "Mcp-Protocol-Version": {m.wantProto},
			})
			if resp.StatusCode != http.StatusNotFound {
				t.Fatalf("request on a deleted session: %d", resp.StatusCode)
			}
		})
	}
}

// Server notifications sent outside any request pass through the proxy: over
// the standalone GET stream (sessions), or over the subscriptions/listen
// POST stream (2026-07-28), which the proxy's Timeout must not cut.
func TestSDKServerStreamThroughProxy(t *testing.T) {
	for _, m := range []struct {
		name   string
		opts   upstream.Options
		method string // the request that carries the stream
	}{
		{"get-stream", upstream.Options{}, http.MethodGet},
		{"subscriptions-listen", upstream.Options{Stateless: true}, "subscriptions/listen"},
	} {
		t.Run(m.name, func(t *testing.T) {
			const timeout = 300 * time.Millisecond
			e := newE2E(t, m.opts, "", func(o *ProxyOptions) { o.Timeout = timeout })
			listChanged := make(chan struct{}, 1)
			// A second client with a list-changed handler (newE2E's has none).
			client := sdk.NewClient(&sdk.Implementation{Name: "e2e-2", Version: "1"}, &sdk.ClientOptions{
				ToolListChangedHandler: func(context.Context, *sdk.ToolListChangedRequest) {
					select {
					case listChanged <- struct{}{}:
					default:
					}
				},
			})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cs, err := client.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: e.gwURL, MaxRetries: -1}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			streams := func() int {
				n := 0
				for _, r := range e.requests() {
					if (r.method == m.method && r.header.Get("Mcp-Session-Id") == cs.ID()) ||
						(r.method == http.MethodPost && r.header.Get("Mcp-Method") == m.method) {
						n++
					}
				}
				return n
			}
			// Outlive the proxy timeout before the first notification.
			time.Sleep(2 * timeout)
			// With no request in flight, a notification can only travel over
			// the stream, which registers asynchronously upstream: keep
			// changing the tool list until one gets through.
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-listChanged:
					if n := streams(); n != 1 {
						t.Fatalf("%d notification streams reached the upstream, want 1", n)
					}
					return
				case <-tick.C:
					sdk.AddTool(e.up.MCPServer(), &sdk.Tool{Name: fmt.Sprintf("new_tool_%d", i)},
						func(context.Context, *sdk.CallToolRequest, struct{}) (*sdk.CallToolResult, any, error) {
							return &sdk.CallToolResult{}, nil, nil
						})
				case <-ctx.Done():
					t.Fatalf("tools/list_changed did not arrive over the proxied stream (%d streams)", streams())
				}
			}
		})
	}
}

// A header that lies about the body is refused before the upstream.
func TestSDKHeaderMismatchRefused(t *testing.T) {
	e := newE2E(t, upstream.Options{Stateless: true}, "")
	before := e.up.TotalCalls()
	resp := post(t, e.gwURL, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"update_product","arguments":{"id":"p"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`, http.Header{
		"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {"tools/call"}, "Mcp-Name": {"echo"},
	})
	var body struct {
		ID    json.RawMessage    `json:"id"`
		Error struct{ Code int } `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != 400 || body.Error.Code != CodeHeaderMismatch || string(body.ID) != "5" {
		t.Fatalf("status %d body %+v", resp.StatusCode, body)
	}
	if e.up.TotalCalls() != before {
		t.Fatal("mismatched call reached the upstream")
	}
}
