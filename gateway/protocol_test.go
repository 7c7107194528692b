package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/mcp"
)

// SDK clients of each protocol version work through the gateway: initialize
// (or discover), tools/list, tools/call, and close, whose DELETE reaches the
// upstream and ends the session there.
func TestSDKSessionsThroughGateway(t *testing.T) {
	t.Parallel()
	for _, m := range []struct {
		name      string
		opts      upstream.Options
		protocol  string
		want      string
		stateless bool
	}{
		{"2025-06-18-sse", upstream.Options{}, "2025-06-18", "2025-06-18", false},
		{"2025-06-18-json", upstream.Options{JSONResponse: true}, "2025-06-18", "2025-06-18", false},
		{"2025-11-25-sse", upstream.Options{}, "2025-11-25", "2025-11-25", false},
		{"2025-11-25-json", upstream.Options{JSONResponse: true}, "2025-11-25", "2025-11-25", false},
		{"default-negotiation-stateful", upstream.Options{}, "", "2025-11-25", false},
		{"2026-07-28-stateless", upstream.Options{Stateless: true}, "", "2026-07-28", true},
	} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, setup{Upstream: m.opts, Config: `
tools:
  echo:
    limits:
      - {name: echo_cap, per: tenant_tool, algorithm: fixed_window, limit: 2, period: 1h}
`})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cs := connect(t, e.mcpURL(0), sign(t, claims("acme", "alice", "tools:echo tools:search")), m.protocol)
			if got := cs.InitializeResult().ProtocolVersion; got != m.want {
				t.Fatalf("negotiated %s, want %s", got, m.want)
			}
			tools, err := cs.ListTools(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(tools.Tools) != 2 {
				t.Fatalf("tools/list: %d tools, want 2", len(tools.Tools))
			}
			for i := range 2 {
				res, err := callTool(ctx, cs, "echo", map[string]any{"text": "hello"})
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				if tc, ok := res.Content[0].(*sdk.TextContent); !ok || tc.Text != "hello" {
					t.Fatalf("echo = %#v", res.Content)
				}
			}
			if _, err := callTool(ctx, cs, "echo", map[string]any{"text": "hello"}); !isRateLimited(err) {
				t.Fatalf("third call: %v, want 429", err)
			}
			// The session survives a 429.
			if _, err := callTool(ctx, cs, "search", map[string]any{"query": "q"}); err != nil {
				t.Fatalf("after a 429: %v", err)
			}
			// (go-sdk v1.8.0's own Ping fails against its own 2026-07-28
			// server, directly too: it sends no _meta protocolVersion.)
			if !m.stateless {
				if err := cs.Ping(ctx, nil); err != nil {
					t.Fatalf("ping: %v", err)
				}
			}
			sid := cs.ID()
			if err := cs.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			if m.stateless {
				if sid != "" {
					t.Fatalf("stateless session id %q", sid)
				}
				return
			}
			// The upstream's own session id (the gateway may show the client
			// another form of it) was used throughout, and its DELETE arrived.
			upstreamIDs := map[string]bool{}
			deleted := false
			for _, r := range e.requests() {
				if id := r.Header.Get("Mcp-Session-Id"); id != "" {
					upstreamIDs[id] = true
					deleted = deleted || r.Method == http.MethodDelete
				}
			}
			if len(upstreamIDs) != 1 || !deleted {
				t.Fatalf("upstream session ids %v, DELETE seen %v: want one session, ended by DELETE", upstreamIDs, deleted)
			}
			// The session is gone upstream: its 404 passes through.
			r := post(t, e.mcpURL(0), token(t, "acme", "alice"), `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
				http.Header{"Mcp-Session-Id": {sid}, "Mcp-Protocol-Version": {m.want}})
			if r.Status != http.StatusNotFound {
				t.Fatalf("request on the deleted session: %d %s", r.Status, r.Body)
			}
		})
	}
}

// MCP 2026-07-28 headers must agree with the body: 400 with -32020 and the
// request's id otherwise, before the limit stage and the upstream.
func TestHeaderMismatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true}, Config: `
tools:
  echo:
    limits:
      - {name: echo_cap, per: tenant_tool, algorithm: fixed_window, limit: 1, period: 1h}
`})
	tok := token(t, "acme", "alice")
	body := `{"jsonrpc":"2.0","id":"m-1","method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`
	for _, h := range []http.Header{
		{"Mcp-Method": {"tools/list"}},
		{"Mcp-Method": {"tools/call"}, "Mcp-Name": {"search"}},
		// (a repeated Mcp-Method is refused before the body is read, with
		// -32600: see hostile_test.go)
		{"Mcp-Method": {"TOOLS/CALL"}},
	} {
		h.Set("Mcp-Protocol-Version", "2026-07-28")
		r := post(t, e.mcpURL(0), tok, body, h)
		if r.Status != http.StatusBadRequest || r.code() != mcp.CodeHeaderMismatch || r.code() != -32020 || string(r.Msg.ID) != `"m-1"` {
			t.Fatalf("%v: %d %s", h, r.Status, r.Body)
		}
	}
	if len(e.requests()) != 0 {
		t.Fatal("a mismatched request reached the upstream")
	}
	// The mismatches were not charged: the one allowed call still runs.
	r := post(t, e.mcpURL(0), tok, body, http.Header{"Mcp-Method": {"tools/call"}, "Mcp-Name": {"echo"}})
	if r.Status != http.StatusOK || r.Msg.Result == nil {
		t.Fatalf("matching headers: %d %s", r.Status, r.Body)
	}
}

// Malformed requests get a JSON-RPC error with the right status and never
// reach the upstream.
func TestMalformedRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true}, MaxBodyBytes: 4096})
	tok := token(t, "acme", "alice")
	big := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"` + strings.Repeat("x", 5000) + `"}}}`
	for _, c := range []struct {
		name   string
		body   string
		status int
		code   int
		id     string
	}{
		{"truncated JSON", `{"jsonrpc":"2.0","id":1,"method":`, 400, mcp.CodeParseError, "null"},
		{"not JSON", `hello`, 400, mcp.CodeParseError, "null"},
		{"empty body", ``, 400, mcp.CodeParseError, "null"},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}},{"jsonrpc":"2.0","id":2,"method":"ping"}]`, 400, mcp.CodeInvalidRequest, "null"},
		{"empty batch", `[]`, 400, mcp.CodeInvalidRequest, "null"},
		{"a string", `"tools/call"`, 400, mcp.CodeInvalidRequest, "null"},
		{"jsonrpc 1.0", `{"jsonrpc":"1.0","id":3,"method":"ping"}`, 400, mcp.CodeInvalidRequest, ""},
		{"tools/call without name", `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{}}`, 400, mcp.CodeInvalidParams, "4"},
		{"tools/call with a numeric name", `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":5}}`, 400, mcp.CodeInvalidParams, "5"},
		{"oversize", big, http.StatusRequestEntityTooLarge, mcp.CodeInvalidRequest, "null"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := post(t, e.mcpURL(0), tok, c.body, nil)
			if r.Status != c.status || r.code() != c.code || r.Msg.JSONRPC != "2.0" {
				t.Fatalf("%d %s, want %d with code %d", r.Status, r.Body, c.status, c.code)
			}
			if c.id != "" && string(r.Msg.ID) != c.id {
				t.Fatalf("id %s, want %s", r.Msg.ID, c.id)
			}
		})
	}
	// Oversize without Content-Length (chunked) too.
	req, _ := http.NewRequest(http.MethodPost, e.mcpURL(0), bufio.NewReader(strings.NewReader(big)))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	r, err := do(req)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked oversize: %d %s", r.Status, r.Body)
	}
	// Other methods: 405 with Allow.
	req, _ = http.NewRequest(http.MethodPut, e.mcpURL(0), strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer "+tok)
	if r, err = do(req); err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusMethodNotAllowed || r.Header.Get("Allow") == "" || r.code() != mcp.CodeInvalidRequest {
		t.Fatalf("PUT: %d %v %s", r.Status, r.Header, r.Body)
	}
	if len(e.requests()) != 0 {
		t.Fatalf("%d malformed requests reached the upstream", len(e.requests()))
	}
}

// SSE answers are relayed as SSE, event for event identical to the
// upstream's own answer, and each event is delivered as it happens: a
// streaming tool's progress arrives long before its stream ends.
func TestSSEPassThrough(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true}, Config: `
tools:
  slow:
    limits:
      - {name: slow_in_flight, per: tenant_tool, algorithm: concurrency, limit: 4, period: 1m}
`})
	tok := token(t, "acme", "alice")
	progress := func(id int, ms int) string {
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": map[string]any{
			"name": "slow", "arguments": map[string]any{"ms": ms}, "_meta": map[string]any{"progressToken": "tok-1"}}})
		return string(b)
	}
	for _, body := range []string{
		callBody(7, "echo", map[string]any{"text": "same bytes, é ✓"}),
		callBody("s", "search", map[string]any{"query": "q", "limit": 4}),
		progress(8, 40),
	} {
		direct := post(t, e.upURL, "", body, nil)
		through := post(t, e.mcpURL(0), tok, body, nil)
		for _, r := range []*response{direct, through} {
			if r.Status != http.StatusOK || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("%d %v %s", r.Status, r.Header, r.Body)
			}
		}
		if through.Header.Get("X-Accel-Buffering") != "no" {
			t.Errorf("X-Accel-Buffering %q", through.Header.Get("X-Accel-Buffering"))
		}
		de, te := parseEvents(direct.Body), parseEvents(through.Body)
		if len(de) == 0 || !reflect.DeepEqual(de, te) {
			t.Fatalf("events differ:\ndirect:  %q\nthrough: %q", direct.Body, through.Body)
		}
	}

	// Streaming: read the events as they come.
	const ms = 1200
	req, _ := http.NewRequest(http.MethodPost, e.mcpURL(0), strings.NewReader(progress(9, ms)))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// An admitted call's SSE answer carries the rate-limit headers too.
	if resp.Header.Get("X-RateLimit-Limit") != "4" || resp.Header.Get("RateLimit-Policy") != `"slow_in_flight";q=4;w=60` {
		t.Errorf("SSE answer headers: %v", resp.Header)
	}
	var arrivals []time.Duration
	var kinds []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		arrivals = append(arrivals, time.Since(start))
		var msg struct {
			Method string          `json:"method"`
			Result json.RawMessage `json:"result"`
		}
		_ = json.Unmarshal([]byte(data), &msg)
		kinds = append(kinds, msg.Method+map[bool]string{true: "result", false: ""}[msg.Result != nil])
	}
	end := time.Since(start)
	want := []string{"notifications/progress", "notifications/progress", "notifications/progress", "result"}
	if !reflect.DeepEqual(kinds, want) {
		t.Fatalf("events %v, want %v", kinds, want)
	}
	// Progress 1 is sent at ms/4, the result at ms: a buffering proxy would
	// deliver them together.
	if arrivals[0] > end-ms/2*time.Millisecond {
		t.Fatalf("first progress arrived at %v, the stream ended at %v: events were buffered", arrivals[0], end)
	}
	t.Logf("arrivals %v, end %v", arrivals, end)
}
