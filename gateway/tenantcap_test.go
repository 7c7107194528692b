package gateway

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// A tenant with server.max_requests_per_tenant requests in progress gets
// 429 for one more (scope tenant, Retry-After 1) before any work is done
// for it, another tenant is served meanwhile, and the tenant is served
// again once its requests end: no tenant can hold every connection. The
// requests held in progress are POSTs whose body never finishes arriving.
func TestRequestsPerTenantCap(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Upstream: stateless, Config: "server: {max_requests_per_tenant: 2}\n"})
	acme := token(t, "acme", "alice")
	u, err := url.Parse(e.mcpURL(0))
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
			"Accept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{\"jsonrpc\":", u.Host, acme)
	}
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()

	g := e.gws[0]
	eventually(t, 30*time.Second, "the two stalled requests counted", func() bool {
		g.tenantRequests.mu.Lock()
		defer g.tenantRequests.mu.Unlock()
		return g.tenantRequests.n["acme"] == 2
	})
	before := e.up.TotalCalls()
	r := post(t, e.mcpURL(0), acme, callBody(3, "echo", map[string]any{"text": "x"}), nil)
	if r.Status != http.StatusTooManyRequests {
		t.Fatalf("a third request in progress: %d %s, want 429", r.Status, r.Body)
	}
	if r.code() != CodeRateLimited || r.Header.Get("Retry-After") != "1" {
		t.Fatalf("a third request in progress: %d %s, want 429 with Retry-After 1", r.Status, r.Body)
	}
	if d := r.denial(t); d.Scope != "tenant" || d.Rule != ruleRequestsPerTenant || d.Limit != 2 || d.Remaining != 0 {
		t.Fatalf("denial %+v", d)
	}
	if got := e.up.TotalCalls(); got != before {
		t.Fatalf("the refused request reached the upstream (%d calls, want %d)", got, before)
	}
	other := token(t, "globex", "bob")
	if r := post(t, e.mcpURL(0), other, callBody(4, "echo", map[string]any{"text": "x"}), nil); r.Status != http.StatusOK {
		t.Fatalf("another tenant: %d %s", r.Status, r.Body)
	}

	for _, c := range held {
		c.Close()
	}
	eventually(t, 30*time.Second, "acme served again once its requests ended", func() bool {
		return post(t, e.mcpURL(0), acme, callBody(5, "echo", map[string]any{"text": "x"}), nil).Status == http.StatusOK
	})
}

// The counter forgets a tenant without requests in progress, and never
// admits past the cap.
func TestTenantRequestsCounter(t *testing.T) {
	t.Parallel()
	var c tenantRequests
	for i, want := range []bool{true, true, false} {
		if got := c.acquire("a", 2); got != want {
			t.Fatalf("acquire %d under a cap of 2: %v, want %v", i, got, want)
		}
	}
	if !c.acquire("b", 2) {
		t.Fatal("another tenant refused")
	}
	c.release("a")
	if !c.acquire("a", 2) {
		t.Fatal("a released slot was not reused")
	}
	c.release("a")
	c.release("a")
	c.release("b")
	c.mu.Lock()
	n := len(c.n)
	c.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d tenants remembered with nothing in progress", n)
	}
}
