package federate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
)

// A hung upstream behind a proxy that refuses (403 with a JSON-RPC error
// body) one request between each two hung calls. A refusal is "no sign the
// upstream serves" (see throughMCP, outcome refused), yet report(refused)
// zeroed the consecutive-failure count: timeout, refusal, timeout,
// refusal, ... never reached Failures and the breaker never opened, though
// every call sent upstream timed out with its ping unanswered. A refusal
// leaves the count now.
func TestRefusalsInterleavedWithTimeoutsOpenBreaker(t *testing.T) {
	var hang atomic.Bool
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	wrap := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && hang.Load() {
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				if strings.Contains(string(body), `"text":"forbidden"`) {
					var m struct {
						ID json.RawMessage `json:"id"`
					}
					_ = json.Unmarshal(body, &m)
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusForbidden)
					_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"error":{"code":-32001,"message":"forbidden by policy"}}`))
					return
				}
				select {
				case <-r.Context().Done():
				case <-release:
				}
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	a := startHTTPUpstream(t, "a", wrap)
	f, cs := start(t, federate.Options{Failures: 2, Cooldown: time.Minute,
		Upstreams: []federate.Upstream{{Name: "a", URL: a.URL(), Prefix: "a__", Timeout: 500 * time.Millisecond}}}, nil)
	if got, _ := callText(t, cs, "a__echo", map[string]any{"text": "x"}); got != "a: x" {
		t.Fatalf("a__echo = %q", got)
	}
	hang.Store(true)
	timeouts := 0
	for i := range 4 {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "a__echo", Arguments: map[string]any{"text": "x"}})
		if err != nil && strings.Contains(err.Error(), "timed out") {
			timeouts++
		}
		if f.Health()[0].State == federate.StateOpen {
			return
		}
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "a__echo", Arguments: map[string]any{"text": "forbidden"}})
		t.Logf("round %d: refused call %q %v; health %+v", i+1, callResultText(res), err, f.Health()[0])
	}
	if h := f.Health()[0]; h.State != federate.StateOpen {
		t.Errorf("health of a, hung (%d calls timed out, pings unanswered) behind a proxy refusing a request between them = %+v, want open (Failures 2)", timeouts, h)
	}
}
