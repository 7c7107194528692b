package federate_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// An HTTP upstream answers a tools/call with an application/json body that
// does not end (no Content-Length). The federation's go-sdk client reads a
// JSON answer whole (io.ReadAll), and bytes arriving fast never trip the
// call's idle timeout: one upstream could hold gigabytes and have the
// gateway killed. The answer is cut at mcp.DefaultMaxResponseBytes, as the
// single-upstream proxy cuts one.
func TestEndlessJSONAnswerIsBounded(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "big", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "big", InputSchema: map[string]any{"type": "object"}}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{}, nil
	})
	inner := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	const budget = 128 << 20 // past any bound, small enough to write fast
	var written atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !bytes.Contains(body, []byte(`"tools/call"`)) {
			r.Body = io.NopCloser(bytes.NewReader(body))
			inner.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		n, _ := io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"`)
		written.Add(int64(n))
		chunk := []byte(strings.Repeat("x", 1<<20))
		for written.Load() < budget {
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(func() { ts.CloseClientConnections(); ts.Close() })

	_, cs := start(t, federate.Options{Upstreams: []federate.Upstream{{Name: "b", URL: ts.URL, Prefix: "b__", Timeout: 20 * time.Second}}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	startAt := time.Now()
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "b__big", Arguments: map[string]any{}})
	t.Logf("call ended after %v: %v; the upstream wrote %d MiB", time.Since(startAt).Round(time.Millisecond), err, written.Load()>>20)
	if err == nil {
		t.Fatal("a call whose answer never ends succeeded")
	}
	if got := written.Load(); got > 64<<20 {
		t.Fatalf("the federation read %d MiB of one JSON answer: want it cut near 16 MiB", got>>20)
	}
}
