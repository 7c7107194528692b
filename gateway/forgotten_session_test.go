package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/examples/upstream"
)

// A session the idle sweep could not end upstream (MCP lets a server refuse
// a DELETE: 405) is not served again once maxEndTries DELETEs failed and
// the tracker forgot it: its slot lapsed, so a subject capped at one session
// cannot hold it next to the one it opens after. (Once, sessionTracker.use
// re-tracked the unknown session as live without asking whether its lease
// was still held.)
func TestForgottenIdleSessionIsNotServedAgain(t *testing.T) {
	t.Parallel()
	up := upstream.New(&upstream.Options{SessionTimeout: -1})
	url := lostSessionUpstream(t, up, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "sessions are kept", http.StatusMethodNotAllowed)
	})
	e := newEnv(t, setup{UpstreamURL: url, Config: "sessions: {max_per_subject: 1, idle_timeout: 1s}\n"})
	alice, old := aliceSession(t, e)
	hdr := http.Header{"Mcp-Session-Id": {old}}

	tr := e.gws[0].tracker
	tracked := func() int {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return len(tr.m)
	}
	// The session idles: its lease lapses, the sweep tries to end it
	// maxEndTries times (405 each time) and forgets it.
	eventually(t, 30*time.Second, "the sweep forgot the idle session it could not end", func() bool { return tracked() == 0 })

	// The slot is free: alice opens another session, her only allowed one.
	if r := initialize(t, e, 0, alice); r.Status != http.StatusOK {
		t.Fatalf("initialize after the old session's slot lapsed: %d %s", r.Status, r.Body)
	}
	// The old session holds no slot: it must not be served.
	if r := post(t, e.mcpURL(0), alice, methodBody(9, "tools/list", `{}`), hdr); r.Status == http.StatusOK {
		t.Fatalf("a session whose slot lapsed, that the sweep tried to end and forgot, was served again (%d) next to the subject's one allowed session", r.Status)
	}
	if n := sessionsOn(up); n != 2 {
		t.Logf("%d upstream sessions open", n)
	}
}

// The same one step earlier: a session in use whose slot is found gone at a
// renewal (sessionTracker.renew: dead) is answered 404, and still 404 on
// the request after, not re-tracked as live once the 404 dropped it from
// the tracker. Here the lease is released behind the gateway's back, as a
// store outage longer than idle_timeout lapses it, and the upstream refuses
// the gateway's DELETE.
func TestSessionWithLostSlotStaysRefusedAfterOne404(t *testing.T) {
	t.Parallel()
	up := upstream.New(&upstream.Options{SessionTimeout: -1})
	url := lostSessionUpstream(t, up, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "sessions are kept", http.StatusMethodNotAllowed)
	})
	e := newEnv(t, setup{UpstreamURL: url, Config: "sessions: {max_per_subject: 1, idle_timeout: 2s}\n"})
	alice, id := aliceSession(t, e)
	g := e.gws[0]
	p := auth.Principal{Tenant: "acme", Subject: "alice"}
	upstreamID, lease, ok := g.sessions.unwrap(p, id)
	if !ok || lease == "" {
		t.Fatalf("session id %q carries no lease", id)
	}
	hdr := http.Header{"Mcp-Session-Id": {id}}
	if r := post(t, e.mcpURL(0), alice, methodBody(2, "tools/list", `{}`), hdr); r.Status != http.StatusOK {
		t.Fatalf("tools/list: %d %s", r.Status, r.Body)
	}
	g.eng.SessionSlotsOf(p.Tenant, p.Subject, lease).Release(t.Context()) // the slot is gone
	dead := func() bool {
		g.tracker.mu.Lock()
		defer g.tracker.mu.Unlock()
		en := g.tracker.m[upstreamID]
		return en != nil && en.dead
	}
	eventually(t, 20*time.Second, "the sweep found the slot gone", dead)
	if r := post(t, e.mcpURL(0), alice, methodBody(3, "tools/list", `{}`), hdr); r.Status != http.StatusNotFound {
		t.Fatalf("the session without a slot: %d, want 404", r.Status)
	}
	if r := post(t, e.mcpURL(0), alice, methodBody(4, "tools/list", `{}`), hdr); r.Status != http.StatusNotFound {
		t.Fatalf("the session without a slot, told 404 once, was served again: %d, want 404", r.Status)
	}
}
