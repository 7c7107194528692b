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

// A request that came and went between the sweep's plan (ending) and
// endIdle revives the session: it is not DELETEd, stays tracked and
// served, and is ended only once idle again, by a later sweep.
func TestSessionUsedWhileBeingEndedIsKeptUntilIdleAgain(t *testing.T) {
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
	jobs := tr.plan(idle)
	if len(jobs) != 1 || !jobs[0].end {
		t.Fatalf("plan: %+v, want s ended", jobs)
	}
	now = now.Add(time.Second)
	e, live := tr.use("s", p, enforce.SessionSlots{})
	if !live {
		t.Fatal("a request of a session being ended, before it is dead, was refused")
	}
	tr.done(e) // over before endIdle runs
	tr.endIdle(context.Background(), jobs[0])
	if n := deletes.Load(); n != 0 {
		t.Fatalf("a session used after plan picked it was DELETEd (%d)", n)
	}
	if _, live := tr.use("s", p, enforce.SessionSlots{}); !live {
		t.Fatal("the revived session is refused")
	}
	tr.done(e)

	// Idle again: ended.
	now = now.Add(2 * idle)
	tr.sweep(context.Background(), idle) // renews nothing (no slot), clears the use
	now = now.Add(idle)
	tr.sweep(context.Background(), idle)
	if n := deletes.Load(); n != 1 {
		t.Fatalf("the revived session, idle again, got %d DELETEs, want 1", n)
	}
}
