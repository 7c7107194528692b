package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

func principal(tenant, subject string) auth.Principal {
	return auth.Principal{Tenant: tenant, Subject: subject}
}

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

// TestSessionsAreBoundToTheirCaller: a session id opened by one caller is
// refused (404, nothing forwarded) for any other caller, on any instance,
// and the upstream's raw id is never accepted from a client.
func TestSessionsAreBoundToTheirCaller(t *testing.T) {
	// The instances share the store: a session opened through one holds
	// its slot where the other finds it (enter).
	e := newEnv(t, setup{Instances: 2, Redis: testenv.StartRedis(t, nil), Config: storeYAML(true)})
	alice := token(t, "acme", "alice")
	resp := post(t, e.mcpURL(0), alice, initializeBody, nil)
	if resp.Status != http.StatusOK {
		t.Fatalf("initialize: %d %s", resp.Status, resp.Body)
	}
	clientID := resp.Header.Get("Mcp-Session-Id")
	dot := strings.LastIndexByte(clientID, '.')
	upstreamID := clientID[:max(dot, 0)]
	if dot <= 0 {
		t.Fatalf("session id %q is not bound (no mac)", clientID)
	}
	for _, r := range e.requests() {
		if id := r.Header.Get("Mcp-Session-Id"); id != "" && id != upstreamID {
			t.Fatalf("the upstream saw session id %q, want its own %q", id, upstreamID)
		}
	}

	session := func(id string) http.Header {
		return http.Header{"Mcp-Session-Id": {id}}
	}
	initialized := `{"jsonrpc":"2.0","method":"notifications/initialized"}`
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	if r := post(t, e.mcpURL(0), alice, initialized, session(clientID)); r.Status != http.StatusAccepted {
		t.Fatalf("initialized notification: %d %s", r.Status, r.Body)
	}
	// the owner, on either instance (they share the key)
	for i := range 2 {
		if r := post(t, e.mcpURL(i), alice, list, session(clientID)); r.Status != http.StatusOK || r.Msg.Result == nil {
			t.Fatalf("owner on instance %d: %d %s", i, r.Status, r.Body)
		}
	}

	before := len(e.requests())
	for name, c := range map[string]struct {
		tok, id string
	}{
		"another tenant":               {token(t, "globex", "alice"), clientID},
		"another subject, same tenant": {token(t, "acme", "mallory"), clientID},
		"the upstream's raw id":        {alice, upstreamID},
		"a forged mac":                 {alice, upstreamID + ".AAAAAAAAAAAAAAAAAAAAAA"},
	} {
		r := post(t, e.mcpURL(1), c.tok, list, session(c.id))
		if r.Status != http.StatusNotFound {
			t.Errorf("%s: status %d, want 404 (%s)", name, r.Status, r.Body)
		}
	}
	if after := len(e.requests()); after != before {
		t.Fatalf("refused session requests reached the upstream: %d new requests", after-before)
	}
	// DELETE and GET are bound too.
	for _, method := range []string{http.MethodDelete, http.MethodGet} {
		req, _ := http.NewRequest(method, e.mcpURL(0), nil)
		req.Header.Set("Authorization", "Bearer "+token(t, "globex", "eve"))
		req.Header.Set("Mcp-Session-Id", clientID)
		req.Header.Set("Accept", "text/event-stream")
		r, err := do(req)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != http.StatusNotFound {
			t.Errorf("%s with another caller's session: %d, want 404", method, r.Status)
		}
	}
	if r := post(t, e.mcpURL(0), alice, list, session(clientID)); r.Status != http.StatusOK {
		t.Fatalf("the session was harmed by the refused attempts: %d", r.Status)
	}
}

func TestSessionBinderRoundTrip(t *testing.T) {
	b := newSessionBinder([]byte("k"))
	other := newSessionBinder([]byte("other key"))
	p := principal("t", "s")
	id := b.wrap(p, "abc.def")
	if got, _, ok := b.unwrap(p, id); !ok || got != "abc.def" {
		t.Fatalf("unwrap(wrap) = %q, %v", got, ok)
	}
	for _, bad := range []string{"", "abc.def", id + "x", id[:len(id)-1], "." + id[len(id)-sessionMACLen:]} {
		if _, _, ok := b.unwrap(p, bad); ok {
			t.Errorf("unwrap(%q) accepted", bad)
		}
	}
	if _, _, ok := other.unwrap(p, id); ok {
		t.Error("an id bound with another key was accepted")
	}
	if _, _, ok := b.unwrap(principal("t", "s2"), id); ok {
		t.Error("another subject's id was accepted")
	}
	// tenant/subject boundaries cannot be shifted
	if _, _, ok := b.unwrap(principal("ts", ""), b.wrap(principal("t", "s"), "x")); ok {
		t.Error("tenant+subject concatenation is ambiguous")
	}
}

// TestSessionBinderLease: the lease form round-trips, binds the lease (no
// caller can swap in another lease, or strip it to pass as the old form),
// and ids of the old form stay valid.
func TestSessionBinderLease(t *testing.T) {
	b := newSessionBinder([]byte("k"))
	p := principal("t", "s")
	id := b.wrapLease(p, "abc.def", "0123abcd")
	if got, lease, ok := b.unwrap(p, id); !ok || got != "abc.def" || lease != "0123abcd" {
		t.Fatalf("unwrap(wrapLease) = %q, %q, %v", got, lease, ok)
	}
	mac := id[len(id)-sessionMACLen:]
	for _, bad := range []string{
		"abc.def.0123abce." + mac, // another lease
		"abc.def." + mac,          // lease stripped
		"abc.def0123abcd." + mac,  // boundary moved
		"abc.def.." + mac,         // empty lease
	} {
		if _, _, ok := b.unwrap(p, bad); ok {
			t.Errorf("unwrap(%q) accepted", bad)
		}
	}
	if _, _, ok := b.unwrap(principal("t", "s2"), id); ok {
		t.Error("another subject's id was accepted")
	}
	old := b.wrap(p, "abc.def.0123abcd")
	if got, lease, ok := b.unwrap(p, old); !ok || got != "abc.def.0123abcd" || lease != "" {
		t.Errorf("old form: unwrap = %q, %q, %v", got, lease, ok)
	}
	if got := b.wrapLease(p, "x", ""); got != b.wrap(p, "x") {
		t.Errorf("wrapLease without a lease = %q, want the old form", got)
	}
}

// Without a shared store the in-process store decides, and a session id
// carries its slots' lease all the same: a DELETE frees them even when
// this instance does not track the session (its tracker is full).
func TestMemoryOnlySessionIDCarriesLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: "sessions: {max_per_subject: 1, idle_timeout: 1h}\n"})
	e.gws[0].tracker.mu.Lock()
	e.gws[0].tracker.max = 0 // full: the session is not tracked
	e.gws[0].tracker.mu.Unlock()
	alice := token(t, "acme", "alice")
	r := initialize(t, e, 0, alice)
	if r.Status != http.StatusOK {
		t.Fatalf("initialize: %d %s", r.Status, r.Body)
	}
	if st := deleteSession(t, e, 0, alice, r.Header.Get("Mcp-Session-Id")); st >= 300 {
		t.Fatalf("DELETE: %d", st)
	}
	if r := initialize(t, e, 0, alice); r.Status != http.StatusOK {
		t.Fatalf("initialize after the DELETE: %d %s (the slot was not freed)", r.Status, r.Body)
	}
}
