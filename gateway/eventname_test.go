package gateway

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/usage"
)

// An upstream writes its answer's event name padded ("event: message ").
// The Go SDK client trims event names and read it as the call's response
// while the proxy read a non-message event and never saw the answer: the
// call was settled as a failure, charged its estimate instead of the 500
// tokens the client saw. Such a stream is now refused: client and gateway
// agree the call failed. The unpadded name is the control.
func TestPaddedEventNameIsRefused(t *testing.T) {
	for _, name := range []string{"message", "message ", " message", "message\t"} {
		t.Run(name, func(t *testing.T) {
			var inner http.Handler
			front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				if !bytes.Contains(body, []byte(`"llm_complete"`)) || !bytes.Contains(body, []byte(`tools/call`)) {
					inner.ServeHTTP(w, r)
					return
				}
				rec := httptest.NewRecorder()
				inner.ServeHTTP(rec, r)
				out := bytes.ReplaceAll(rec.Body.Bytes(), []byte("event: message\n"), []byte("event: "+name+"\n"))
				for k, v := range rec.Header() {
					w.Header()[k] = v
				}
				w.Header().Del("Content-Length")
				w.WriteHeader(rec.Code)
				w.Write(out)
			}))
			t.Cleanup(front.Close)
			st := openUsageDB(t, "")
			e := newEnv(t, setup{Usage: st, Upstream: stateless, UpstreamURL: front.URL + "/mcp", Config: `
usage: {flush_interval: 50ms}
tools:
  llm_complete: {cost: {estimate: 150, from_result: _meta.usage.tokens}}
`})
			inner = e.up.Handler()
			tok := token(t, "acme", "alice")
			cs := connect(t, e.mcpURL(0), tok, "")
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			res, err := callTool(ctx, cs, "llm_complete", map[string]any{"prompt": "p", "tokens": 500})
			if err != nil || res.IsError {
				if name == "message" {
					t.Fatalf("the control call failed: %v %+v", err, res)
				}
				// Refused: the client and the gateway agree the call failed.
				t.Logf("SDK client: %v %+v", err, res)
				return
			}
			t.Logf("SDK client got a successful result, _meta %v", res.Meta)
			e.srvs[0].Close() // wait for the call to be settled
			got := e.live(0, "acme", usage.Period(time.Now()))
			if got.Used() != 500 {
				t.Errorf("event %q: the client got a result reporting 500 tokens, the tenant was charged %d (%+v)", name, got.Used(), got)
			}
		})
	}
}
