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

// endingFixture is a session tracker on a fake clock over an upstream that
// counts the DELETEs it gets, tracking one session "s" of p (no slot) that
// the sweep has just picked as idle: job is its plan, which endIdle runs.
type endingFixture struct {
	tr      *sessionTracker
	p       auth.Principal
	now     time.Time
	deletes atomic.Int64
	job     sweepJob
}

const endingIdle = time.Minute

func newEndingFixture(t *testing.T) *endingFixture {
	t.Helper()
	f := &endingFixture{p: auth.Principal{Tenant: "acme", Subject: "alice"}, now: time.Unix(1_000_000, 0)}
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			f.deletes.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(fake.Close)
	cfg := &policy.Config{}
	cfg.Upstream.URL = fake.URL + "/mcp"
	cfg.Sessions.IdleTimeout = endingIdle
	g := &Gateway{log: quietLogger(), metrics: metrics.New()}
	g.rt.Store(&runtime{cfg: cfg})
	f.tr = newSessionTracker(g, 0)
	f.tr.now = func() time.Time { return f.now }
	f.tr.add("s", f.p, enforce.SessionSlots{}, "2025-06-18", true)
	f.now = f.now.Add(endingIdle)
	jobs := f.tr.plan(endingIdle) // the sweep picks s as idle; endIdle runs next
	if len(jobs) != 1 || !jobs[0].end {
		t.Fatalf("plan: %+v, want s ended", jobs)
	}
	f.job = jobs[0]
	return f
}

// A request let through into a session a sweep has picked as idle (plan
// sets ending), before endIdle runs, never has its session DELETEd upstream
// under it. (Once, use() read only dead, which endIdle sets later, so such
// a request became active and endIdle's DELETE followed anyway: the request
// failed mid-way and the session the client just used was gone.)
func TestSessionBeingEndedIsNotDeletedUnderARequest(t *testing.T) {
	f := newEndingFixture(t)
	e, live := f.tr.use("s", f.p, enforce.SessionSlots{}) // a request comes in meanwhile
	f.tr.endIdle(context.Background(), f.job)
	if live && f.deletes.Load() > 0 {
		t.Fatalf("a request let through into a session the sweep was ending (active=%d) had its session DELETEd upstream under it (%d DELETE)", e.active, f.deletes.Load())
	}
}

// A request that came and went between the sweep's plan (ending) and
// endIdle revives the session: it is not DELETEd, stays tracked and
// served, and is ended only once idle again, by a later sweep.
func TestSessionUsedWhileBeingEndedIsKeptUntilIdleAgain(t *testing.T) {
	f := newEndingFixture(t)
	f.now = f.now.Add(time.Second)
	e, live := f.tr.use("s", f.p, enforce.SessionSlots{})
	if !live {
		t.Fatal("a request of a session being ended, before it is dead, was refused")
	}
	f.tr.done(e) // over before endIdle runs
	f.tr.endIdle(context.Background(), f.job)
	if n := f.deletes.Load(); n != 0 {
		t.Fatalf("a session used after plan picked it was DELETEd (%d)", n)
	}
	if _, live := f.tr.use("s", f.p, enforce.SessionSlots{}); !live {
		t.Fatal("the revived session is refused")
	}
	f.tr.done(e)

	// Idle again: ended.
	f.now = f.now.Add(2 * endingIdle)
	f.tr.sweep(context.Background(), endingIdle) // renews nothing (no slot), clears the use
	f.now = f.now.Add(endingIdle)
	f.tr.sweep(context.Background(), endingIdle)
	if n := f.deletes.Load(); n != 1 {
		t.Fatalf("the revived session, idle again, got %d DELETEs, want 1", n)
	}
}
