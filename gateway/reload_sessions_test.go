package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/examples/upstream"
)

// sessions.idle_timeout is live: a reload that raises it applies to the
// sessions opened before it. Their leases, taken for the old, shorter
// period, are renewed to cover the new one while they are idle: otherwise
// a lease would lapse while the session lives on, and its slot would let
// the subject open a second session over max_per_subject.
func TestReloadRaisedIdleTimeoutKeepsSessionSlot(t *testing.T) {
	t.Parallel()
	up := upstream.Options{SessionTimeout: -1}
	e := newEnv(t, setup{Upstream: up, Config: "sessions: {max_per_subject: 1, idle_timeout: 1s}\n"})
	alice := token(t, "acme", "alice")
	r := initialize(t, e, 0, alice)
	if r.Status != http.StatusOK || r.Header.Get("Mcp-Session-Id") == "" {
		t.Fatalf("initialize: %d %s", r.Status, r.Body)
	}
	id := r.Header.Get("Mcp-Session-Id")
	e.apply(setup{Upstream: up, Config: "sessions: {max_per_subject: 1, idle_timeout: 1h}\n"})
	time.Sleep(3 * time.Second) // idle past the old lease, well within the new 1h
	if r := post(t, e.mcpURL(0), alice, methodBody(2, "tools/list", `{}`), http.Header{"Mcp-Session-Id": {id}}); r.Status != http.StatusOK {
		t.Fatalf("the session opened before the reload, idle 3s of 1h: %d %s", r.Status, r.Body)
	}
	if r := initialize(t, e, 0, alice); r.Status != http.StatusTooManyRequests {
		t.Fatalf("a second session of a subject capped at 1 whose first is alive: %d, want 429; %d upstream sessions open", r.Status, openSessions(e))
	}
}
