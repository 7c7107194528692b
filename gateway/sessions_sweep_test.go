package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/policy"
)

// The idle sweep forgets a session only once the upstream has ended it
// (2xx) or does not know it (404), and counts it ended only for a 2xx. A
// DELETE refused (405) or failed (503) keeps the session tracked, its
// requests answered 404, and is sent again one idle_timeout later, not at
// every sweep, and maxEndTries times at most: an upstream that never ends
// it does not keep it tracked for ever. A version learnt from a request
// that the upstream refuses (400) is not sent again; the negotiated one is.
func TestIdleSweepEndsSessionsOnlyWhenTheUpstreamDid(t *testing.T) {
	var mu sync.Mutex
	answers := map[string][]int{ // DELETE answers by session, in turn; then 405
		"ended":     {http.StatusMethodNotAllowed, http.StatusServiceUnavailable, http.StatusOK},
		"unknown":   {http.StatusNotFound},
		"kept":      nil,
		"learnt":    {http.StatusBadRequest, http.StatusOK},
		"versioned": {http.StatusBadRequest, http.StatusOK},
	}
	var seen []string // session and version of each DELETE
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		sid := r.Header.Get("Mcp-Session-Id")
		seen = append(seen, sid+" "+r.Header.Get("Mcp-Protocol-Version"))
		status := http.StatusMethodNotAllowed
		if a := answers[sid]; len(a) > 0 {
			status, answers[sid] = a[0], a[1:]
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(fake.Close)
	takeSeen := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := slices.Clone(seen)
		slices.Sort(out)
		seen = nil
		return out
	}

	if maxEndTries != 4 {
		t.Fatalf("the steps below send kept maxEndTries DELETEs: 4, not %d", maxEndTries)
	}
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
	for _, s := range []string{"ended", "unknown", "kept", "versioned"} {
		tr.add(s, p, enforce.SessionSlots{}, "2025-06-18", true)
	}
	tr.add("learnt", p, enforce.SessionSlots{}, "", false) // opened through another instance
	e, _ := tr.use("learnt", p, enforce.SessionSlots{})
	tr.learn(e, "2000-01-01")
	tr.done(e)

	ctx := context.Background()
	for i, step := range []struct {
		after   time.Duration
		want    []string // the DELETEs the sweep sends
		tracked []string // the sessions tracked after it
		ended   float64  // mcpgate_upstream_sessions_ended_total
	}{
		{idle / 2, nil, []string{"ended", "kept", "learnt", "unknown", "versioned"}, 0},
		{idle / 2, []string{"ended 2025-06-18", "kept 2025-06-18", "learnt 2000-01-01", "unknown 2025-06-18", "versioned 2025-06-18"},
			[]string{"ended", "kept", "learnt", "versioned"}, 0},
		{idle / 4, nil, []string{"ended", "kept", "learnt", "versioned"}, 0}, // not at every sweep
		{3 * idle / 4, []string{"ended 2025-06-18", "kept 2025-06-18", "learnt ", "versioned 2025-06-18"}, []string{"ended", "kept"}, 2},
		{idle, []string{"ended 2025-06-18", "kept 2025-06-18"}, []string{"kept"}, 3},
		{idle, []string{"kept 2025-06-18"}, nil, 3}, // maxEndTries: forgotten
		{idle, nil, nil, 3},
	} {
		now = now.Add(step.after)
		tr.sweep(ctx, idle)
		if got := takeSeen(); !slices.Equal(got, step.want) {
			t.Fatalf("sweep %d: the upstream got DELETEs %q, want %q", i, got, step.want)
		}
		tr.mu.Lock()
		var tracked []string
		for s := range tr.m {
			tracked = append(tracked, s)
		}
		tr.mu.Unlock()
		slices.Sort(tracked)
		if !slices.Equal(tracked, step.tracked) {
			t.Fatalf("sweep %d: tracked %q, want %q", i, tracked, step.tracked)
		}
		if got := counterValue(t, g.metrics.SessionsEnded); got != step.ended {
			t.Fatalf("sweep %d: %v sessions counted ended, want %v", i, got, step.ended)
		}
		for _, s := range tracked {
			if i > 0 { // (a request at the first would make its session used)
				if _, live := tr.use(s, p, enforce.SessionSlots{}); live {
					t.Fatalf("sweep %d: a request of %s, a session being ended, was let through", i, s)
				}
			}
		}
	}
}
