package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// sharedStoreUpstream is an MCP upstream whose resumable streams live in
// one event store shared by all its sessions, as the TypeScript SDK's
// EventStore interface has it: replayEventsAfter(lastEventId) is given no
// session (a store shared by the server's instances, in Redis, is the
// usual way to make resumption work behind a load balancer). A tools/call
// is answered on an event stream (a priming event, then the result, which
// names the tenant the gateway said the call was for); a GET with
// Last-Event-ID replays the events of that id's stream after it.
type sharedStoreUpstream struct {
	url string

	mu       sync.Mutex
	resumed  []string // the Last-Event-Id of every GET that carried one
	sessions map[string]bool
	events   map[string][]string // stream -> event data, index = event number
	n        int
}

func newSharedStoreUpstream(t *testing.T) *sharedStoreUpstream {
	u := &sharedStoreUpstream{sessions: map[string]bool{}, events: map[string][]string{}}
	// Not httptest.Server: its Close closes the idle connections of
	// http.DefaultTransport, under the feet of the parallel tests using it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(u.serve)}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	u.url = "http://" + ln.Addr().String() + "/mcp"
	return u
}

// resumes returns the Last-Event-Id values the upstream was sent.
func (u *sharedStoreUpstream) resumes() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.resumed...)
}

func (u *sharedStoreUpstream) serve(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	defer u.mu.Unlock()
	sid := r.Header.Get("Mcp-Session-Id")
	switch r.Method {
	case http.MethodGet:
		if !u.sessions[sid] {
			http.Error(w, "bad session", http.StatusBadRequest)
			return
		}
		last := r.Header.Get("Last-Event-Id")
		if last != "" {
			u.resumed = append(u.resumed, last)
		}
		stream, idx, _ := strings.Cut(last, "_")
		after, _ := strconv.Atoi(idx)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for i, data := range u.events[stream] { // no session check: the store has none
			if i > after {
				fmt.Fprintf(w, "id: %s_%d\nevent: message\ndata: %s\n\n", stream, i, data)
			}
		}
		return
	case http.MethodDelete:
		delete(u.sessions, sid)
		w.WriteHeader(http.StatusOK)
		return
	}
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	body, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(body, &msg)
	switch {
	case msg.Method == "initialize":
		u.n++
		sid = fmt.Sprintf("session-%d", u.n)
		u.sessions[sid] = true
		w.Header().Set("Mcp-Session-Id", sid)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"shared-store","version":"1"}}}`, msg.ID)
	case !u.sessions[sid]:
		http.Error(w, "bad session", http.StatusBadRequest)
	case msg.ID == nil:
		w.WriteHeader(http.StatusAccepted)
	case msg.Method == "tools/call":
		u.n++
		stream := fmt.Sprintf("stream%d", u.n)
		result := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"private data of tenant %s"}]}}`, msg.ID, r.Header.Get("X-Mcp-Tenant"))
		u.events[stream] = []string{"", result}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, "id: %s_0\ndata: \n\nid: %s_1\nevent: message\ndata: %s\n\n", stream, stream, result)
	default:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{}}`, msg.ID)
	}
}

// eventIDProtocol is the first MCP version with priming events and
// resumable POST streams.
const eventIDProtocol = "2025-11-25"

// openSession initializes a session of tok through e's first instance and
// returns the headers its next requests carry.
func openSession(t *testing.T, e *env, tok string) http.Header {
	t.Helper()
	hdr := http.Header{"Mcp-Protocol-Version": {eventIDProtocol}}
	r := post(t, e.mcpURL(0), tok, initializeBody, hdr)
	if r.Status != http.StatusOK || r.Header.Get("Mcp-Session-Id") == "" {
		t.Fatalf("initialize: %d %s", r.Status, r.Body)
	}
	hdr.Set("Mcp-Session-Id", r.Header.Get("Mcp-Session-Id"))
	return hdr
}

// resume sends the GET that resumes a stream after lastEventID.
func resume(t *testing.T, e *env, tok string, hdr http.Header, lastEventID string) *response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.mcpURL(0), nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", eventIDProtocol)
	req.Header.Set("Mcp-Session-Id", hdr.Get("Mcp-Session-Id"))
	req.Header.Set("Last-Event-ID", lastEventID)
	r, err := do(req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Sessions are bound to their caller, and so must event ids be: an event id
// is a handle to a stream, and an upstream whose event store is shared by
// its sessions (the TypeScript SDK's EventStore takes no session) replays
// any stream whose id it is given. A client of one tenant that learned an
// event id of another tenant's stream (a log line, a proxy, a shared
// debugging session: the threat the session binding is there for) must not
// resume that stream in its own, valid session: the gateway refuses the id
// (400) and sends nothing upstream. The stream's own caller still resumes.
func TestLastEventIDOfAnotherTenantsStreamIsRefused(t *testing.T) {
	t.Parallel()
	up := newSharedStoreUpstream(t)
	e := newEnv(t, setup{UpstreamURL: up.url})
	acme, globex := token(t, "acme", "alice"), token(t, "globex", "eve")
	acmeHdr, globexHdr := openSession(t, e, acme), openSession(t, e, globex)

	r := post(t, e.mcpURL(0), acme, callBody(7, "lookup", map[string]any{}), acmeHdr)
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), "private data of tenant acme") {
		t.Fatalf("acme's call: %d %s", r.Status, r.Body)
	}
	prime := firstEventID(t, r.Body) // what acme's client (or a log of it) has

	g := resume(t, e, globex, globexHdr, prime) // globex's own session, acme's stream
	if strings.Contains(string(g.Body), "tenant acme") {
		t.Fatalf("tenant globex resumed tenant acme's stream through the gateway (Last-Event-ID %q): %d %s", prime, g.Status, g.Body)
	}
	if g.Status != http.StatusBadRequest || g.code() != -32600 || !strings.Contains(g.Msg.Error.Message, "Last-Event-ID") {
		t.Fatalf("another tenant's event id: %d %s, want 400 with a JSON-RPC error naming Last-Event-ID", g.Status, g.Body)
	}
	if got := up.resumes(); len(got) != 0 {
		t.Fatalf("the refused GET reached the upstream with Last-Event-Id %q", got)
	}

	// The stream's own caller resumes it, the upstream given its own id.
	a := resume(t, e, acme, acmeHdr, prime)
	if a.Status != http.StatusOK || !strings.Contains(string(a.Body), "private data of tenant acme") {
		t.Fatalf("acme resuming its own stream after %q: %d %s", prime, a.Status, a.Body)
	}
	if got := up.resumes(); len(got) != 1 || strings.Contains(got[0], ".") || !strings.HasPrefix(prime, got[0]+".") {
		t.Fatalf("the upstream was sent Last-Event-Id %q for the client's %q, want the id it issued", got, prime)
	}
}

// A real client resumes through the gateway: the Go SDK's upstream, with an
// event store, closes a tool call's stream after its priming event (SEP-1699,
// MCP 2025-11-25), and the Go SDK's client reconnects with GET and the
// Last-Event-ID the gateway gave it. The upstream is given back its own id,
// replays the result, and the call succeeds.
func TestSDKClientResumesAStreamThroughTheGateway(t *testing.T) {
	t.Parallel()
	srv := sdk.NewServer(&sdk.Implementation{Name: "resumable", Version: "1"}, nil)
	sdk.AddTool(srv, &sdk.Tool{Name: "disconnect"}, func(ctx context.Context, req *sdk.CallToolRequest, _ map[string]any) (*sdk.CallToolResult, any, error) {
		req.Extra.CloseSSEStream(sdk.CloseSSEStreamArgs{RetryAfter: time.Millisecond})
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "after the break"}}}, nil, nil
	})
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv },
		&sdk.StreamableHTTPOptions{EventStore: sdk.NewMemoryEventStore(nil)})
	var mu sync.Mutex
	var resumed []string
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	us := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get("Last-Event-Id"); id != "" {
			mu.Lock()
			resumed = append(resumed, id)
			mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})}
	go func() { _ = us.Serve(ln) }()
	t.Cleanup(func() { _ = us.Close() })
	e := newEnv(t, setup{UpstreamURL: "http://" + ln.Addr().String() + "/mcp"})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr := &sdk.StreamableClientTransport{Endpoint: e.mcpURL(0), MaxRetries: 3,
		HTTPClient: &http.Client{Transport: bearer{token: token(t, "acme", "alice")}}}
	cs, err := sdkClient().Connect(ctx, tr, &sdk.ClientSessionOptions{ProtocolVersion: eventIDProtocol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	res, err := callTool(ctx, cs, "disconnect", nil)
	if err != nil {
		t.Fatalf("a call whose stream the upstream closed: %v", err)
	}
	if len(res.Content) != 1 || res.Content[0].(*sdk.TextContent).Text != "after the break" {
		t.Fatalf("result %+v", res.Content)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(resumed) == 0 {
		t.Fatal("the client never resumed: the test proves nothing")
	}
	for _, id := range resumed {
		if i := strings.LastIndexByte(id, '.'); i >= 0 && len(id)-i-1 == sessionMACLen {
			t.Fatalf("the upstream was sent Last-Event-Id %q, the client's wrapped id", id)
		}
	}
}
