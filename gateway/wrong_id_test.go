package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// An upstream answering a tools/call with a 200 JSON response carrying
// another id, behind a gateway that does not read answers (no breaker, no
// cost from the result, no invalidations): the SDK client gets the
// gateway's 502 at once, not a wait until its own deadline.
func TestWrongIDAnswerReachesTheClient(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		_ = json.Unmarshal(body, &m)
		if r.Method != http.MethodPost || strings.HasPrefix(m.Method, "notifications/") {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch m.Method {
		case "initialize":
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"wrongid","version":"1"}}}`, m.ID)
		case "tools/call":
			io.WriteString(w, `{"jsonrpc":"2.0","id":"other","result":{"content":[{"type":"text","text":"done"}]}}`)
		default:
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{}}`, m.ID)
		}
	}))
	t.Cleanup(up.Close)
	e := newEnv(t, setup{UpstreamURL: up.URL + "/mcp"})
	cs := connect(t, e.mcpURL(0), token(t, "acme", "alice"), "2025-06-18")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := callTool(ctx, cs, "anything", map[string]any{})
	if err == nil || ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "Bad Gateway") {
		t.Fatalf("call answered with another id: %v (context: %v), want the gateway's error at once", err, ctx.Err())
	}
}
