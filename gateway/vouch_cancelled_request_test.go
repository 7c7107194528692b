package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/mcpgate/mcpgate/auth"
)

// A session this instance does not track is served only while the store
// holds its lease (sessionTracker.enter, vouch), even when the request
// that names it first is cancelled (a client that hangs up right after
// sending it: here a GET, whose context net/http cancels as soon as the
// connection closes): its next request is refused 404. (Once, vouch took
// the check's context.Canceled for a store outage and tracked the session
// as live, served without a check until the next sweep's renewal.)
func TestCancelledRequestDoesNotVouchForSessionWithoutLease(t *testing.T) {
	t.Parallel()
	e, _ := vouchEnv(t)
	alice, id := aliceSession(t, e)
	p := auth.Principal{Tenant: "acme", Subject: "alice"}
	g1 := e.gws[1]
	upstreamID, lease, ok := g1.sessions.unwrap(p, id)
	if !ok || lease == "" {
		t.Fatalf("session id %q carries no lease", id)
	}
	// The lease lapses (an outage longer than idle_timeout, or the
	// instance that renewed it died): the session holds no slot any more.
	g1.eng.SessionSlotsOf(p.Tenant, p.Subject, lease).Release(t.Context())

	// The client names the session on instance 1, which never saw it, and
	// hangs up at once: the request's context is cancelled.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/mcp", nil)
	_, done, live := g1.useSession(httptest.NewRecorder(), r, p, upstreamID, lease)
	if live {
		done(nil)
	}

	// Its next request, with a live connection, must be refused: the
	// lease is gone.
	hdr := http.Header{"Mcp-Session-Id": {id}}
	if resp := post(t, e.mcpURL(1), alice, methodBody(2, "tools/list", `{}`), hdr); resp.Status != http.StatusNotFound {
		t.Fatalf("a session whose lease is gone was served (%d) after a cancelled request vouched for it (cancelled request live=%v), want 404", resp.Status, live)
	}
}
