package gateway

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/usage"
)

// An upstream answers a cost-reporting call with HTTP 500 whose JSON body
// is the call's response (result reporting 900 tokens). The client gets an
// HTTP error (SDK clients throw on a non-2xx status and never read the
// result), and the tenant is charged the estimate (150), not the cost read
// from that result. (Once, Done corrected the charge to the 900 read from
// it, though the call was settled as Failed.)
func TestFailedHTTPAnswerKeepsTheEstimate(t *testing.T) {
	var inner http.Handler
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !bytes.Contains(body, []byte(`"llm_complete"`)) {
			inner.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.Header().Del("Content-Length")
		w.WriteHeader(http.StatusInternalServerError)
		w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(front.Close)
	up := stateless
	up.JSONResponse = true
	st := openUsageDB(t, "")
	e := newEnv(t, setup{Usage: st, Upstream: up, UpstreamURL: front.URL + "/mcp", Config: `
usage: {flush_interval: 50ms}
tools:
  llm_complete: {cost: {estimate: 150, from_result: _meta.usage.tokens}}
`})
	inner = e.up.Handler()
	resp := e.callRaw(0, token(t, "acme", "alice"), 1, "llm_complete", map[string]any{"prompt": "p", "tokens": 900})
	t.Logf("client got HTTP %d", resp.Status)
	if resp.Status/100 == 2 {
		t.Fatalf("control: the client got HTTP %d", resp.Status)
	}
	e.srvs[0].Close() // wait for the call to be settled
	if got := e.live(0, "acme", usage.Period(time.Now())); got.Used() != 150 {
		t.Errorf("client got HTTP %d (no result), tenant charged %d (%+v), want the estimate 150", resp.Status, got.Used(), got)
	}
}
