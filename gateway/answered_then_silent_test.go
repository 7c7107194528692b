package gateway

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// An upstream answers a tools/call on an event stream, then leaves the
// stream open, silent (MCP: it SHOULD close it once the response is sent).
// The client has its result at once, and the call's concurrency slot is
// released with it: the caller's next call is admitted. (Once, the proxy's
// cut at upstream.timeout was taken for a cut call (cutUpstream), and the
// slot stayed held until its lease lapsed.)
func TestAnsweredCallReleasedDespiteSilentStream(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		method, id := peekRPC(r)
		if method != "tools/call" {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{}}`, id)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"done\"}]}}\n\n", id)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(up.Close)
	e := newEnv(t, setup{UpstreamURL: up.URL, UpstreamYAML: "  timeout: 300ms\n", Config: cutConfig})
	tok := token(t, "acme", "alice")
	r1 := e.callRaw(0, tok, 1, "block", map[string]any{})
	if r1.Status != http.StatusOK || r1.Msg.Result == nil {
		t.Fatalf("first call: %+v", r1)
	}
	time.Sleep(50 * time.Millisecond)
	r2 := e.callRaw(0, tok, 2, "block", map[string]any{})
	if r2.Status != http.StatusOK {
		t.Errorf("the first call was answered (and its request ended), yet the next one got HTTP %d %+v: the answered call's slot is still held", r2.Status, r2.Msg)
	}
}
