package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/examples/upstream"
)

// openSessions counts the sessions the upstream has open.
func openSessions(e *env) int {
	n := 0
	for range e.up.MCPServer().Sessions() {
		n++
	}
	return n
}

// methodBody is a request of method with params (a JSON object).
func methodBody(id int, method, params string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, id, method, params)
}

// initialize opens a raw session on instance i and returns the answer.
func initialize(t *testing.T, e *env, i int, tok string) *response {
	t.Helper()
	return post(t, e.mcpURL(i), tok, initializeBody, nil)
}

// deleteSession ends a session with a raw DELETE through instance i.
func deleteSession(t *testing.T, e *env, i int, tok, id string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodDelete, e.mcpURL(i), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Mcp-Session-Id", id)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	r, err := do(req)
	if err != nil {
		t.Fatal(err)
	}
	return r.Status
}

// wantSessionDenial checks a 429 of the session cap.
func wantSessionDenial(t *testing.T, r *response, rule string) {
	t.Helper()
	if r.Status != http.StatusTooManyRequests {
		t.Fatalf("initialize at the cap: %d %s, want 429", r.Status, r.Body)
	}
	scope := "tenant"
	if rule == enforce.RuleSessionsSubject {
		scope = "subject"
	}
	if d := r.denial(t); d.Scope != scope || d.Rule != rule {
		t.Fatalf("denial %+v, want scope %s, rule %s", d, scope, rule)
	}
	if ra, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Fatalf("Retry-After %q, want at least 1", r.Header.Get("Retry-After"))
	}
}

// With the default config (no rule names initialize), a tenant whose
// tools/call limit is spent still cannot open more than the default
// initialize rule allows: at most 10 of 50 initialize reach the upstream,
// the rest get 429.
func TestDefaultInitializeRuleCapsSessions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: `
tiers:
  free:
    limits:
      - {name: calls, algorithm: fixed_window, limit: 1, period: 1h}
`})
	tok := token(t, "acme", "alice")
	if r := e.callRaw(0, tok, 1, "echo", map[string]any{"text": "x"}); r.Status != http.StatusOK {
		t.Fatalf("first call: %d %s", r.Status, r.Body)
	}
	if r := e.callRaw(0, tok, 2, "echo", map[string]any{"text": "x"}); r.Status != http.StatusTooManyRequests {
		t.Fatalf("second call: %d, want 429 (the tools/call limit is spent)", r.Status)
	}
	admitted := 0
	for i := range 50 {
		// each from its own subject: the per-subject session cap (10) is
		// not what stops them
		r := initialize(t, e, 0, token(t, "acme", fmt.Sprint("agent", i)))
		switch r.Status {
		case http.StatusOK:
			admitted++
		case http.StatusTooManyRequests:
			if d := r.denial(t); d.Rule != "default_initialize" || d.Scope != "tenant" {
				t.Fatalf("denial %+v, want default_initialize per tenant", d)
			}
		default:
			t.Fatalf("initialize %d: %d %s", i, r.Status, r.Body)
		}
	}
	if admitted > 10 {
		t.Errorf("%d initialize admitted, want at most 10", admitted)
	}
	if got := e.up.Requests("initialize"); got != int64(admitted) {
		t.Errorf("upstream saw %d initialize, want the %d admitted", got, admitted)
	}
	if got := openSessions(e); got > 10 || got != admitted {
		t.Errorf("upstream has %d sessions open, want the %d admitted (at most 10)", got, admitted)
	}
}

// 250 concurrent requests of four methods under one rule of methods ["*"]
// with limit L: exactly L reach the upstream, the rest get 429; on one
// instance in memory and on two instances sharing Redis.
func TestEveryMethodCountedExactly(t *testing.T) {
	t.Parallel()
	const L, total = 37, 250
	for _, mode := range []struct {
		name      string
		redis     bool
		instances int
	}{{"memory", false, 1}, {"redis", true, 2}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			e := newLimitEnv(t, mode.redis, mode.instances, fmt.Sprintf(`
tiers:
  free:
    limits:
      - {name: everything, methods: ["*"], algorithm: fixed_window, limit: %d, period: 1h}
`, L), upstream.Options{Stateless: true, JSONResponse: true})
			tok := token(t, "acme", "alice")
			bodies := []string{
				methodBody(1, "tools/list", `{}`),
				methodBody(2, "ping", `{}`),
				methodBody(3, "resources/read", `{"uri":"file:///a"}`),
				methodBody(4, "prompts/get", `{"name":"greet"}`),
			}
			var ok, denied, other atomic.Int64
			run(8, total, func(i int) {
				r, err := postCtx(context.Background(), e.mcpURL(i), tok, bodies[i%len(bodies)], nil)
				switch {
				case err != nil:
					other.Add(1)
				case r.Status == http.StatusTooManyRequests:
					denied.Add(1)
				case r.Status == http.StatusOK:
					ok.Add(1)
				default:
					other.Add(1)
				}
			})
			reached := int64(0)
			for _, m := range []string{"tools/list", "ping", "resources/read", "prompts/get"} {
				reached += e.up.Requests(m)
			}
			if reached != L || ok.Load() != L || denied.Load() != total-L || other.Load() != 0 {
				t.Fatalf("upstream saw %d requests, gateway admitted %d, denied %d, other %d; want %d reached, %d denied",
					reached, ok.Load(), denied.Load(), other.Load(), L, total-L)
			}
		})
	}
}

// The session cap per subject: the fourth initialize is refused (nothing
// forwarded), another subject is not affected, and a DELETE through another
// instance frees a slot.
func TestSessionCapPerSubject(t *testing.T) {
	t.Parallel()
	for _, redis := range []bool{false, true} {
		t.Run(map[bool]string{false: "memory", true: "redis"}[redis], func(t *testing.T) {
			t.Parallel()
			instances := map[bool]int{false: 1, true: 2}[redis]
			e := newLimitEnv(t, redis, instances, `
sessions:
  max_per_subject: 3
  idle_timeout: 1h
`, upstream.Options{})
			alice := token(t, "acme", "alice")
			var ids []string
			for i := range 3 {
				r := initialize(t, e, 0, alice)
				if r.Status != http.StatusOK || r.Header.Get("Mcp-Session-Id") == "" {
					t.Fatalf("initialize %d: %d %s", i, r.Status, r.Body)
				}
				ids = append(ids, r.Header.Get("Mcp-Session-Id"))
			}
			wantSessionDenial(t, initialize(t, e, instances-1, alice), enforce.RuleSessionsSubject)
			if got := e.up.Requests("initialize"); got != 3 {
				t.Fatalf("upstream saw %d initialize, want 3 (the refused one is not forwarded)", got)
			}
			if r := initialize(t, e, 0, token(t, "acme", "bob")); r.Status != http.StatusOK {
				t.Fatalf("another subject: %d %s", r.Status, r.Body)
			}
			if st := deleteSession(t, e, instances-1, alice, ids[0]); st >= 300 {
				t.Fatalf("DELETE: %d", st)
			}
			if r := initialize(t, e, 0, alice); r.Status != http.StatusOK {
				t.Fatalf("initialize after a DELETE: %d %s", r.Status, r.Body)
			}
			wantSessionDenial(t, initialize(t, e, 0, alice), enforce.RuleSessionsSubject)
			if got := openSessions(e); got != 4 {
				t.Errorf("upstream has %d sessions open, want 4 (alice 3, bob 1)", got)
			}
		})
	}
}

// A session unused for idle_timeout is ended upstream by the gateway (a
// DELETE with the upstream's id) and its slot is freed; its id then gets
// 404.
func TestIdleSessionEnded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: `
sessions:
  max_per_subject: 1
  idle_timeout: 1s
`})
	alice := token(t, "acme", "alice")
	r := initialize(t, e, 0, alice)
	if r.Status != http.StatusOK {
		t.Fatalf("initialize: %d %s", r.Status, r.Body)
	}
	id := r.Header.Get("Mcp-Session-Id")
	wantSessionDenial(t, initialize(t, e, 0, alice), enforce.RuleSessionsSubject)
	eventually(t, 20*time.Second, "the idle session ended upstream", func() bool { return openSessions(e) == 0 })
	deletes := 0
	for _, s := range e.requests() {
		if s.Method == http.MethodDelete && s.Header.Get("Authorization") == upstreamCredential && s.Header.Get("Mcp-Session-Id") != "" {
			deletes++
		}
	}
	if deletes != 1 {
		t.Errorf("upstream saw %d DELETE with its session id and the upstream credential, want 1", deletes)
	}
	if r := post(t, e.mcpURL(0), alice, methodBody(2, "tools/list", `{}`), http.Header{"Mcp-Session-Id": {id}}); r.Status != http.StatusNotFound {
		t.Errorf("request on the ended session: %d, want 404", r.Status)
	}
	if r := initialize(t, e, 0, alice); r.Status != http.StatusOK {
		t.Fatalf("initialize after the idle end: %d %s (want the slot freed)", r.Status, r.Body)
	}
}

// A session in use keeps its slot past idle_timeout: its lease is renewed
// while it is used, so the cap still holds; once unused it is ended.
func TestSessionInUseKeepsItsSlot(t *testing.T) {
	t.Parallel()
	const idle = 2 * time.Second
	e := newEnv(t, setup{Config: `
sessions:
  max_per_subject: 1
  idle_timeout: 2s
`})
	alice := token(t, "acme", "alice")
	r := initialize(t, e, 0, alice)
	if r.Status != http.StatusOK {
		t.Fatalf("initialize: %d %s", r.Status, r.Body)
	}
	id := r.Header.Get("Mcp-Session-Id")
	// Use the session for three idle periods (the store's clock decides
	// the lease, so the duration matters, not its precision).
	for start := time.Now(); time.Since(start) < 3*idle; {
		if r := post(t, e.mcpURL(0), alice, methodBody(2, "ping", `{}`), http.Header{"Mcp-Session-Id": {id}}); r.Status != http.StatusOK {
			t.Fatalf("ping on the live session: %d %s", r.Status, r.Body)
		}
		time.Sleep(50 * time.Millisecond) // pacing, not synchronisation
	}
	wantSessionDenial(t, initialize(t, e, 0, alice), enforce.RuleSessionsSubject)
	eventually(t, 20*time.Second, "the session ended once unused", func() bool { return openSessions(e) == 0 })
}

// An upstream that refuses DELETE (405: MCP lets a server keep its
// sessions) keeps the session, so its slot stays taken: a client cannot
// DELETE and re-initialize its way past the cap.
func TestRefusedDeleteKeepsTheSlot(t *testing.T) {
	t.Parallel()
	up := upstream.New(nil)
	var deletes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			deletes.Add(1)
			w.Header().Set("Allow", "GET, POST")
			http.Error(w, "sessions end on their own", http.StatusMethodNotAllowed)
			return
		}
		up.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	e := newEnv(t, setup{UpstreamURL: srv.URL + "/mcp", Config: "sessions: {max_per_subject: 1, idle_timeout: 1h}\n"})
	alice := token(t, "acme", "alice")
	r := initialize(t, e, 0, alice)
	if r.Status != http.StatusOK || r.Header.Get("Mcp-Session-Id") == "" {
		t.Fatalf("initialize: %d %s", r.Status, r.Body)
	}
	if st := deleteSession(t, e, 0, alice, r.Header.Get("Mcp-Session-Id")); st != http.StatusMethodNotAllowed || deletes.Load() != 1 {
		t.Fatalf("DELETE: %d (upstream saw %d), want the upstream's 405", st, deletes.Load())
	}
	wantSessionDenial(t, initialize(t, e, 0, alice), enforce.RuleSessionsSubject)
}
