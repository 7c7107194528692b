package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// An upstream answering with an event stream is cached from its final
// result: the miss is the upstream's stream (streamed to the caller whose
// load it is), hits are served as JSON, to raw clients and to the SDK's
// client.
func TestCacheSSEAnswers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: cacheConfig, Upstream: upstream.Options{Stateless: true}})
	tok := token(t, "acme", "alice")
	q := map[string]any{"query": "sse"}

	// The premise: the upstream answers this call with an event stream.
	direct := post(t, e.upURL, "", callBody(1, "search", map[string]any{"query": "premise"}), nil)
	if ct := direct.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("the upstream answered %q, not an event stream", ct)
	}
	var want json.RawMessage
	for i, src := range []string{"miss", "hit"} {
		r := e.callRaw(0, tok, i+10, "search", q)
		res := expectResult(t, src, r, src)
		wantCT, body := "application/json", r.Body
		if src == "miss" {
			wantCT, body = "text/event-stream", []byte(parseEvents(r.Body)[len(parseEvents(r.Body))-1].data)
		}
		if ct := r.Header.Get("Content-Type"); ct != wantCT {
			t.Fatalf("%s: Content-Type %q, want %s", src, ct, wantCT)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil || string(m["id"]) != fmt.Sprint(i+10) {
			t.Fatalf("%s: body is not one JSON-RPC response with id %d: %s", src, i+10, r.Body)
		}
		if want == nil {
			want = res
		} else if !bytes.Equal(res, want) {
			t.Fatalf("hit %s differs from the loaded %s", res, want)
		}
	}
	if got := e.up.Calls("search"); got != 2 {
		t.Fatalf("upstream saw %d search calls, want 2 (the direct one and the load)", got)
	}

	// The SDK's client, in a session with a stateful SSE upstream.
	e2 := newEnv(t, setup{Config: cacheConfig})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs := connect(t, e2.mcpURL(0), tok, "")
	var first *sdk.CallToolResult
	for i := range 3 {
		res, err := callTool(ctx, cs, "search", q)
		if err != nil || res.IsError {
			t.Fatalf("SDK call %d: %v %+v", i, err, res)
		}
		got, _ := json.Marshal(res.StructuredContent)
		if first == nil {
			first = res
		} else if want, _ := json.Marshal(first.StructuredContent); !bytes.Equal(got, want) {
			t.Fatalf("SDK call %d: %s, want %s", i, got, want)
		}
	}
	if got := e2.up.Calls("search"); got != 1 {
		t.Fatalf("SDK session: upstream saw %d search calls, want 1", got)
	}
}

// warmConfig warms one per-tenant entry and one shared entry.
const warmConfig = cacheConfig + `
cache:
  warm:
    - {tool: search, args: {query: "pricing"}, tenant: acme}
    - {tool: echo, args: {text: "hello"}}
`

// cache.warm entries are fetched at startup, before /readyz turns ready;
// the first client calls are hits.
func TestCacheWarmUp(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	var closeGate sync.Once
	open := func() { closeGate.Do(func() { close(gate) }) }
	t.Cleanup(open)
	up := jsonUpstream
	up.OnRequest = func(*http.Request) { <-gate }
	e := newEnv(t, setup{Config: warmConfig, Upstream: up})

	// The upstream is held: the gateway is not ready, and says why.
	for range 3 {
		r := get(t, e.base[0]+"/readyz", "")
		if r.Status != http.StatusServiceUnavailable || !strings.Contains(string(r.Body), "warming") {
			t.Fatalf("/readyz while warming: %d %s, want 503", r.Status, r.Body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r := get(t, e.base[0]+"/healthz", ""); r.Status != http.StatusOK {
		t.Fatalf("/healthz while warming: %d", r.Status)
	}
	open()
	eventually(t, 10*time.Second, "/readyz to turn ready", func() bool {
		return get(t, e.base[0]+"/readyz", "").Status == http.StatusOK
	})
	// Before any client call, the upstream saw each entry once, as the
	// gateway (its own credential, the tenant's identity).
	if s, c := e.up.Calls("search"), e.up.Calls("echo"); s != 1 || c != 1 {
		t.Fatalf("after warm-up the upstream saw %d search and %d echo calls, want 1 and 1", s, c)
	}
	tenants := map[string]bool{}
	for _, r := range e.requests() {
		if got := r.Header.Get("Authorization"); got != upstreamCredential {
			t.Fatalf("warm-up request with Authorization %q", got)
		}
		tenants[r.Header.Get("X-Mcp-Tenant")] = true
	}
	if !tenants["acme"] {
		t.Fatalf("no warm-up request carried X-Mcp-Tenant: acme (%v)", tenants)
	}

	acme := token(t, "acme", "alice")
	warmed := expectResult(t, "warmed search", e.callRaw(0, acme, 1, "search", map[string]any{"query": "pricing"}), "hit")
	expectResult(t, "warmed shared echo", e.callRaw(0, token(t, "globex", "gina"), 2, "echo", map[string]any{"text": "hello"}), "hit")
	loaded := expectResult(t, "another tenant's search", e.callRaw(0, token(t, "globex", "gina"), 3, "search", map[string]any{"query": "pricing"}), "miss")
	// The warm-up (the SDK's client) stores the result a gateway load stores.
	var a, b any
	if json.Unmarshal(warmed, &a) != nil || json.Unmarshal(loaded, &b) != nil || !reflect.DeepEqual(a, b) {
		t.Fatalf("warmed result %s differs from the loaded %s", warmed, loaded)
	}
	if s, c := e.up.Calls("search"), e.up.Calls("echo"); s != 2 || c != 1 {
		t.Fatalf("the upstream saw %d search and %d echo calls, want 2 and 1", s, c)
	}
}

// Two instances warming the same entries on one Redis fetch each entry
// once between them.
func TestCacheWarmUpSharedRedis(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: warmConfig, Instances: 2, CacheRedis: testenv.StartRedis(t, nil)})
	for i := range 2 {
		eventually(t, 10*time.Second, "/readyz to turn ready", func() bool {
			return get(t, e.base[i]+"/readyz", "").Status == http.StatusOK
		})
	}
	acme := token(t, "acme", "alice")
	for i := range 2 {
		r := e.callRaw(i, acme, i, "search", map[string]any{"query": "pricing"})
		if src := cacheSrc(r); src != "hit" && src != "coalesced" {
			t.Fatalf("instance %d: X-Mcp-Cache %q, want a hit (or coalesced with the other instance's warm-up): %s", i, src, r.Body)
		}
	}
	if s, c := e.up.Calls("search"), e.up.Calls("echo"); s != 1 || c != 1 {
		t.Fatalf("the upstream saw %d search and %d echo calls, want 1 and 1", s, c)
	}
}

// A cached answer is still behind authentication, scopes and limits: a
// denied call is denied, not served from the cache.
func TestCacheHitsPassAuthAndLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Upstream: jsonUpstream, Config: `
tools:
  search:
    cache: {ttl: 10m}
    limits:
      - {name: search_cap, per: tenant_tool, algorithm: fixed_window, limit: 3, period: 1h}
`})
	q := map[string]any{"query": "guarded"}
	acme := token(t, "acme", "alice")
	expectResult(t, "first", e.callRaw(0, acme, 1, "search", q), "miss")

	other := sign(t, claims("acme", "alice", "tools:search"))
	denied := []struct {
		what   string
		tok    string
		status int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"bad token", other[:len(other)-4] + "AAAA", http.StatusUnauthorized},
		{"expired token", sign(t, func() map[string]any {
			c := claims("acme", "alice", "tools:*")
			c["exp"] = time.Now().Add(-time.Hour).Unix()
			return c
		}()), http.StatusUnauthorized},
		{"tool out of scope", sign(t, claims("acme", "alice", "tools:echo")), http.StatusForbidden},
	}
	for _, d := range denied {
		r := e.callRaw(0, d.tok, 2, "search", q)
		if r.Status != d.status || r.Msg.Result != nil || cacheSrc(r) != "" {
			t.Fatalf("%s: %d %s (X-Mcp-Cache %q), want %d without the cached result", d.what, r.Status, r.Body, cacheSrc(r), d.status)
		}
	}
	// The limit counts hits: 3 admitted in all, then 429.
	expectResult(t, "second", e.callRaw(0, acme, 3, "search", q), "hit")
	expectResult(t, "third", e.callRaw(0, other, 4, "search", q), "hit")
	r := e.callRaw(0, acme, 5, "search", q)
	if r.Status != http.StatusTooManyRequests || r.Msg.Result != nil || cacheSrc(r) != "" {
		t.Fatalf("over the limit: %d %s (X-Mcp-Cache %q), want 429", r.Status, r.Body, cacheSrc(r))
	}
	if d := r.denial(t); d.Rule != "search_cap" {
		t.Fatalf("over the limit: rule %q", d.Rule)
	}
	if got := e.up.Calls("search"); got != 1 {
		t.Fatalf("upstream saw %d search calls, want 1", got)
	}
}

// Early refresh (XFetch) through the gateway: with a Beta so large that
// every hit refreshes, callers keep getting hits while the upstream is
// called again in the background.
func TestCacheEarlyRefreshKeepsServingHits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: cacheConfig, Upstream: jsonUpstream, CacheOptions: &cache.Options{Beta: 1e9}})
	tok := token(t, "acme", "alice")
	q := map[string]any{"query": "refresh"}
	want := expectResult(t, "first", e.callRaw(0, tok, 0, "search", q), "miss")
	for i := 1; i <= 20; i++ {
		r := e.callRaw(0, tok, i, "search", q)
		if got := expectResult(t, "refreshing hit", r, "hit"); !bytes.Equal(got, want) {
			t.Fatalf("hit %d: %s, want %s", i, got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	eventually(t, 5*time.Second, "background refreshes", func() bool { return e.up.Calls("search") >= 3 })
}

// Repeated identical calls after the first are hits and never reach the
// upstream. BenchmarkCacheHit measures this path.
func TestCacheRepeatedHitsSkipUpstream(t *testing.T) {
	t.Parallel()
	for _, m := range cacheModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := setup{Config: cacheConfig, Upstream: jsonUpstream}
			if m.redis {
				s.CacheRedis = testenv.StartRedis(t, nil)
			}
			e := newEnv(t, s)
			tok := token(t, "acme", "alice")
			q := map[string]any{"query": "repeat"}
			want := expectResult(t, "first", e.callRaw(0, tok, 0, "search", q), "miss")
			for i := 1; i <= 50; i++ {
				if got := expectResult(t, "repeat", e.callRaw(0, tok, i, "search", q), "hit"); !bytes.Equal(got, want) {
					t.Fatalf("hit %d: %s, want %s", i, got, want)
				}
			}
			if got := e.up.Calls("search"); got != 1 {
				t.Fatalf("upstream saw %d search calls, want 1 (the first load)", got)
			}
		})
	}
}

// An MCP 2026-07-28 "input_required" answer (the server asks the client for
// input, and the client calls again with it) is relayed, never stored, and
// the call carrying the input reaches the upstream. Callers that arrive
// while another caller's call is being asked get their own question (its
// request state is theirs), not a copy of the other caller's: every SDK
// client gets the answer to its own input.
func TestCacheInputRequiredIsNotCached(t *testing.T) {
	t.Parallel()
	var asked, answered atomic.Int64
	srv := sdk.NewServer(&sdk.Implementation{Name: "mrtr-upstream", Version: "1"}, nil)
	type askIn struct {
		Q string `json:"q"`
	}
	sdk.AddTool(srv, &sdk.Tool{Name: "ask", Description: "asks the caller to confirm"},
		func(_ context.Context, req *sdk.CallToolRequest, in askIn) (*sdk.CallToolResult, any, error) {
			subject := req.Extra.Header.Get("X-Mcp-Subject")
			resp, ok := req.Params.InputResponses["confirm"].(*sdk.ElicitResult)
			if !ok {
				asked.Add(1)
				time.Sleep(300 * time.Millisecond) // let concurrent callers pile up
				return &sdk.CallToolResult{
					InputRequests: sdk.InputRequestMap{"confirm": &sdk.ElicitParams{
						Mode: "form", Message: "confirm " + in.Q,
						RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"who": map[string]any{"type": "string"}}},
					}},
					RequestState: "for-" + subject,
				}, nil, nil
			}
			answered.Add(1)
			if req.Params.RequestState != "for-"+subject {
				return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{
					Text: fmt.Sprintf("%s retried with request state %q", subject, req.Params.RequestState)}}}, nil, nil
			}
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: fmt.Sprintf("%s confirmed by %v", in.Q, resp.Content["who"])}}}, nil, nil
		})
	up := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv },
		&sdk.StreamableHTTPOptions{Stateless: true, JSONResponse: true}))
	t.Cleanup(up.Close)
	e := newEnv(t, setup{UpstreamURL: up.URL, Config: `
tools:
  ask:
    cache: {ttl: 10m}
`})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	subjects := []string{"alice", "bob", "carol", "dave", "erin"}
	errs := make([]error, len(subjects))
	var wg sync.WaitGroup
	for i, who := range subjects {
		client := sdk.NewClient(&sdk.Implementation{Name: "gateway-test", Version: "1"}, &sdk.ClientOptions{
			ElicitationHandler: func(context.Context, *sdk.ElicitRequest) (*sdk.ElicitResult, error) {
				return &sdk.ElicitResult{Action: "accept", Content: map[string]any{"who": who}}, nil
			},
		})
		cs, err := client.Connect(ctx, transport(e.mcpURL(0), bearer{token: token(t, "acme", who)}), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		wg.Go(func() {
			res, err := callTool(ctx, cs, "ask", map[string]any{"q": "x"})
			switch {
			case err != nil:
				errs[i] = err
			case res.IsError || len(res.Content) != 1:
				b, _ := json.Marshal(res)
				errs[i] = fmt.Errorf("result %s", b)
			default:
				if txt, ok := res.Content[0].(*sdk.TextContent); !ok || txt.Text != "x confirmed by "+who {
					errs[i] = fmt.Errorf("%+v, want the answer to %s's input", res.Content[0], who)
				}
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("%s: %v", subjects[i], err)
		}
	}
	if a, b := asked.Load(), answered.Load(); a != int64(len(subjects)) || b != int64(len(subjects)) {
		t.Fatalf("upstream asked %d times and answered %d times, want %d and %d", a, b, len(subjects), len(subjects))
	}
}

// With the cache's Redis down, cacheable calls still work (loaded, not
// stored); once it is back, results are cached again.
func TestCacheStoreDownServesUncached(t *testing.T) {
	t.Parallel()
	redis := testenv.StartRedis(t, nil)
	e := newEnv(t, setup{Config: cacheConfig, Upstream: jsonUpstream, CacheRedis: redis,
		CacheOptions: &cache.Options{Timeout: cache.DefaultTimeout}})
	tok := token(t, "acme", "alice")
	q := map[string]any{"query": "down"}
	expectResult(t, "up", e.callRaw(0, tok, 1, "search", q), "miss")
	redis.Kill()
	for i := range 3 {
		start := time.Now()
		expectResult(t, "down", e.callRaw(0, tok, 2+i, "search", q), "miss")
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("call with the cache store down took %v", d)
		}
	}
	if got := e.up.Calls("search"); got != 4 {
		t.Fatalf("upstream saw %d search calls, want 4", got)
	}
	redis.Restart(t)
	eventually(t, 10*time.Second, "caching to resume", func() bool {
		return cacheSrc(e.callRaw(0, tok, 9, "search", q)) == "hit"
	})
}
