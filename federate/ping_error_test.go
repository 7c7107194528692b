package federate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// pingNotFound answers a ping with a JSON-RPC error (-32601, method not
// found) over HTTP 200, as a server without ping does: the upstream
// answered, promptly.
func pingNotFound(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var m struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			if json.Unmarshal(body, &m) == nil && m.Method == "ping" {
				w.Header().Set("Content-Type", "application/json")
				if sid := r.Header.Get("Mcp-Session-Id"); sid != "" {
					w.Header().Set("Mcp-Session-Id", sid)
				}
				_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"error":{"code":-32601,"message":"method not found"}}`))
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// An upstream that answers everything, ping with a JSON-RPC error: its
// answer to the liveness ping is an answer (as a JSON-RPC error to a call
// is, see call.verdict), so one caller's slow calls are that caller's and
// do not open the breaker for every caller.
func TestPingAnsweredWithJSONRPCErrorIsAlive(t *testing.T) {
	a := startHTTPUpstream(t, "a", pingNotFound)
	f, cs := start(t, federate.Options{Failures: 2, Cooldown: time.Minute,
		Upstreams:    []federate.Upstream{{Name: "a", URL: a.URL(), Prefix: "a__"}},
		ToolTimeouts: map[string]time.Duration{"a__slow": 300 * time.Millisecond}}, nil)
	for i := range 2 {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "a__slow", Arguments: map[string]any{"ms": 5000}})
		if err == nil || !strings.Contains(err.Error(), "timed out") {
			t.Fatalf("slow call %d: %v %v, want a timeout", i+1, testenv.ToolText(res), err)
		}
	}
	if h := f.Health()[0]; h.State != federate.StateUp || h.Failures != 0 {
		t.Errorf("health of a (answers every request, ping with a JSON-RPC error) after 2 slow calls = %+v, want up, no failures", h)
	}
	if got, isErr := callText(t, cs, "a__echo", map[string]any{"text": "x"}); got != "a: x" || isErr {
		t.Fatalf("a__echo after the slow calls = %q (isError %v)", got, isErr)
	}
}
