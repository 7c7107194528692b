package main

import (
	"strings"
	"testing"
	"time"
)

// The in-process keep-alive ping that listenersKept posts for a client
// listening on its GET stream is the server's, not the tenant's: it is not
// charged under the tenant's method rules (a rule naming ping, or methods:
// ["*"]), as the gateway, which counts an open stream as use, charges
// nothing for it. A tenant allowed 2 pings an hour sends none of its own
// while it listens for 3 idle timeouts; its first own ping is admitted.
func TestKeepAlivePingIsNotChargedToTheTenant(t *testing.T) {
	t.Parallel()
	_, url, client, id, post := idleSession(t,
		"tiers:\n  free:\n    limits:\n      - {name: pings, per: tenant, methods: [ping], algorithm: fixed_window, limit: 2, period: 1h}\n")
	get := listen(t, client, url, id)
	defer get.Body.Close()
	time.Sleep(3 * time.Second) // listening, no request of its own
	_, body := post(id, `{"jsonrpc":"2.0","id":2,"method":"ping"}`)
	if strings.Contains(body, "-33029") {
		t.Fatalf("the tenant's first own ping (limit 2 an hour) was refused: the server's keep-alive pings were charged to it:\n%s", body)
	}
	if !strings.Contains(body, `"result"`) {
		t.Fatalf("the tenant's own ping after listening for 3 idle timeouts: %s", body)
	}
}
