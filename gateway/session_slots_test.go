package gateway

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/mcp"
)

// notFoundUpstream is up, except that a POST of method "lost/plain" or
// "lost/null" is answered 404 the way a server that no longer knows the
// session answers (the Go SDK's plain text, the TypeScript SDK's JSON-RPC
// error with id null) while the session stays open.
func notFoundUpstream(t *testing.T, up *upstream.Server) string {
	return lostSessionUpstream(t, up, nil)
}

// lostSessionUpstream is notFoundUpstream whose DELETEs go to onDelete
// (nil: to up).
func lostSessionUpstream(t *testing.T, up *upstream.Server, onDelete http.HandlerFunc) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodDelete:
			if onDelete != nil {
				onDelete(w, r)
				return
			}
		case http.MethodPost:
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			switch {
			case strings.Contains(string(body), `"lost/plain"`):
				http.Error(w, "session not found", http.StatusNotFound)
				return
			case strings.Contains(string(body), `"lost/null"`):
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				_, _ = io.WriteString(w, `{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":null}`)
				return
			}
		}
		up.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// sessionsOn counts the sessions open on up.
func sessionsOn(up *upstream.Server) int {
	n := 0
	for range up.MCPServer().Sessions() {
		n++
	}
	return n
}

// oneSession starts a gateway in front of upstreamURL whose subjects may
// hold one session each, and opens alice's: the env, alice's token and the
// session id.
func oneSession(t *testing.T, upstreamURL string) (e *env, alice, id string) {
	t.Helper()
	e = newEnv(t, setup{UpstreamURL: upstreamURL, Config: "sessions: {max_per_subject: 1, idle_timeout: 1h}\n"})
	alice, id = aliceSession(t, e)
	return e, alice, id
}

// aliceSession opens a session of acme's alice on e's first instance: her
// token and the session id.
func aliceSession(t *testing.T, e *env) (alice, id string) {
	t.Helper()
	alice = token(t, "acme", "alice")
	r := initialize(t, e, 0, alice)
	if r.Status != http.StatusOK {
		t.Fatalf("initialize: %d %s", r.Status, r.Body)
	}
	return alice, r.Header.Get("Mcp-Session-Id")
}

// loseSession sends in session id a request lostSessionUpstream answers
// 404 "session not found".
func loseSession(t *testing.T, e *env, tok, id string, rpcID int) {
	t.Helper()
	if r := post(t, e.mcpURL(0), tok, methodBody(rpcID, "lost/plain", `{}`), http.Header{"Mcp-Session-Id": {id}}); r.Status != http.StatusNotFound {
		t.Fatalf("lost/plain in the session: %d %s, want the upstream's 404", r.Status, r.Body)
	}
}

// heldGate is a gate an upstream handler waits on, and the func that opens
// it (once, also at the test's end: the upstream's Close waits for its
// handlers).
func heldGate(t *testing.T) (gate <-chan struct{}, release func()) {
	ch := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	return ch, release
}

// A session's slot is freed on the upstream's 404 only when that 404 says
// the session is gone, and then the session is ended upstream too: a freed
// slot is a session gone upstream. MCP 2026-07-28 answers an unknown method
// 404 (the Go SDK does so inside a session too, with the request's JSON-RPC
// error): read as the session's end, it freed the slot of a session that
// stayed open, and a subject capped at one session opened any number. A
// 404 that is not the request's answer frees the slot, and the session,
// still open upstream, was left there outside the cap.
func TestUpstream404FreesASlotOnlyWithItsSession(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		method string
		header http.Header
		ended  bool // the 404 is the session's end
	}{
		{name: "unknown method under 2026-07-28", method: "bogus/method", header: http.Header{"Mcp-Protocol-Version": {"2026-07-28"}}},
		{name: "plain-text 404", method: "lost/plain", ended: true},
		{name: "JSON-RPC 404 for no request", method: "lost/null", ended: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			up := upstream.New(&upstream.Options{SessionTimeout: -1})
			e, alice, id := oneSession(t, notFoundUpstream(t, up))
			open := func() int { return sessionsOn(up) }
			hdr := http.Header{"Mcp-Session-Id": {id}}
			for k, v := range c.header {
				hdr[k] = v
			}
			if r := post(t, e.mcpURL(0), alice, methodBody(7, c.method, `{}`), hdr); r.Status != http.StatusNotFound {
				t.Fatalf("%s in the session: %d %s, want the upstream's 404", c.method, r.Status, r.Body)
			}
			again := initialize(t, e, 0, alice)
			if !c.ended {
				if n := open(); n != 1 {
					t.Fatalf("%d upstream sessions open, want the one still in use", n)
				}
				wantSessionDenial(t, again, enforce.RuleSessionsSubject)
				if r := post(t, e.mcpURL(0), alice, methodBody(8, "tools/list", `{}`), http.Header{"Mcp-Session-Id": {id}}); r.Status != http.StatusOK {
					t.Fatalf("the session after its unknown method: %d %s, want it still served", r.Status, r.Body)
				}
				return
			}
			if again.Status != http.StatusOK {
				t.Fatalf("initialize after the session's 404: %d %s, want its slot freed", again.Status, again.Body)
			}
			if n := open(); n != 1 {
				t.Fatalf("%d upstream sessions open, want only the new one (the one whose slot was freed is ended upstream)", n)
			}
		})
	}
}

// An initialize sent inside a session is refused (400, -32600) before it
// is admitted: it took a second slot for the same upstream session (the Go
// SDK answers it 200 with that session's id), and the session's DELETE
// freed only the first, so the subject stayed a slot short until
// idle_timeout.
func TestInitializeInsideASessionIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{
		Upstream: upstream.Options{SessionTimeout: -1},
		Config:   "sessions: {max_per_subject: 2, idle_timeout: 1h}\n",
	})
	alice, id := aliceSession(t, e)
	re := post(t, e.mcpURL(0), alice, initializeBody, http.Header{"Mcp-Session-Id": {id}})
	if re.Status != http.StatusBadRequest || re.Msg.Error == nil || re.Msg.Error.Code != mcp.CodeInvalidRequest || string(re.Msg.ID) != "1" {
		t.Fatalf("initialize inside the session: %d %s, want 400 with -32600 for id 1", re.Status, re.Body)
	}
	if st := deleteSession(t, e, 0, alice, id); st/100 != 2 {
		t.Fatalf("DELETE of the session: %d", st)
	}
	for i := range 2 {
		if r := initialize(t, e, 0, alice); r.Status != http.StatusOK {
			t.Fatalf("initialize %d after the only session was deleted: %d %s (a slot is still held)", i, r.Status, r.Body)
		}
	}
}

// The upstream's 404 frees a session's slot only once the DELETE the
// gateway then sends has ended the session (2xx) or found it gone (404).
// MCP lets a server refuse a DELETE (405): the slot was freed whatever the
// DELETE's answer, and a subject capped at one session kept opening more,
// each left open upstream. A session kept that way stays tracked and
// served, and the idle sweep ends it.
func TestUpstream404FreesNoSlotWhenTheDeleteFails(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		status int // the upstream's answer to the gateway's DELETE
		freed  bool
	}{
		{name: "DELETE refused (405)", status: http.StatusMethodNotAllowed},
		{name: "DELETE failed (503)", status: http.StatusServiceUnavailable},
		{name: "session unknown to the DELETE (404)", status: http.StatusNotFound, freed: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			up := upstream.New(&upstream.Options{SessionTimeout: -1})
			var deletes atomic.Int64
			e, alice, id := oneSession(t, lostSessionUpstream(t, up, func(w http.ResponseWriter, r *http.Request) {
				deletes.Add(1)
				http.Error(w, http.StatusText(c.status), c.status)
			}))
			loseSession(t, e, alice, id, 7)
			again := initialize(t, e, 0, alice)
			if n := deletes.Load(); n != 1 {
				t.Fatalf("the upstream saw %d DELETEs, want the gateway's one", n)
			}
			if c.freed {
				if again.Status != http.StatusOK {
					t.Fatalf("initialize after the session was found gone: %d %s, want its slot freed", again.Status, again.Body)
				}
				return
			}
			wantSessionDenial(t, again, enforce.RuleSessionsSubject)
			if n := sessionsOn(up); n != 1 {
				t.Fatalf("%d upstream sessions open, want the one the upstream kept", n)
			}
			if r := post(t, e.mcpURL(0), alice, methodBody(8, "tools/list", `{}`), http.Header{"Mcp-Session-Id": {id}}); r.Status != http.StatusOK {
				t.Fatalf("the kept session: %d %s, want it still served", r.Status, r.Body)
			}
		})
	}
}

// A client's DELETE the upstream answers 404 frees the slot and goes
// upstream once: the session is gone there, and the gateway sent a second
// DELETE of it all the same.
func TestDeleteAnswered404IsNotSentAgain(t *testing.T) {
	t.Parallel()
	up := upstream.New(&upstream.Options{SessionTimeout: -1})
	var deletes atomic.Int64
	e, alice, id := oneSession(t, lostSessionUpstream(t, up, func(w http.ResponseWriter, r *http.Request) {
		deletes.Add(1)
		http.Error(w, "session not found", http.StatusNotFound)
	}))
	if st := deleteSession(t, e, 0, alice, id); st != http.StatusNotFound {
		t.Fatalf("DELETE: %d, want the upstream's 404", st)
	}
	if again := initialize(t, e, 0, alice); again.Status != http.StatusOK {
		t.Fatalf("initialize after the DELETE: %d %s, want the slot freed", again.Status, again.Body)
	}
	if n := deletes.Load(); n != 1 {
		t.Fatalf("the upstream saw %d DELETEs of the session, want the client's only", n)
	}
}

// The upstream's 404 reaches the client while the DELETE the gateway then
// sends is still held upstream, and that DELETE's answer, whenever it
// comes, frees the slot; the client's next initialize waits for it. The
// DELETE ran before the handler returned: the 404 waited for it, up to
// endTimeout, and a DELETE answered later than that was given up on.
func TestUpstream404IsAnsweredBeforeTheSessionEnds(t *testing.T) {
	t.Parallel()
	up := upstream.New(&upstream.Options{SessionTimeout: -1})
	var cut atomic.Bool
	gate, release := heldGate(t)
	e, alice, id := oneSession(t, lostSessionUpstream(t, up, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-gate:
			up.Handler().ServeHTTP(w, r)
		case <-r.Context().Done():
			cut.Store(true)
		}
	}))
	loseSession(t, e, alice, id, 7)
	release() // only now may the upstream answer the gateway's DELETE
	if again := initialize(t, e, 0, alice); again.Status != http.StatusOK {
		t.Fatalf("initialize once the upstream ended the lost session: %d %s, want its slot freed", again.Status, again.Body)
	}
	if cut.Load() || scrape(t, e.base[0])["mcpgate_upstream_sessions_ended_total"] != 1 {
		t.Fatal("the gateway gave up its DELETE before the upstream answered it: the 404 waited for the DELETE")
	}
	if n := sessionsOn(up); n != 1 {
		t.Fatalf("%d upstream sessions open, want only the new one", n)
	}
}

// Close waits for the DELETE of a session lost upstream (endLost), which
// runs after the client's 404: its outcome, and the slots it frees, land
// before the stores are closed.
func TestCloseWaitsForALostSessionsEnd(t *testing.T) {
	t.Parallel()
	up := upstream.New(&upstream.Options{SessionTimeout: -1})
	arrived := make(chan struct{}, 1)
	gate, release := heldGate(t)
	e, alice, id := oneSession(t, lostSessionUpstream(t, up, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-gate
		up.Handler().ServeHTTP(w, r)
	}))
	loseSession(t, e, alice, id, 7)
	<-arrived         // the gateway's DELETE is held upstream
	e.srvs[0].Close() // as a shutdown does: no request is in a handler any more
	closed := make(chan error, 1)
	go func() { closed <- e.gws[0].Close() }()
	release()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	e.gws[0].metrics.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if !strings.Contains(rec.Body.String(), "\nmcpgate_upstream_sessions_ended_total 1\n") {
		t.Fatal("Close returned before the DELETE of the lost session was answered")
	}
}

// Every request of a lost session gets the upstream's 404 at once, and one
// DELETE ends it: a DELETE per request would pile up against a slow
// upstream, the client no longer waiting for any of them.
func TestLostSessionIsDeletedOnce(t *testing.T) {
	t.Parallel()
	up := upstream.New(&upstream.Options{SessionTimeout: -1})
	var deletes atomic.Int64
	gate, release := heldGate(t)
	e, alice, id := oneSession(t, lostSessionUpstream(t, up, func(w http.ResponseWriter, r *http.Request) {
		deletes.Add(1)
		select {
		case <-gate:
		case <-r.Context().Done():
		}
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}))
	for i := range 20 {
		loseSession(t, e, alice, id, 100+i)
	}
	eventually(t, 10*time.Second, "the gateway's DELETE to reach the upstream", func() bool { return deletes.Load() > 0 })
	if n := deletes.Load(); n != 1 {
		t.Fatalf("20 requests of one lost session sent %d DELETEs while the first was unanswered, want 1", n)
	}
	release()
}
