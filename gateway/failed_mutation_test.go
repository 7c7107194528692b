package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// mutationFaultUpstream answers search with a new version each time and
// update_product (the update applied, then the answer going wrong) with
// fault.
func mutationFaultUpstream(t *testing.T, fault string) *httptest.Server {
	var loads atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var m struct {
			ID     json.RawMessage       `json:"id"`
			Params struct{ Name string } `json:"params"`
		}
		_ = json.Unmarshal(body, &m)
		if m.Params.Name == "update_product" {
			const progress = `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":1}}`
			switch fault {
			case "timeout":
				time.Sleep(1500 * time.Millisecond)
			case "html502":
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(http.StatusBadGateway)
				io.WriteString(w, "<html>bad gateway</html>")
				return
			case "sse_cut":
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "event: message\ndata: "+progress+"\n\n")
				w.(http.Flusher).Flush()
				if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
					conn.Close()
				}
				return
			case "sse_end":
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "event: message\ndata: "+progress+"\n\n")
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"version %d"}]}}`, m.ID, loads.Add(1))
	}))
	t.Cleanup(up.Close)
	return up
}

// A mutating tool whose call reached the upstream and got no usable answer
// (a timeout, a 5xx page, a stream cut or ended without the response) may
// have written all the same: the call is settled as Failed, not as a tool
// error, so its invalidations run and the next read is a miss.
func TestFailedMutationInvalidates(t *testing.T) {
	for _, fault := range []string{"timeout", "html502", "sse_cut", "sse_end"} {
		t.Run(fault, func(t *testing.T) {
			up := mutationFaultUpstream(t, fault)
			e := newEnv(t, setup{UpstreamURL: up.URL + "/mcp", UpstreamYAML: "  timeout: 1s\n", Config: `
tools:
  search:
    cache: {ttl: 10m, tags: ["product:{{args.query}}"]}
  update_product:
    invalidates: ["product:{{args.id}}"]
`})
			tok := token(t, "acme", "alice")
			if first := e.callRaw(0, tok, 1, "search", map[string]any{"query": "42"}); cacheSrc(first) != "miss" {
				t.Fatalf("first search: %d %s %q", first.Status, first.Body, cacheSrc(first))
			}
			upd := e.callRaw(0, tok, 2, "update_product", map[string]any{"id": "42"})
			if upd.Status < 500 && upd.Msg.Error == nil {
				t.Fatalf("update: %d %s, want a failure", upd.Status, upd.Body)
			}
			if after := e.callRaw(0, tok, 3, "search", map[string]any{"query": "42"}); cacheSrc(after) != "miss" {
				t.Fatalf("search after a failed update (%d %s): X-Mcp-Cache %q, want a miss", upd.Status, upd.Body, cacheSrc(after))
			}
		})
	}
}
