package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// echoingUpstream is the demo upstream behind a handler that repeats the
// request's Mcp-Session-Id on every answer, as the TypeScript SDK's server
// does on its event-stream answers and GET streams (and its client adopts
// each id it is given). rename, when set, answers with a session id of its
// own instead (an upstream that changed the session mid-way).
func echoingUpstream(t *testing.T, rename func(id string) string) string {
	t.Helper()
	up := upstream.New(&upstream.Options{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get("Mcp-Session-Id"); id != "" {
			if rename != nil {
				id = rename(id)
			}
			w.Header().Set("Mcp-Session-Id", id)
		}
		up.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// openGETStream opens the server-initiated stream of session id through
// instance i and returns its answer's Mcp-Session-Id, closing the stream.
func openGETStream(t *testing.T, e *env, i int, tok, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.mcpURL(i), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", id)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET stream: %d", resp.StatusCode)
	}
	return resp.Header.Get("Mcp-Session-Id")
}

// TestEchoedSessionIDKeepsItsLease: an upstream repeating the session id of
// a request (on a POST's answer or a GET stream) gives the client back its
// id as it sent it, the slot's lease included. Were it wrapped again
// without the lease, a client adopting it would end the session through
// another instance without freeing its slot: the subject would stay at
// sessions.max_per_subject until idle_timeout.
func TestEchoedSessionIDKeepsItsLease(t *testing.T) {
	e := newEnv(t, setup{
		Config:      storeYAML(true) + "sessions:\n  max_per_subject: 1\n  idle_timeout: 1h\n",
		Redis:       testenv.StartRedis(t, nil),
		Instances:   2,
		UpstreamURL: echoingUpstream(t, nil),
	})
	alice := token(t, "acme", "alice")
	r := initialize(t, e, 0, alice)
	if r.Status != http.StatusOK {
		t.Fatalf("initialize: %d %s", r.Status, r.Body)
	}
	id := r.Header.Get("Mcp-Session-Id")
	if _, lease, ok := e.gws[0].sessions.unwrap(principal("acme", "alice"), id); !ok || lease == "" {
		t.Fatalf("initialize gave %q: not a leased id", id)
	}
	// The session is used through instance 0 only, each answer checked on
	// its own; the client adopts the last id it was given, as the
	// TypeScript SDK's does, and ends the session through instance 1,
	// which learns of its lease from nothing but that DELETE's id.
	session, last := http.Header{"Mcp-Session-Id": {id}}, id
	answered := func(what, got string) {
		t.Helper()
		if got != "" && got != id {
			t.Errorf("%s answered session id %q, want the client's %q (its lease kept)", what, got, id)
		}
		if got != "" {
			last = got
		}
	}
	r = post(t, e.mcpURL(0), alice, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, session)
	if r.Status != http.StatusAccepted {
		t.Fatalf("initialized: %d %s", r.Status, r.Body)
	}
	answered("notifications/initialized", r.Header.Get("Mcp-Session-Id"))
	answered("the GET stream", openGETStream(t, e, 0, alice, id))
	r = post(t, e.mcpURL(0), alice, methodBody(2, "tools/list", `{}`), session)
	if r.Status != http.StatusOK {
		t.Fatalf("tools/list: %d %s", r.Status, r.Body)
	}
	answered("tools/list", r.Header.Get("Mcp-Session-Id"))
	req, err := http.NewRequest(http.MethodDelete, e.mcpURL(1), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+alice)
	req.Header.Set("Mcp-Session-Id", last)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	d, err := do(req)
	if err != nil {
		t.Fatal(err)
	}
	if d.Status >= 300 {
		t.Fatalf("DELETE through instance 1: %d %s", d.Status, d.Body)
	}
	answered("the DELETE", d.Header.Get("Mcp-Session-Id"))
	r = initialize(t, e, 0, alice)
	if r.Status == http.StatusTooManyRequests {
		wantSessionDenial(t, r, enforce.RuleSessionsSubject)
		t.Errorf("after ending its only session, alice is still at her session cap (slot leaked until idle_timeout)")
	} else if r.Status != http.StatusOK {
		t.Fatalf("initialize after the DELETE: %d %s", r.Status, r.Body)
	}
}

// TestNewUpstreamSessionIDHasNoLease: an answer naming another session than
// the request's gets it bound to the caller, without the request's lease
// (that lease is the slot of the session the request named, and the new
// session was not opened by an admitted initialize).
func TestNewUpstreamSessionIDHasNoLease(t *testing.T) {
	e := newEnv(t, setup{
		Config:      "sessions:\n  max_per_subject: 1\n  idle_timeout: 1h\n",
		UpstreamURL: echoingUpstream(t, func(id string) string { return "other-" + id }),
	})
	alice, p := token(t, "acme", "alice"), principal("acme", "alice")
	r := initialize(t, e, 0, alice)
	if r.Status != http.StatusOK {
		t.Fatalf("initialize: %d %s", r.Status, r.Body)
	}
	id := r.Header.Get("Mcp-Session-Id")
	upstreamID, lease, ok := e.gws[0].sessions.unwrap(p, id)
	if !ok || lease == "" {
		t.Fatalf("initialize gave %q: not a leased id", id)
	}
	r = post(t, e.mcpURL(0), alice, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, http.Header{"Mcp-Session-Id": {id}})
	got := r.Header.Get("Mcp-Session-Id")
	if got == "" {
		t.Fatalf("the answer has no session id (%d %s)", r.Status, r.Body)
	}
	if want := e.gws[0].sessions.wrap(p, "other-"+upstreamID); got != want {
		t.Errorf("a new upstream session came back as %q, want %q (bound, no lease)", got, want)
	}
}
