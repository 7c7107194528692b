package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/policy"
)

// Once a sweep has picked a session as idle (plan sets ending), the
// session is being ended: endIdle's DELETE follows, whatever comes in
// meanwhile. But use() reads only dead, which endIdle sets later (after
// the slot Check's round trip to the store), so a request arriving in
// between is let through, becomes active, and the session is then
// DELETEd upstream under it: the request fails mid-way and the session
// the client just used is gone.
func TestRequestOfASessionBeingEndedIsLetThrough(t *testing.T) {
	var deletes atomic.Int64
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			deletes.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(fake.Close)
	const idle = time.Minute
	cfg := &policy.Config{}
	cfg.Upstream.URL = fake.URL + "/mcp"
	cfg.Sessions.IdleTimeout = idle
	g := &Gateway{log: quietLogger(), metrics: metrics.New()}
	g.rt.Store(&runtime{cfg: cfg})
	tr := newSessionTracker(g, 0)
	now := time.Unix(1_000_000, 0)
	tr.now = func() time.Time { return now }
	p := auth.Principal{Tenant: "acme", Subject: "alice"}
	tr.add("s", p, enforce.SessionSlots{}, "2025-06-18", true)

	now = now.Add(idle)
	jobs := tr.plan(idle) // the sweep picks s as idle; endIdle runs next
	if len(jobs) != 1 || !jobs[0].end {
		t.Fatalf("plan: %+v, want s ended", jobs)
	}
	e, live := tr.use("s", p, enforce.SessionSlots{}) // a request comes in meanwhile
	tr.endIdle(context.Background(), jobs[0])
	if live && deletes.Load() > 0 {
		t.Fatalf("a request let through into a session the sweep was ending (active=%d) had its session DELETEd upstream under it (%d DELETE)", e.active, deletes.Load())
	}
}
