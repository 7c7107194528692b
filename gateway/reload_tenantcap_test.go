package gateway

import (
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/examples/upstream"
)

// server.max_connections is read at start only, so a reload that changes
// it keeps the connection cap in force, and with it the default of
// server.max_requests_per_tenant derived from it (a quarter): raising it
// from 8 to 4096 by reload must not let one tenant hold 1024 requests,
// every one of the 8 connections.
func TestReloadKeptMaxConnectionsKeepsTenantCap(t *testing.T) {
	t.Parallel()
	up := upstream.Options{Stateless: true, JSONResponse: true}
	var logs syncLog
	e := newEnv(t, setup{Upstream: up, Config: "server: {max_connections: 8}\n", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	tok := token(t, "acme", "alice")
	third := func() int {
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Go(func() { e.callRaw(0, tok, i, "slow", map[string]any{"ms": 1500}) })
		}
		time.Sleep(500 * time.Millisecond)
		r := e.callRaw(0, tok, 9, "echo", map[string]any{"text": "third"})
		wg.Wait()
		return r.Status
	}
	if got := third(); got != http.StatusTooManyRequests {
		t.Fatalf("before the reload: the third request of a tenant capped at 8/4 = 2: %d, want 429", got)
	}
	e.apply(setup{Upstream: up, Config: "server: {max_connections: 4096}\n"})
	if got := third(); got != http.StatusTooManyRequests {
		t.Fatalf("after a reload of max_connections (8 stay in force): the third request of the tenant: %d, want 429; the cap is now %d",
			got, e.gws[0].Config().Server.MaxRequestsPerTenant)
	}
	if got := e.gws[0].Config().Server.MaxConnections; got != 8 {
		t.Errorf("Config().Server.MaxConnections after the reload: %d, want 8 (in force)", got)
	}
	if !strings.Contains(logs.String(), "restart mcpgate to apply it\" field=server.max_connections") {
		t.Errorf("no warning that server.max_connections needs a restart; logs:\n%s", logs.String())
	}
}

// A library caller may set server.max_requests_per_tenant in code after
// Parse, like any other field: a file that left it out must not make a
// reload replace the caller's cap by the quarter of the connections.
func TestReloadKeepsCallerSetTenantCap(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: "server: {max_connections: 400}\n"})
	c := *e.cfg
	c.Server.MaxRequestsPerTenant = 3 // the caller's own cap
	if err := e.gws[0].Apply(&c, authFor(t, &c, nil)); err != nil {
		t.Fatal(err)
	}
	if got := e.gws[0].Config().Server.MaxRequestsPerTenant; got != 3 {
		t.Fatalf("Config().Server.MaxRequestsPerTenant after Apply of a config setting it to 3: %d", got)
	}
}
