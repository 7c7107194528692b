package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/policy"
)

// echoGateway serves a gateway over one HTTP upstream (tool echo) under
// upstreams:, with the given sessions section, and returns it, its /mcp
// URL and the parser of its config under other sessions sections.
func echoGateway(t *testing.T, sessions string) (*Gateway, string, func(string) *policy.Config) {
	s := sdk.NewServer(&sdk.Implementation{Name: "a", Version: "1"}, nil)
	s.AddTool(&sdk.Tool{Name: "echo", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return textResult("ok"), nil
	})
	ts := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, nil))
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
		for ss := range s.Sessions() {
			_ = ss.Close()
		}
	})
	parse := func(sessions string) *policy.Config {
		y := fmt.Sprintf("upstreams:\n  - {name: a, url: %q}\nsessions: %s\n"+
			"auth:\n  jwt: {hs256_secret_env: MCPGATE_GATEWAY_TEST_SECRET, issuer: %s, audience: %s}\n",
			ts.URL+"/mcp", sessions, testIssuer, testAudience)
		cfg, err := policy.Parse("sessions.yaml", []byte(y))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	g := (&env{t: t}).newGateway(parse(sessions), setup{Logger: quietLogger()})
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	return g, srv.URL + "/mcp", parse
}

// The federation never ends a session the gateway keeps: its own timeout
// (go-sdk's, counting POSTs only) is a long backstop for sessions the
// gateway never saw end, not twice the idle_timeout the gateway started
// with. A client only listening on its GET stream uses its session for
// the gateway; a reload raising idle_timeout keeps idle sessions longer.
func TestFederationKeepsTheGatewaysSessions(t *testing.T) {
	t.Parallel()
	t.Run("listening on the GET stream", func(t *testing.T) {
		t.Parallel()
		g, url, _ := echoGateway(t, "{idle_timeout: 300ms}")
		cs := fedConnect(t, url, token(t, "acme", "alice"), "2025-11-25", nil)
		wantCall(t, cs, "a__echo", nil, "ok")
		testenv.Eventually(t, 10*time.Second, "the session tracked with its GET stream open", func() bool {
			g.tracker.mu.Lock()
			defer g.tracker.mu.Unlock()
			for _, e := range g.tracker.m {
				return len(g.tracker.m) == 1 && e.active == 1
			}
			return false
		})
		time.Sleep(time.Second) // past 2 × idle_timeout without a POST, listening
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if res, err := callTool(ctx, cs, "a__echo", nil); err != nil || res.IsError {
			t.Fatalf("a call after listening 1s on the session's GET stream (idle_timeout 300ms): %v %+v", err, res)
		}
	})
	t.Run("idle_timeout raised by a reload", func(t *testing.T) {
		t.Parallel()
		g, url, parse := echoGateway(t, "{idle_timeout: 300ms}")
		cfg := parse("{idle_timeout: 1m}")
		if err := g.Apply(cfg, authFor(t, cfg, nil)); err != nil {
			t.Fatal(err)
		}
		tok := token(t, "acme", "alice")
		r := post(t, url, tok, initializeBody, nil)
		sid := r.Header.Get("Mcp-Session-Id")
		if r.Status != http.StatusOK || sid == "" {
			t.Fatalf("initialize: %d %s", r.Status, r.Body)
		}
		hdr := http.Header{"Mcp-Session-Id": {sid}}
		post(t, url, tok, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, hdr)
		time.Sleep(time.Second) // idle: past 2 × the first idle_timeout, well under the 1m in force
		if r = post(t, url, tok, callBody(2, "a__echo", nil), hdr); r.Status != http.StatusOK || r.Msg.Error != nil {
			t.Fatalf("a call 1s after the last, under idle_timeout 1m: %d %s", r.Status, r.Body)
		}
	})
}

// The sweep pings in the federation each session it keeps, in use or not,
// once every touchEvery (a POST, the only request the go-sdk's session
// timer counts), and comes often enough for that whatever idle_timeout a
// reload set; a session it ends, or one pinged less than touchEvery ago, is
// not pinged.
func TestSweepTouchesKeptSessionsInTheFederation(t *testing.T) {
	var mu sync.Mutex
	var seen []string // method, session, JSON-RPC method
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var m struct {
			Method string `json:"method"`
		}
		_ = json.Unmarshal(body, &m)
		mu.Lock()
		seen = append(seen, r.Method+" "+r.Header.Get("Mcp-Session-Id")+" "+m.Method)
		mu.Unlock()
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

	const backstop = 24 * time.Hour
	cfg := &policy.Config{}
	cfg.Upstream.URL = fake.URL + "/mcp"
	g := &Gateway{log: quietLogger(), metrics: metrics.New(),
		fed: &federation{rt: &http.Transport{}, sessionTimeout: backstop}}
	g.rt.Store(&runtime{cfg: cfg})
	tr := newSessionTracker(g, 0)
	now := time.Unix(1_000_000, 0)
	tr.now = func() time.Time { return now }
	p := auth.Principal{Tenant: "acme", Subject: "alice"}
	tr.add("listening", p, enforce.SessionSlots{}, "2025-11-25", false)
	tr.use("listening", p, enforce.SessionSlots{}) // its GET stream, open throughout
	tr.add("idle", p, enforce.SessionSlots{}, "2025-11-25", false)

	if every := tr.sweepEvery(48 * time.Hour); every != backstop/8 {
		t.Fatalf("sweeps every %v under idle_timeout 48h, want %v (the federation's timeout / 8)", every, backstop/8)
	}
	ctx := context.Background()
	for _, step := range []struct {
		after time.Duration
		idle  time.Duration // the idle_timeout in force
		want  []string
	}{
		{0, 48 * time.Hour, nil}, // first met: none pinged
		{3 * time.Hour, 48 * time.Hour, nil},
		{3 * time.Hour, 48 * time.Hour, []string{"POST idle ping", "POST listening ping"}},
		{time.Hour, 48 * time.Hour, nil}, // pinged an hour ago
		{5 * time.Hour, 48 * time.Hour, []string{"POST idle ping", "POST listening ping"}},
		// idle_timeout lowered: "idle" is ended, not pinged.
		{6 * time.Hour, time.Hour, []string{"DELETE idle ", "POST listening ping"}},
	} {
		now = now.Add(step.after)
		tr.sweep(ctx, step.idle)
		if got := takeSeen(); !slices.Equal(got, step.want) {
			t.Fatalf("sweep %v later (idle_timeout %v): the federation got %q, want %q", step.after, step.idle, got, step.want)
		}
	}
}
