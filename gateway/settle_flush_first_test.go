package gateway

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
)

const settleGaveUp = "shutdown: cached calls still loading after their callers left; their cost corrections miss the final usage flush"

// While Close waits for a cached load whose caller left, the usage admitted
// so far is already in the durable store (flushed before the wait): a stop
// cut short during the wait (SIGKILL at the end of the pod's grace) loses
// that load's correction at most. The final flush then writes the
// correction.
func TestCloseFlushesBeforeWaitingForLoadsWhoseCallersLeft(t *testing.T) {
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
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	defer free() // before front.Close, which waits for the handler
	st := openUsageDB(t, "")
	logs := &logBuffer{}
	e := newEnv(t, setup{Usage: st, Logger: slog.New(slog.NewJSONHandler(logs, nil)), Upstream: jsonUpstream, UpstreamURL: front.URL + "/mcp", Config: `
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
	leave()
	<-left
	e.srvs[0].Close()
	closed := make(chan error, 1)
	go func() { closed <- e.gws[0].Close() }()
	durable := func() limit.Usage {
		rec, _, err := st.Get(context.Background(), "acme", usage.Period(time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		return rec.Usage
	}
	// Wait (the load held) until the estimate is durable, or Close gave up
	// waiting for the load.
	for durable().Calls == 0 {
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) with nothing flushed while the load was held", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if gaveUp := logs.records(t, settleGaveUp); len(gaveUp) > 0 {
		t.Fatalf("usage flushed only once Close gave up waiting for the load: %v", gaveUp)
	}
	if got, want := durable(), (limit.Usage{Charged: 1, Calls: 1}); got != want {
		t.Errorf("durable usage during the settle wait %+v, want the estimate %+v", got, want)
	}
	free()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if got, want := durable(), (limit.Usage{Charged: 500, Calls: 1}); got != want {
		t.Errorf("durable usage after Close %+v, want %+v: the reported cost of the call whose caller left", got, want)
	}
}
