package gateway

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/examples/upstream"
)

// Reloads (Apply) do not leave the previous runtimes' keep-alive
// connections to the upstream open: after several reloads of an unchanged
// config, one call at a time, the upstream holds at most 2 connections
// from the gateway. (Once, each reload's new mcp.Proxy
// cloned a new http.Transport and nothing closed the old one's idle
// connections: a gateway reloaded often held file descriptors in
// proportion to its reload rate.)
func TestReloadClosesOldUpstreamConnections(t *testing.T) {
	t.Parallel()
	up := upstream.New(&upstream.Options{Stateless: true, JSONResponse: true})
	var mu sync.Mutex
	open := map[net.Conn]bool{}
	us := httptest.NewUnstartedServer(up.Handler())
	us.Config.ConnState = func(c net.Conn, s http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch s {
		case http.StateNew:
			open[c] = true
		case http.StateClosed, http.StateHijacked:
			delete(open, c)
		}
	}
	us.Start()
	t.Cleanup(us.Close)
	e := newEnv(t, setup{UpstreamURL: us.URL + "/mcp"})
	g := e.gws[0]
	call := func() {
		cs := connect(t, e.mcpURL(0), token(t, "acme", "alice"), "")
		if res, err := callTool(t.Context(), cs, "echo", map[string]any{"text": "x"}); err != nil || res.IsError {
			t.Fatalf("call: %v %+v", err, res)
		}
		_ = cs.Close()
	}
	call()
	const reloads = 8
	for range reloads {
		cfg := g.Config()
		if err := g.Apply(cfg, authFor(t, cfg, nil)); err != nil {
			t.Fatal(err)
		}
		call()
	}
	time.Sleep(200 * time.Millisecond) // let closes reach the server
	mu.Lock()
	n := len(open)
	mu.Unlock()
	if n > 2 {
		t.Fatalf("after %d reloads of an unchanged config, the upstream has %d connections from the gateway open (one call at a time throughout): the old runtimes' idle connections are never closed", reloads, n)
	}
}
