package gateway

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/examples/upstream"
)

// REVIEW 1: an upstream that ends a session on its own (its session
// timeout, a restart: MCP says it then answers 404) leaves the session's
// slot taken for the whole sessions.idle_timeout. The client does what MCP
// tells it (start a new session) and is refused with 429 at the cap.
// A session the upstream ended (its own timeout, a restart) answers 404,
// and the client initializes again as MCP asks: the ended session's slot
// is freed at that 404, not held for the gateway's idle_timeout (a client
// capped at one session was locked out after every upstream restart).
func TestUpstreamEndedSessionFreesItsSlot(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{
		Upstream: upstream.Options{SessionTimeout: 300 * time.Millisecond},
		Config:   "sessions: {max_per_subject: 1, idle_timeout: 1h}\n",
	})
	alice := token(t, "acme", "alice")
	r := initialize(t, e, 0, alice)
	if r.Status != http.StatusOK || r.Header.Get("Mcp-Session-Id") == "" {
		t.Fatalf("initialize: %d %s", r.Status, r.Body)
	}
	id := r.Header.Get("Mcp-Session-Id")
	eventually(t, 10*time.Second, "the upstream ended the idle session", func() bool { return openSessions(e) == 0 })
	if r := post(t, e.mcpURL(0), alice, methodBody(2, "tools/list", `{}`), http.Header{"Mcp-Session-Id": {id}}); r.Status != http.StatusNotFound {
		t.Fatalf("request on the session the upstream ended: %d %s, want the upstream's 404", r.Status, r.Body)
	}
	// MCP: on 404 the client starts a new session.
	if r := initialize(t, e, 0, alice); r.Status != http.StatusOK {
		t.Fatalf("initialize after the upstream ended the session (404): %d %s; the ended session still holds the only slot", r.Status, r.Body)
	}
}

// slowInitUpstream answers initialize after delay (the session is created
// upstream at once, whatever the client of the gateway does meanwhile).
// slowInitUpstream is up with its answers to initialize delayed by delay.
func slowInitUpstream(t *testing.T, up *upstream.Server, delay time.Duration) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			up.Handler().ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !strings.Contains(string(body), `"initialize"`) {
			up.Handler().ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		up.Handler().ServeHTTP(rec, r.WithContext(context.WithoutCancel(r.Context())))
		time.Sleep(delay) // a slow upstream (or network): the client hangs up meanwhile
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// REVIEW 2: a client that hangs up while its initialize is being answered
// gets its slots back at once, but the session the upstream opened is
// neither tracked nor ended: with max_per_subject 1, one subject piles up
// upstream sessions that are never closed (not even after idle_timeout).
// A client that hangs up while the upstream is slow to answer initialize:
// the upstream opens the session all the same, and it is ended there, not
// left open outside the session cap (five hang-ups left five sessions
// for a subject capped at one).
func TestInitializeHangUpLeavesNoOrphanSession(t *testing.T) {
	t.Parallel()
	up := upstream.New(&upstream.Options{SessionTimeout: -1})
	e := newEnv(t, setup{
		UpstreamURL: slowInitUpstream(t, up, 400*time.Millisecond),
		Config:      "sessions: {max_per_subject: 1, idle_timeout: 1s}\n",
	})
	alice := token(t, "acme", "alice")
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		r, err := postCtx(ctx, e.mcpURL(0), alice, initializeBody, nil)
		cancel()
		if err == nil && r.Status != http.StatusTooManyRequests {
			t.Fatalf("the initialize was answered before the client hung up: %d", r.Status)
		}
		time.Sleep(500 * time.Millisecond) // the upstream answered meanwhile
	}
	open := func() int {
		n := 0
		for range up.MCPServer().Sessions() {
			n++
		}
		return n
	}
	// idle_timeout is 1s: any session the gateway knows of is ended by now.
	time.Sleep(3 * time.Second)
	if n := open(); n > 1 {
		t.Fatalf("%d upstream sessions open for one subject capped at 1 session, 3 idle_timeouts after the last initialize: orphaned, never ended", n)
	}
}

// REVIEW 3: sessions.idle_timeout is "live", but lowering it by a reload
// makes the tracker forget the idle sessions instead of ending them: the
// lease taken under the old, longer period is still held when the sweep
// checks it, which the sweep reads as "another instance renewed it". No
// instance tracks the session any more: it is never ended upstream, and
// its slot stays taken for the rest of the old period.
// A reload lowering sessions.idle_timeout: an idle session whose lease was
// taken under the longer period is ended once that lease lapses, not
// forgotten (the sweep read its own lease as another instance's renewal
// and dropped the session without ending it upstream).
func TestLoweredIdleTimeoutEndsIdleSessions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{
		Upstream: upstream.Options{SessionTimeout: -1},
		Config:   "sessions: {max_per_subject: 1, idle_timeout: 8s}\n",
	})
	aliceSession(t, e)
	e.apply(setup{Upstream: upstream.Options{SessionTimeout: -1}, Config: "sessions: {max_per_subject: 1, idle_timeout: 1s}\n"})
	// The old lease (8s) has lapsed by now, and the session has been idle
	// for 12 times the new idle_timeout.
	time.Sleep(12 * time.Second)
	if n := openSessions(e); n != 0 {
		t.Fatalf("%d upstream sessions still open 12s after a reload set idle_timeout to 1s: the idle session was forgotten, never ended", n)
	}
}

// REVIEW 4: a shutdown ends the server-initiated streams (EndStreams, as
// cli/serve.go registers it) so that it waits for calls only. The GET
// stream is ended; the subscriptions/listen POST of MCP 2026-07-28, the
// same kind of never-ending notification stream, is not: the shutdown
// waits out its whole grace for it.
// A graceful shutdown ends the notification streams that never end by
// themselves, the GET stream and MCP 2026-07-28's subscriptions/listen
// alike (the latter held every shutdown for its whole grace).
func TestShutdownEndsNotificationStreams(t *testing.T) {
	for _, c := range []struct {
		name string
		opts upstream.Options
		seen func(seenRequest) bool
	}{
		{"get-stream", upstream.Options{}, func(r seenRequest) bool { return r.Method == http.MethodGet }},
		{"subscriptions-listen", upstream.Options{Stateless: true}, func(r seenRequest) bool {
			return r.Method == http.MethodPost && r.Header.Get("Mcp-Method") == "subscriptions/listen"
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, setup{Upstream: c.opts})
			client := sdk.NewClient(&sdk.Implementation{Name: "review", Version: "1"}, &sdk.ClientOptions{
				ToolListChangedHandler: func(context.Context, *sdk.ToolListChangedRequest) {},
			})
			cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer ccancel()
			// A transport of its own without keep-alives: a pooled one can
			// dial a connection it then never uses, which Shutdown counts
			// as busy for 5 s (StateNew, Go issue 22682), longer than the
			// 3 s below.
			rt := &http.Transport{DisableKeepAlives: true}
			defer rt.CloseIdleConnections()
			cs, err := client.Connect(cctx, transport(e.mcpURL(0), bearer{token: token(t, "acme", "alice"), base: rt}), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			eventually(t, 10*time.Second, "the notification stream reached the upstream", func() bool {
				for _, r := range e.requests() {
					if c.seen(r) {
						return true
					}
				}
				return false
			})
			srv := e.srvs[0].Config
			srv.RegisterOnShutdown(e.gws[0].EndStreams)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			start := time.Now()
			if err := srv.Shutdown(ctx); err != nil {
				t.Fatalf("shutdown: %v after %v: an open notification stream held it", err, time.Since(start).Round(time.Millisecond))
			}
		})
	}
}

// A session whose last request named an MCP-Protocol-Version nobody speaks
// is still ended by the idle sweep: the sweep's DELETE carries the version
// the session negotiated, not the client's last header, which the go-sdk
// refuses (400). It carried that header, and freed the slot whatever the
// answer: a subject capped at one session piled up an upstream session,
// never closed, every idle_timeout.
func TestIdleSweepEndsSessionsInTheirNegotiatedVersion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{
		Upstream: upstream.Options{SessionTimeout: -1},
		Config:   "sessions: {max_per_subject: 1, idle_timeout: 1s}\n",
	})
	alice := token(t, "acme", "alice")
	const bogus = "2000-01-01"
	for i := range 4 {
		var sid string
		eventually(t, 20*time.Second, "the slot of the session before freed", func() bool {
			r := initialize(t, e, 0, alice)
			if r.Status != http.StatusOK && r.Status != http.StatusTooManyRequests {
				t.Fatalf("round %d: initialize: %d %s", i, r.Status, r.Body)
			}
			sid = r.Header.Get("Mcp-Session-Id")
			return r.Status == http.StatusOK
		})
		hdr := http.Header{"Mcp-Session-Id": {sid}}
		if r := post(t, e.mcpURL(0), alice, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, hdr); r.Status != http.StatusAccepted {
			t.Fatalf("initialized: %d %s", r.Status, r.Body)
		}
		hdr.Set("Mcp-Protocol-Version", bogus) // the session's last request
		if r := post(t, e.mcpURL(0), alice, methodBody(2, "tools/list", `{}`), hdr); r.Status/100 == 2 {
			t.Fatalf("round %d: a request naming MCP-Protocol-Version %s: %d, want the upstream's refusal", i, bogus, r.Status)
		}
	}
	eventually(t, 20*time.Second, "every idle session ended upstream", func() bool { return openSessions(e) == 0 })
	for _, r := range e.requests() {
		if r.Method == http.MethodDelete && r.Header.Get("Mcp-Protocol-Version") == bogus {
			t.Fatalf("the sweep's DELETE carried the client's MCP-Protocol-Version %s", bogus)
		}
	}
}
