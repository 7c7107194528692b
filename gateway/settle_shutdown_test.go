package gateway

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
)

// A cached call whose caller left is settled when its load ends, on the
// load's result (the tool ran for that call: leaving must not cut its bill
// to the estimate), and that may be during the shutdown: Close waits for
// it before the final flush, so the cost the result reports is billed.
func TestShutdownWaitsForLoadsWhoseCallersLeft(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	var up http.Handler
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte("llm_complete")) {
			close(arrived)
			<-release
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		up.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	st := openUsageDB(t, "")
	e := newEnv(t, setup{Usage: st, Upstream: jsonUpstream, UpstreamURL: front.URL + "/mcp", Config: `
usage: {flush_interval: 1h}
tools:
  llm_complete:
    cost: {estimate: 1, from_result: _meta.usage.tokens}
    cache: {ttl: 10m}
`})
	up = e.up.Handler()
	ctx, leave := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		_, err := postCtx(ctx, e.mcpURL(0), token(t, "acme", "alice"), callBody(1, "llm_complete", map[string]any{"prompt": "p", "tokens": 500}), nil)
		left <- err
	}()
	<-arrived
	leave() // the caller leaves; its load goes on
	<-left
	e.srvs[0].Close() // as a shutdown does: no call is in a handler any more
	closed := make(chan error, 1)
	go func() { closed <- e.gws[0].Close() }()
	time.Sleep(100 * time.Millisecond) // Close is under way before the load ends
	close(release)
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(maxSettleWait):
		t.Fatal("Close did not return")
	}
	rec, _, err := st.Get(context.Background(), "acme", usage.Period(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if want := (limit.Usage{Charged: 500, Calls: 1}); rec.Usage != want {
		t.Errorf("durable usage %+v, want %+v: the reported cost of the call whose caller left", rec.Usage, want)
	}
}
