package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	dto "github.com/prometheus/client_model/go"
)

// inDrain counts goroutines inside net/http's discard of an unread request
// body (chunkWriter.writeHeader → io.CopyN(io.Discard, ...)).
func inDrain() int {
	buf := make([]byte, 1<<22)
	n := goruntime.Stack(buf, true)
	c := 0
	for _, g := range bytes.Split(buf[:n], []byte("\n\n")) {
		if (bytes.Contains(g, []byte("net/http.(*chunkWriter).writeHeader")) || bytes.Contains(g, []byte("net/http.(*body).Close"))) && bytes.Contains(g, []byte("io.CopyN")) {
			c++
		}
	}
	return c
}

// A tenant at server.max_requests_per_tenant keeps sending POSTs that
// declare a small body and send only part of it. Each is refused 429 by
// capTenant without its body being read, and net/http then discarded the
// unread body (up to 256 KiB) before writing the 429, under the read
// deadline protect armed (server.read_timeout): the connection stayed busy
// for read_timeout while the tenant's count no longer held it. One tenant
// so held every connection of the instance, and another tenant's request
// was not served (protect now ends that read at once).
func TestRefusedRequestsDoNotHoldConnections(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Upstream: stateless, Config: "server: {max_connections: 4, max_requests_per_tenant: 1, read_timeout: 1h}\n"})
	addr, ln := serveRealListener(t, e)
	g := e.gws[0]
	acme := token(t, "acme", "alice")
	stalled := func() *rawConn {
		c := dialRaw(t, addr)
		fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
			"Accept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{\"jsonrpc\":", acme)
		return c
	}
	// acme's one admitted request, its body stalled.
	stalled()
	testenv.Eventually(t, liveness, "acme's request counted", func() bool {
		g.tenantRequests.mu.Lock()
		defer g.tenantRequests.mu.Unlock()
		return g.tenantRequests.n["acme"] == 1
	})
	// Three more, each refused by the cap.
	for range 3 {
		stalled()
	}
	refused := g.metrics.Denials.WithLabelValues("tenant", ruleRequestsPerTenant)
	testenv.Eventually(t, liveness, "the three requests refused", func() bool {
		var m dto.Metric
		_ = refused.Write(&m)
		return m.GetCounter().GetValue() == 3
	})
	g.tenantRequests.mu.Lock()
	counted := g.tenantRequests.n["acme"]
	g.tenantRequests.mu.Unlock()
	open := gaugeValue(t, g.metrics.OpenConnections)
	t.Logf("acme: %d request(s) counted against max_requests_per_tenant=1; open connections %v of 4, idle %d, refused requests draining %d",
		counted, open, ln.idle.len(), inDrain())

	// Another tenant.
	globex := token(t, "globex", "bob")
	body := callBody(1, "echo", map[string]any{"text": "x"})
	c := dialRaw(t, addr)
	served := make(chan error, 1)
	go func() {
		_, err := fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
			"Accept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s", globex, len(body), body)
		if err == nil {
			_ = c.SetReadDeadline(time.Now().Add(liveness))
			var resp *http.Response
			if resp, err = http.ReadResponse(c.br, nil); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
		}
		served <- err
	}()
	if err := <-served; err != nil {
		t.Fatalf("another tenant's request while acme (cap 1, %d counted) holds %v of 4 connections with refused requests: %v",
			counted, open, strings.TrimSpace(err.Error()))
	}
}

// The same without any token: a request refused 401 before its body is
// read got its answer only once net/http had discarded the body, after
// read_timeout, its connection busy meanwhile and counted by no tenant's
// cap. The 401 comes at once now, and the connection closes.
func TestUnauthenticatedRefusalsDoNotHoldConnections(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Upstream: stateless, Config: "server: {max_connections: 3, read_timeout: 1h}\n"})
	addr, _ := serveRealListener(t, e)
	for i := range 3 {
		c := dialRaw(t, addr)
		fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer nope\r\nContent-Type: application/json\r\n"+
			"Accept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{\"jsonrpc\":")
		_ = c.SetReadDeadline(time.Now().Add(liveness))
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			t.Fatalf("unauthenticated request %d, its body stalled: no answer (%d draining): %v", i, inDrain(), err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
			t.Fatalf("unauthenticated request %d: %d (close %v), want 401 closing the connection", i, resp.StatusCode, resp.Close)
		}
	}
	globex := token(t, "globex", "bob")
	body := callBody(1, "echo", map[string]any{"text": "x"})
	c := dialRaw(t, addr)
	fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"Accept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s", globex, len(body), body)
	_ = c.SetReadDeadline(time.Now().Add(liveness))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("a tenant's request after three unauthenticated requests with stalled bodies: %v", err)
	}
	resp.Body.Close()
}
