package gateway

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/auth"
)

// orderUpstream holds every GET before its response headers until release
// is closed, and records the order in which requests arrive.
type orderUpstream struct {
	release chan struct{}
	mu      sync.Mutex
	seen    []string // "<method> <session>"
}

func (u *orderUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.ReadAll(r.Body)
	u.mu.Lock()
	u.seen = append(u.seen, r.Method+" "+r.Header.Get("Mcp-Session-Id"))
	u.mu.Unlock()
	if r.Method == http.MethodGet {
		select {
		case <-u.release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		return
	}
	w.WriteHeader(http.StatusAccepted) // every POST here is a notification
}

func (u *orderUpstream) arrived() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...)
}

func (u *orderUpstream) has(s string) bool {
	for _, x := range u.arrived() {
		if x == s {
			return true
		}
	}
	return false
}

// A POST of a session whose GET is not yet accepted upstream waits for it;
// a POST of another session does not; the wait is bounded.
func TestSessionOrder(t *testing.T) {
	t.Parallel()
	u := &orderUpstream{release: make(chan struct{})}
	us := httptest.NewServer(u)
	t.Cleanup(us.Close)
	e := newEnv(t, setup{UpstreamURL: us.URL})
	g := e.gws[0]
	g.order.wait = time.Minute // the bound is tested below
	tok := token(t, "acme", "alice")
	p := auth.Principal{Tenant: "acme", Subject: "alice"}
	s1, s2 := g.sessions.wrap(p, "s1"), g.sessions.wrap(p, "s2")
	hdr := func(sid string) http.Header { return http.Header{"Mcp-Session-Id": {sid}} }
	const note = `{"jsonrpc":"2.0","method":"notifications/initialized"}`

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	getDone := make(chan struct{})
	go func() {
		defer close(getDone)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.mcpURL(0), nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Mcp-Session-Id", s1)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	eventually(t, 10*time.Second, "the GET to reach the upstream", func() bool { return u.has("GET s1") })

	postDone := make(chan *response, 1)
	go func() {
		r, err := postCtx(ctx, e.mcpURL(0), tok, note, hdr(s1))
		if err != nil {
			t.Error(err)
		}
		postDone <- r
	}()
	eventually(t, 10*time.Second, "the session's POST to wait", func() bool { return g.order.waiting.Load() == 1 })
	// Another session's POST goes through while the GET is still held.
	if r := post(t, e.mcpURL(0), tok, note, hdr(s2)); r.Status != http.StatusAccepted {
		t.Fatalf("the other session's POST: %d %s", r.Status, r.Body)
	}
	if u.has("POST s1") {
		t.Fatal("the POST reached the upstream before the session's GET was accepted")
	}
	close(u.release)
	if r := <-postDone; r == nil || r.Status != http.StatusAccepted {
		t.Fatalf("the session's POST after its GET: %+v", r)
	}
	seen := u.arrived()
	if want := []string{"GET s1", "POST s2", "POST s1"}; len(seen) != 3 || seen[0] != want[0] || seen[1] != want[1] || seen[2] != want[2] {
		t.Fatalf("upstream saw %v, want %v", seen, want)
	}
	if len(g.order.opening) != 0 {
		t.Fatalf("order entries left: %v", g.order.opening)
	}
	cancel()
	<-getDone
}

// The wait is bounded: a GET that is never accepted delays its session's
// POSTs by the bound only.
func TestSessionOrderBounded(t *testing.T) {
	t.Parallel()
	o := newSessionOrder(time.Millisecond)
	accepted := o.open("s1")
	o.await(context.Background(), "s1", true) // returns: bounded
	o.await(context.Background(), "s2", true) // another session never waits
	o.await(context.Background(), "", true)   // nor requests without a session
	accepted()
	accepted() // idempotent
	if len(o.opening) != 0 || o.waiting.Load() != 0 {
		t.Fatalf("entries %v, waiting %d", o.opening, o.waiting.Load())
	}
}

// A request right after its session's initialization waits for the GET the
// client opens at that moment; a notification does not; the wait ends when
// the GET arrives, or after the grace.
func TestSessionOrderWaitsForTheFirstGET(t *testing.T) {
	t.Parallel()
	o := newSessionOrder(time.Minute)
	o.grace = time.Minute
	o.initialized("s1")
	o.await(context.Background(), "s1", false) // a notification: no wait
	done := make(chan struct{})
	go func() {
		defer close(done)
		o.await(context.Background(), "s1", true)
	}()
	eventually(t, 10*time.Second, "the request to wait for the GET", func() bool { return o.waiting.Load() == 1 })
	accepted := o.open("s1") // the GET arrives: the request goes on to wait for its acceptance
	eventually(t, 10*time.Second, "the request to wait for the GET's acceptance", func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return len(o.fresh) == 0 && o.waiting.Load() == 1
	})
	accepted()
	<-done

	o.grace = time.Millisecond
	o.initialized("s2")
	o.await(context.Background(), "s2", true) // no GET ever comes: bounded by the grace
	eventually(t, 10*time.Second, "the fresh entry to be forgotten", func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return len(o.fresh) == 0
	})
}
