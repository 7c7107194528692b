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

	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// leftLoad is a gateway shutting down while the load of one cached call
// (llm_complete, estimate 1, reporting 500 tokens) whose caller left is
// held upstream: its HTTP server is closed, as a shutdown does, and its
// Close runs (closed gets its error).
type leftLoad struct {
	e      *env
	st     *sqlite.Store // the usage store
	closed chan error    // Close's result
	free   func()        // lets the held load end; idempotent
}

// startLeftLoad starts a leftLoad whose instance logs to logger (nil: the
// quiet logger).
func startLeftLoad(t *testing.T, logger *slog.Logger) leftLoad {
	t.Helper()
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
	st := openUsageDB(t, "")
	e := newEnv(t, setup{Usage: st, Logger: logger, Upstream: jsonUpstream, UpstreamURL: front.URL + "/mcp", Config: `
usage: {flush_interval: 1h}
tools:
  llm_complete:
    cost: {estimate: 1, from_result: _meta.usage.tokens}
    cache: {ttl: 10m}
`})
	t.Cleanup(free) // first: the env's and front's cleanups wait for the load
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
	return leftLoad{e: e, st: st, closed: closed, free: free}
}
