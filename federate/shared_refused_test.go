package federate_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
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
