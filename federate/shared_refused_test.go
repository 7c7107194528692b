package federate_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
)

// postSessionless posts one request as a client without a session does
// (MCP before 2026-07-28: served on the upstream's shared session) and
// returns the answer's body.
func postSessionless(t *testing.T, url, body string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "transport error: " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// A plain HTTP 4xx answer to one request (here a 413 of a proxy in front
// of the upstream, for one tenant's oversize request) is that request's
// answer. On the shared session, which every client without a session
// uses, the go-sdk client would end the whole connection on it: the other
// clients' calls in flight there failed with this one's refusal, and
// counted as failures of the upstream. The call in flight goes on, the
// refused one names the status, and the breaker counts nothing.
func TestRefusedRequestLeavesTheSharedSessionToTheOthers(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	var startedOnce atomic.Bool
	srv := mcp.NewServer(&mcp.Implementation{Name: "a", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "wait"}, func(ctx context.Context, _ *mcp.CallToolRequest, _ textArgs) (*mcp.CallToolResult, any, error) {
		if startedOnce.CompareAndSwap(false, true) {
			close(started)
		}
		select {
		case <-release:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "released"}}}, nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.Text}}}, nil, nil
	})
	sdkHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			if bytes.Contains(body, []byte("oversize")) {
				http.Error(w, "request entity too large", http.StatusRequestEntityTooLarge)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		sdkHandler.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
		for ss := range srv.Sessions() {
			_ = ss.Close()
		}
	})
	released := sync.OnceFunc(func() { close(release) })
	t.Cleanup(released)
	f, url := serve(t, federate.Options{Upstreams: []federate.Upstream{{Name: "a", URL: ts.URL, Prefix: "a__"}}})

	waited := make(chan string, 1)
	go func() {
		waited <- postSessionless(t, url, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a__wait"}}`)
	}()
	<-started // the call is in flight on the shared session
	refused := postSessionless(t, url, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"a__echo","arguments":{"text":"oversize"}}}`)
	if !strings.Contains(refused, `upstream \"a\" refused the request: HTTP 413`) {
		t.Errorf("the refused call: %s", strings.TrimSpace(refused))
	}
	released()
	if got := <-waited; !strings.Contains(got, "released") {
		t.Errorf("another client's call in flight on the shared session: %s", strings.TrimSpace(got))
	}
	if h := f.Health()[0]; h.Failures != 0 || h.State != federate.StateUp {
		t.Errorf("health = %+v: one client's refused request counted as an upstream failure", h)
	}
	// The session goes on serving.
	if got := postSessionless(t, url, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"a__echo","arguments":{"text":"after"}}}`); !strings.Contains(got, "after") {
		t.Errorf("a call after the refused one: %s", strings.TrimSpace(got))
	}
}

// restartingUpstream is an upstream that keeps its sessions in memory, as
// the TypeScript and Python SDKs' streamable HTTP servers do: restart
// forgets them all, and a request of a session it does not know gets
// lost's answer (where the go-sdk server answers 404).
func restartingUpstream(t *testing.T, lost func(w http.ResponseWriter)) (url string, restart func()) {
	t.Helper()
	var mu sync.Mutex
	known := map[string]bool{}
	var srvs []*mcp.Server
	newHandler := func() http.Handler {
		srv := mcp.NewServer(&mcp.Implementation{Name: "a", Version: "1"}, nil)
		mu.Lock()
		srvs = append(srvs, srv)
		mu.Unlock()
		mcp.AddTool(srv, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.Text}}}, nil, nil
		})
		return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	}
	var h atomic.Value
	h.Store(newHandler())
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if sid := r.Header.Get("Mcp-Session-Id"); sid != "" {
			mu.Lock()
			ok := known[sid]
			mu.Unlock()
			if !ok {
				lost(w)
				return
			}
		}
		h.Load().(http.Handler).ServeHTTP(&sessionRecorder{ResponseWriter: w, seen: func(sid string) {
			mu.Lock()
			known[sid] = true
			mu.Unlock()
		}}, r)
	}))
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, srv := range srvs {
			for ss := range srv.Sessions() {
				_ = ss.Close()
			}
		}
	})
	return ts.URL, func() {
		mu.Lock()
		clear(known)
		mu.Unlock()
		h.Store(newHandler())
	}
}

// sessionRecorder tells seen the session id an upstream's answer gives
// as its header is written: the client may send the session's next
// request as soon as it reads the answer, before the handler returns.
type sessionRecorder struct {
	http.ResponseWriter
	seen  func(sid string)
	noted bool
}

func (r *sessionRecorder) note() {
	if !r.noted {
		r.noted = true
		if sid := r.Header().Get("Mcp-Session-Id"); sid != "" {
			r.seen(sid)
		}
	}
}

func (r *sessionRecorder) WriteHeader(code int) {
	r.note()
	r.ResponseWriter.WriteHeader(code)
}

func (r *sessionRecorder) Write(b []byte) (int, error) {
	r.note()
	return r.ResponseWriter.Write(b)
}

func (r *sessionRecorder) Flush() {
	r.note()
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// echoSessionless calls a__echo as a client without a session does (on the
// shared session) and reports whether text came back, with the answer.
func echoSessionless(t *testing.T, url string, id int, text string) (bool, string) {
	t.Helper()
	got := postSessionless(t, url, `{"jsonrpc":"2.0","id":`+strconv.Itoa(id)+`,"method":"tools/call","params":{"name":"a__echo","arguments":{"text":"`+text+`"}}}`)
	return strings.Contains(got, text), strings.TrimSpace(got)
}

// The TypeScript SDK's server, restarted, answers a request of a session
// it lost 400 with a JSON-RPC error whose id is null ("Bad Request: No
// valid session ID provided", or "Server not initialized"). That body is
// the SDK's to judge: the go-sdk client ends the session on it, and the
// next call opens a new one. Turned into that one call's JSON-RPC error
// (as a plain 4xx is, see TestRefusedRequestLeavesTheSharedSessionToTheOthers),
// the dead session was kept for ever and every later call on it failed.
func TestSessionLostWithJSONRPC400GetsANewSession(t *testing.T) {
	url, restart := restartingUpstream(t, func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"},"id":null}`))
	})
	_, gw := serve(t, federate.Options{Upstreams: []federate.Upstream{{Name: "a", URL: url, Prefix: "a__"}}})
	if ok, got := echoSessionless(t, gw, 1, "before"); !ok {
		t.Fatalf("before the restart: %s", got)
	}
	restart()
	_, _ = echoSessionless(t, gw, 2, "first-after") // may fail: it met the lost session
	for i := 3; i < 6; i++ {
		if ok, got := echoSessionless(t, gw, i, "after"); !ok {
			t.Fatalf("call %d after the upstream restarted: %s", i, got)
		}
	}
}

// The Python SDK's server, restarted, answered a request of a session it
// lost with a plain-text 400 ("Bad Request: No valid session ID
// provided"): as plain as a proxy's refusal of one request, so it reaches
// the go-sdk client as that call's error and leaves the session to the
// others. But the session is gone: a ping in it is refused too, and then
// the 400 reaches the SDK, which ends the session, and the next call opens
// a new one instead of failing on the dead session for ever.
func TestSessionLostWithPlain400GetsANewSession(t *testing.T) {
	url, restart := restartingUpstream(t, func(w http.ResponseWriter) {
		http.Error(w, "Bad Request: No valid session ID provided", http.StatusBadRequest)
	})
	f, gw := serve(t, federate.Options{Upstreams: []federate.Upstream{{Name: "a", URL: url, Prefix: "a__"}}})
	if ok, got := echoSessionless(t, gw, 1, "before"); !ok {
		t.Fatalf("before the restart: %s", got)
	}
	restart()
	_, _ = echoSessionless(t, gw, 2, "first-after") // may fail: it met the lost session
	for i := 3; i < 6; i++ {
		if ok, got := echoSessionless(t, gw, i, "after"); !ok {
			t.Fatalf("call %d after the upstream restarted: %s", i, got)
		}
	}
	if h := f.Health()[0]; h.Failures != 0 || h.State != federate.StateUp {
		t.Errorf("health = %+v: a lost session counted as an upstream failure", h)
	}
}
