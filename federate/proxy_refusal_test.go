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

// An upstream behind a proxy: the upstream hangs (takes every POST,
// answers none, pings included), while the proxy refuses one request in
// each timeout window, 429 or a 403 whose body is a JSON-RPC error
// answering it. Such a refusal is no answer of the upstream's MCP layer:
// counted as heard, every timeout overlapping one would be "the call's
// own" and not counted, and the breaker would never open. Two hung calls
// per round, 4 rounds, Failures 2: it opens.
func TestProxyRefusalsDoNotKeepHungUpstreamBreakerClosed(t *testing.T) {
	refuse429 := func(w http.ResponseWriter, _ []byte) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "slow down", http.StatusTooManyRequests)
	}
	t.Run("429", func(t *testing.T) { testProxyRefusals(t, refuse429) })
	t.Run("403 JSON-RPC", func(t *testing.T) { testProxyRefusals(t, refuse403) })
}

func testProxyRefusals(t *testing.T, refuse func(http.ResponseWriter, []byte)) {
	f, cs := hungBehindProxy(t, refuse)
	for i := range 4 {
		time.Sleep(1100 * time.Millisecond) // the last 429's Retry-After passes
		done := make(chan error, 2)
		for range 2 {
			go func() {
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "a__echo", Arguments: map[string]any{"text": "x"}})
				if err == nil {
					t.Logf("hung call answered: %q", callResultText(res))
				}
				done <- err
			}()
		}
		time.Sleep(100 * time.Millisecond) // the hung call is sent
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "a__echo", Arguments: map[string]any{"text": "forbidden"}})
		t.Logf("round %d: refused call: %q %v; health %+v", i+1, callResultText(res), err, f.Health()[0])
		for range 2 {
			if err := <-done; err == nil || !strings.Contains(err.Error(), "timed out") {
				if err == nil && f.Health()[0].State == federate.StateOpen {
					return // the breaker opened: as it should
				}
				t.Fatalf("round %d: hung call: %v, want a timeout", i+1, err)
			}
		}
		if f.Health()[0].State == federate.StateOpen {
			t.Logf("open after round %d", i+1)
			return
		}
	}
	if h := f.Health()[0]; h.State != federate.StateOpen {
		t.Errorf("health of a, hung (2 calls timed out in each of 4 rounds, pings unanswered) behind a proxy refusing another request = %+v, want open", h)
	}
}

// refuse403 is a proxy's refusal of the request body: a 403 whose body is
// a JSON-RPC error answering it.
func refuse403(w http.ResponseWriter, body []byte) {
	var m struct {
		ID json.RawMessage `json:"id"`
	}
	_ = json.Unmarshal(body, &m)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"error":{"code":-32001,"message":"forbidden by policy"}}`))
}

// hungBehindProxy federates upstream "a" (Failures 2, a 500ms timeout)
// and, once a first call went through, hangs it: every POST then gets no
// answer, pings included, except a call of a__echo with the text
// "forbidden", which a proxy in front answers with refuse.
func hungBehindProxy(t *testing.T, refuse func(http.ResponseWriter, []byte)) (*federate.Federator, *mcp.ClientSession) {
	t.Helper()
	var hang atomic.Bool
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	wrap := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && hang.Load() {
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				if strings.Contains(string(body), `"text":"forbidden"`) {
					refuse(w, body) // the proxy's
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
	return f, cs
}

func callResultText(res *mcp.CallToolResult) string {
	if res == nil {
		return ""
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}
