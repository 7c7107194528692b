package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// storeModes are the limit stores every limits test runs against: the
// in-process store with one gateway, and a real redis-server shared by two
// gateways (callers spread across both).
var storeModes = []struct {
	name      string
	redis     bool
	instances int
}{
	{"memory", false, 1},
	{"redis-2-instances", true, 2},
}

// storeYAML is the store section of a mode; the generous timeout keeps a
// busy test machine from turning decisions into failures (on_error: closed
// would make any such failure visible as a 503).
func storeYAML(redis bool) string {
	if !redis {
		return ""
	}
	return "store:\n  redis: \"" + redisPlaceholder + "\"\n  timeout: 2s\n  on_error: closed\n"
}

// newLimitEnv starts an environment for a store mode.
func newLimitEnv(t *testing.T, redis bool, instances int, cfg string, up upstream.Options) *env {
	t.Helper()
	s := setup{Config: storeYAML(redis) + cfg, Upstream: up, Instances: instances}
	if redis {
		s.Redis = testenv.StartRedis(t, nil)
	}
	return newEnv(t, s)
}

// N concurrent SDK callers, limit L: exactly L calls reach the upstream, the
// rest get 429, on the memory store and on Redis shared by two gateways.
func TestExactAdmission(t *testing.T) {
	t.Parallel()
	const (
		limit   = 37
		calls   = 300
		workers = 64
		clients = 8
	)
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newLimitEnv(t, m.redis, m.instances, `
tools:
  echo:
    limits:
      - {name: echo_cap, per: tenant_tool, algorithm: fixed_window, limit: 37, period: 1h}
`, upstream.Options{})
			tok := token(t, "acme", "alice")
			sessions := make([]*sdk.ClientSession, clients)
			for i := range sessions {
				sessions[i] = connect(t, e.mcpURL(i), tok, "")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var ok, limited atomic.Int64
			var mu sync.Mutex
			var other []error
			run(workers, calls, func(i int) {
				_, err := callTool(ctx, sessions[i%clients], "echo", map[string]any{"text": strconv.Itoa(i)})
				switch {
				case err == nil:
					ok.Add(1)
				case isRateLimited(err):
					limited.Add(1)
				default:
					mu.Lock()
					other = append(other, err)
					mu.Unlock()
				}
			})
			if len(other) > 0 {
				t.Fatalf("%d calls failed otherwise, first: %v", len(other), other[0])
			}
			if ok.Load() != limit || limited.Load() != calls-limit {
				t.Fatalf("admitted %d, rate-limited %d; want %d and %d", ok.Load(), limited.Load(), limit, calls-limit)
			}
			if got := e.up.Calls("echo"); got != limit {
				t.Fatalf("upstream saw %d echo calls, want exactly %d", got, limit)
			}
		})
	}
}

// Exact admission for every algorithm, on Redis shared by two gateways and
// in memory, with raw concurrent requests. The tier claim selects the tier
// whose rule uses the algorithm.
func TestExactAdmissionAlgorithms(t *testing.T) {
	t.Parallel()
	const (
		limit   = 20
		calls   = 90
		workers = 32
	)
	algos := []string{"fixed_window", "sliding_window", "sliding_window_counter", "token_bucket", "gcra"}
	var cfg strings.Builder
	cfg.WriteString("default_tier: fixed_window\ntiers:\n")
	for _, a := range algos {
		// Long periods: the refill of token_bucket and gcra over the test's
		// few seconds stays below one unit.
		fmt.Fprintf(&cfg, "  %s:\n    limits:\n      - {name: cap, per: tenant, algorithm: %s, limit: %d, period: 24h}\n", a, a, limit)
	}
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newLimitEnv(t, m.redis, m.instances, cfg.String(), upstream.Options{Stateless: true, JSONResponse: true})
			for _, a := range algos {
				tok := sign(t, with(claims("tenant-"+a, "alice", "tools:*"), "tier", a))
				var ok, limited atomic.Int64
				var mu sync.Mutex
				var bad []string
				run(workers, calls, func(i int) {
					r, err := postCtx(context.Background(), e.mcpURL(i), tok, callBody(i, "search", map[string]any{"query": a}), nil)
					switch {
					case err != nil:
						mu.Lock()
						bad = append(bad, err.Error())
						mu.Unlock()
					case r.Status == http.StatusOK && r.Msg.Result != nil:
						ok.Add(1)
					case r.Status == http.StatusTooManyRequests && r.code() == CodeRateLimited:
						limited.Add(1)
					default:
						mu.Lock()
						bad = append(bad, fmt.Sprintf("%d %s", r.Status, r.Body))
						mu.Unlock()
					}
				})
				if len(bad) > 0 {
					t.Fatalf("%s: %d unexpected answers, first: %s", a, len(bad), bad[0])
				}
				if ok.Load() != limit || limited.Load() != calls-limit {
					t.Fatalf("%s: admitted %d, rate-limited %d; want %d and %d", a, ok.Load(), limited.Load(), limit, calls-limit)
				}
			}
			if got := e.up.Calls("search"); got != int64(limit*len(algos)) {
				t.Fatalf("upstream saw %d search calls, want %d", got, limit*len(algos))
			}
		})
	}
}

// When a global rule denies, the tenant's counters are refunded: the denied
// calls cost the tenant nothing, and once the global rule admits again the
// tenant has its whole limit.
func TestGlobalDenialRefundsTenant(t *testing.T) {
	t.Parallel()
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newLimitEnv(t, m.redis, m.instances, `
tools:
  echo:
    limits:
      - {name: echo_cap, per: tenant_tool, algorithm: fixed_window, limit: 3, period: 1h}
global:
  - {name: one_in_flight, algorithm: concurrency, limit: 1, period: 1m}
`, upstream.Options{Stateless: true})
			// Tenant A holds the only global slot with a call that runs
			// until released.
			release := make(chan struct{})
			free := sync.OnceFunc(func() { close(release) })
			t.Cleanup(free)
			sdk.AddTool(e.up.MCPServer(), &sdk.Tool{Name: "hold"}, func(context.Context, *sdk.CallToolRequest, struct{}) (*sdk.CallToolResult, any, error) {
				<-release
				return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "released"}}}, nil, nil
			})
			csA := connect(t, e.mcpURL(0), token(t, "tenant-a", "a"), "")
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = callTool(context.Background(), csA, "hold", map[string]any{})
			}()
			eventually(t, 5*time.Second, "the held call to reach the upstream", func() bool { return e.up.Calls("hold") == 1 })

			// Tenant B: every call denied by the global rule, never by its own.
			b := token(t, "tenant-b", "b")
			for i := range 5 {
				r := e.callRaw(i, b, i, "echo", map[string]any{"text": "x"})
				if r.Status != http.StatusTooManyRequests {
					t.Fatalf("call %d while the global slot is held: %d %s", i, r.Status, r.Body)
				}
				if d := r.denial(t); d.Scope != "global" || d.Rule != "one_in_flight" {
					t.Fatalf("call %d denied by %+v, want the global rule (a tenant denial means the tenant was charged)", i, d)
				}
			}
			// A's call ends: its slot frees.
			free()
			<-done
			eventually(t, 5*time.Second, "the global slot to free", func() bool {
				r := e.callRaw(0, token(t, "tenant-c", "c"), 0, "echo", map[string]any{"text": "probe"})
				return r.Status == http.StatusOK
			})
			// B still has all 3 of its calls.
			var statuses []int
			for i := range 5 {
				r := e.callRaw(i, b, 100+i, "echo", map[string]any{"text": "x"})
				statuses = append(statuses, r.Status)
				if r.Status == http.StatusTooManyRequests {
					if d := r.denial(t); d.Scope != "tenant_tool" || d.Rule != "echo_cap" {
						t.Fatalf("denied by %+v, want echo_cap", d)
					}
				}
			}
			if want := []int{200, 200, 200, 429, 429}; !slices.Equal(statuses, want) {
				t.Fatalf("tenant B after the global denials: %v, want %v (the denials were not refunded)", statuses, want)
			}
		})
	}
}

// The 429 contract, to the letter, on admitted and denied calls, with string
// and number ids, from the store and from the local denial cache.
func TestRateLimitContract(t *testing.T) {
	t.Parallel()
	policyRE := regexp.MustCompile(`^"per_tool";r=(\d+);t=(\d+)$`)
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			// The tier of the contract's example configuration.
			e := newLimitEnv(t, m.redis, m.instances, `
default_tier: free
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: token_bucket, limit: 30, period: 1m, burst: 20}
      - {name: per_tool, per: tenant_tool, algorithm: sliding_window, limit: 10, period: 1m}
`, upstream.Options{Stateless: true, JSONResponse: true})
			tok := token(t, "acme", "alice")
			checkCommon := func(r *response, remaining int64) {
				t.Helper()
				now := time.Now().Unix()
				if got := intHeader(t, r.Header, "X-RateLimit-Limit"); got != 10 {
					t.Errorf("X-RateLimit-Limit %d, want 10", got)
				}
				if got := intHeader(t, r.Header, "X-RateLimit-Remaining"); got != remaining {
					t.Errorf("X-RateLimit-Remaining %d, want %d", got, remaining)
				}
				if reset := intHeader(t, r.Header, "X-RateLimit-Reset"); reset <= now || reset > now+61 {
					t.Errorf("X-RateLimit-Reset %d: want Unix seconds in (now, now+61], now is %d", reset, now)
				}
				if got := r.Header.Get("RateLimit-Policy"); got != `"per_tool";q=10;w=60` {
					t.Errorf(`RateLimit-Policy %q, want "per_tool";q=10;w=60`, got)
				}
				sm := policyRE.FindStringSubmatch(r.Header.Get("RateLimit"))
				if sm == nil {
					t.Fatalf("RateLimit %q, want \"per_tool\";r=N;t=N", r.Header.Get("RateLimit"))
				}
				if sm[1] != strconv.FormatInt(remaining, 10) {
					t.Errorf("RateLimit r=%s, want %d", sm[1], remaining)
				}
				if tt, _ := strconv.Atoi(sm[2]); tt < 1 || tt > 60 {
					t.Errorf("RateLimit t=%d, want 1..60", tt)
				}
			}
			for i := 1; i <= 10; i++ {
				r := e.callRaw(i, tok, i, "echo", map[string]any{"text": "x"})
				if r.Status != http.StatusOK || r.Msg.Result == nil {
					t.Fatalf("call %d: %d %s", i, r.Status, r.Body)
				}
				checkCommon(r, int64(10-i))
			}
			for _, id := range []any{"req-abc", 42, "", 0, -7} {
				r := e.callRaw(0, tok, id, "echo", map[string]any{"text": "x"})
				if r.Status != http.StatusTooManyRequests {
					t.Fatalf("id %#v: status %d, want 429: %s", id, r.Status, r.Body)
				}
				checkCommon(r, 0)
				ra := intHeader(t, r.Header, "Retry-After")
				if ra < 1 || ra > 60 {
					t.Fatalf("Retry-After %d, want whole seconds in 1..60", ra)
				}
				if ct := r.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("Content-Type %q", ct)
				}
				wantID, _ := json.Marshal(id)
				if r.Msg.JSONRPC != "2.0" || string(r.Msg.ID) != string(wantID) || r.code() != -33029 {
					t.Fatalf("body %s: want jsonrpc 2.0, id %s, code -33029", r.Body, wantID)
				}
				var data map[string]json.RawMessage
				_ = json.Unmarshal(r.Msg.Error.Data, &data)
				for _, k := range []string{"scope", "rule", "limit", "remaining", "retry_after_seconds"} {
					if _, ok := data[k]; !ok {
						t.Fatalf("error data %s lacks %s", r.Msg.Error.Data, k)
					}
				}
				d := r.denial(t)
				if d != (denied{Scope: "tenant_tool", Rule: "per_tool", Limit: 10, Remaining: 0, RetryAfterSeconds: ra}) {
					t.Fatalf("error data %+v (Retry-After %d)", d, ra)
				}
			}
			if got := e.up.Calls("echo"); got != 10 {
				t.Fatalf("upstream saw %d calls, want 10", got)
			}
		})
	}
}

// The scope in a 429 is the denying rule's per, and each per counts what it
// says: per tenant, per tenant and tool, per subject, per subject and tool,
// or across everyone.
func TestDenialScopes(t *testing.T) {
	t.Parallel()
	type probe struct {
		tenant, sub, tool string
		allowed           bool
	}
	cases := []struct {
		per    string
		global bool
		probes []probe // after acme/alice/echo used the one unit
	}{
		{"tenant", false, []probe{{"acme", "bob", "search", false}, {"other", "alice", "echo", true}}},
		{"tenant_tool", false, []probe{{"acme", "bob", "echo", false}, {"acme", "alice", "search", true}, {"other", "alice", "echo", true}}},
		{"subject", false, []probe{{"acme", "alice", "search", false}, {"acme", "bob", "echo", true}, {"other", "alice", "echo", true}}},
		{"subject_tool", false, []probe{{"acme", "alice", "search", true}, {"acme", "bob", "echo", true}, {"acme", "alice", "echo", false}}},
		{"global", true, []probe{{"other", "zed", "search", false}}},
	}
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			var redis *testenv.Redis
			if m.redis {
				redis = testenv.StartRedis(t, nil)
			}
			for _, c := range cases {
				rule := fmt.Sprintf("{name: r_%s, algorithm: fixed_window, limit: 1, period: 1h}", c.per)
				cfg := "global:\n  - " + rule + "\n"
				if !c.global {
					cfg = "tiers:\n  free:\n    limits:\n      - " + strings.Replace(rule, "algorithm:", "per: "+c.per+", algorithm:", 1) + "\n"
				}
				e := newEnv(t, setup{Config: storeYAML(m.redis) + cfg, Redis: redis, Instances: m.instances,
					Upstream: upstream.Options{Stateless: true, JSONResponse: true}})
				tok := func(tenant, sub string) string {
					// Distinct tenants per case: the cases share one Redis.
					return token(t, c.per+"-"+tenant, sub)
				}
				if r := e.callRaw(0, tok("acme", "alice"), 1, "echo", nil); r.Status != http.StatusOK {
					t.Fatalf("%s: first call %d %s", c.per, r.Status, r.Body)
				}
				r := e.callRaw(1, tok("acme", "alice"), 2, "echo", nil)
				if r.Status != http.StatusTooManyRequests {
					t.Fatalf("%s: second call %d %s", c.per, r.Status, r.Body)
				}
				if d := r.denial(t); d.Scope != c.per || d.Rule != "r_"+c.per || d.Limit != 1 {
					t.Fatalf("%s: denial %+v", c.per, d)
				}
				for _, p := range c.probes {
					r := e.callRaw(0, tok(p.tenant, p.sub), 3, p.tool, map[string]any{"text": "x", "query": "x"})
					if got := r.Status == http.StatusOK; got != p.allowed {
						t.Fatalf("%s: probe %+v: %d %s", c.per, p, r.Status, r.Body)
					}
					if !p.allowed && r.denial(t).Scope != c.per {
						t.Fatalf("%s: probe %+v denied with scope %s", c.per, p, r.denial(t).Scope)
					}
				}
			}
		})
	}
}

// Rate-limit rules count calls, whatever a tool costs: the cost (here 5 and
// 150) goes to the usage meter and the monthly quota, so a costly tool is
// not "never admitted" by a rule of fewer units (the example config's
// llm_complete, estimate 150, under a 20-call burst).
func TestRulesCountCallsNotCost(t *testing.T) {
	t.Parallel()
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newLimitEnv(t, m.redis, m.instances, `
tools:
  llm_complete:
    cost: {estimate: 150, from_result: _meta.usage.tokens}
    limits:
      - {name: llm_burst, per: tenant_tool, algorithm: token_bucket, limit: 3, period: 1m}
  search:
    cost: 5
    limits:
      - {name: search_calls, per: tenant_tool, algorithm: fixed_window, limit: 2, period: 1h}
`, upstream.Options{Stateless: true, JSONResponse: true})
			tok := token(t, "acme", "alice")
			for i, want := range []int64{2, 1, 0} {
				r := e.callRaw(i, tok, i, "llm_complete", map[string]any{"prompt": "p"})
				if r.Status != http.StatusOK || intHeader(t, r.Header, "X-RateLimit-Remaining") != want {
					t.Fatalf("llm_complete %d: %d remaining %s, want 200 and %d (%s)", i, r.Status, r.Header.Get("X-RateLimit-Remaining"), want, r.Body)
				}
			}
			r := e.callRaw(0, tok, 9, "llm_complete", map[string]any{"prompt": "p"})
			if r.Status != http.StatusTooManyRequests || r.denial(t).Rule != "llm_burst" || strings.Contains(r.Msg.Error.Message, "never") {
				t.Fatalf("fourth llm_complete: %d %s, want an ordinary 429 from llm_burst", r.Status, r.Body)
			}
			for i := range 2 {
				if r := e.callRaw(i, tok, i, "search", map[string]any{"query": "q"}); r.Status != http.StatusOK {
					t.Fatalf("search %d: %d %s", i, r.Status, r.Body)
				}
			}
			if r := e.callRaw(0, tok, 9, "search", map[string]any{"query": "q"}); r.Status != http.StatusTooManyRequests {
				t.Fatalf("third search: %d %s", r.Status, r.Body)
			}
			if a, b := e.up.Calls("llm_complete"), e.up.Calls("search"); a != 3 || b != 2 {
				t.Fatalf("upstream saw %d llm_complete and %d search calls, want 3 and 2", a, b)
			}
		})
	}
}

// A concurrency rule frees its slot when the upstream's answer ends, also
// when the client disconnected mid-call (not before: a call without a
// session runs on upstream).
func TestConcurrencyRule(t *testing.T) {
	t.Parallel()
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			// SSE answers: the client sees the end of the stream only after the
			// handler returned, so a slot released "when the answer ends" is
			// free by the time the client has the whole answer.
			e := newLimitEnv(t, m.redis, m.instances, `
tools:
  slow:
    limits:
      - {name: slow_in_flight, per: tenant_tool, algorithm: concurrency, limit: 2, period: 1m}
  hold:
    limits:
      - {name: hold_in_flight, per: tenant_tool, algorithm: concurrency, limit: 2, period: 1m}
`, upstream.Options{Stateless: true})
			tok := token(t, "acme", "alice")
			slow := func(ctx context.Context, i, ms int) (*response, error) {
				return postCtx(ctx, e.mcpURL(i), tok, callBody(i, "slow", map[string]any{"ms": ms}), nil)
			}
			expectDenied := func(what string) {
				t.Helper()
				r, err := slow(context.Background(), 0, 1)
				if err != nil {
					t.Fatal(err)
				}
				if r.Status != http.StatusTooManyRequests {
					t.Fatalf("%s: third call %d %s, want 429", what, r.Status, r.Body)
				}
				d := r.denial(t)
				if d.Scope != "tenant_tool" || d.Rule != "slow_in_flight" || d.Limit != 2 || r.Header.Get("Retry-After") != "1" {
					t.Fatalf("%s: denial %+v Retry-After %q", what, d, r.Header.Get("Retry-After"))
				}
			}

			// Two calls in flight: the third is denied; when both end, admitted.
			var wg sync.WaitGroup
			results := make([]*response, 2)
			for i := range 2 {
				wg.Go(func() {
					r, err := slow(context.Background(), i, 700)
					if err != nil {
						t.Error(err)
					}
					results[i] = r
				})
			}
			eventually(t, 5*time.Second, "2 slow calls upstream", func() bool { return e.up.Calls("slow") == 2 })
			expectDenied("2 in flight")
			wg.Wait()
			for i, r := range results {
				if r == nil || r.Status != http.StatusOK || r.Msg.Result == nil {
					t.Fatalf("slow call %d: %+v", i, r)
				}
			}
			if r, _ := slow(context.Background(), 1, 1); r.Status != http.StatusOK {
				t.Fatalf("after both calls ended: %d %s, want 200 (slots not released)", r.Status, r.Body)
			}

			// Two calls in flight whose clients then disconnect. The SDK
			// client speaks MCP 2026-07-28 to this stateless upstream: its
			// POST is the whole call, so ending it is the disconnect. A call
			// without a session is not stopped upstream by that (see
			// outlivesClient): the slots stay held until the upstream has
			// answered, and are then freed.
			release := make(chan struct{})
			free := sync.OnceFunc(func() { close(release) })
			t.Cleanup(free)
			sdk.AddTool(e.up.MCPServer(), &sdk.Tool{Name: "hold"}, func(_ context.Context, _ *sdk.CallToolRequest, in struct {
				Block bool `json:"block"`
			}) (*sdk.CallToolResult, any, error) {
				if in.Block {
					<-release
				}
				return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "released"}}}, nil, nil
			})
			hold := func() int {
				r, err := postCtx(context.Background(), e.mcpURL(0), tok, callBody(9, "hold", map[string]any{}), nil)
				if err != nil {
					t.Fatal(err)
				}
				return r.Status
			}
			cs := connect(t, e.mcpURL(0), tok, "")
			if v := cs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
				t.Fatalf("negotiated %s", v)
			}
			ctx, cancel := context.WithCancel(context.Background())
			for range 2 {
				wg.Go(func() { _, _ = callTool(ctx, cs, "hold", map[string]any{"block": true}) })
			}
			eventually(t, 5*time.Second, "2 held calls upstream", func() bool { return e.up.Calls("hold") == 2 })
			if st := hold(); st != http.StatusTooManyRequests {
				t.Fatalf("a third call while 2 are held: %d, want 429", st)
			}
			cancel()
			wg.Wait()
			if st := hold(); st != http.StatusTooManyRequests {
				t.Fatalf("a third call after the disconnects, the 2 calls still running upstream: %d, want 429", st)
			}
			free()
			eventually(t, 5*time.Second, "a slot freed once the upstream answered", func() bool { return hold() == http.StatusOK })
			// Both slots are free: two calls run at once again.
			for i := range 2 {
				wg.Go(func() {
					if r, _ := slow(context.Background(), i, 200); r.Status != http.StatusOK {
						t.Errorf("after the disconnects: %d %s", r.Status, r.Body)
					}
				})
			}
			wg.Wait()
		})
	}
}

// Limits key on identity, not on the MCP session: a new session (a new
// initialize) of the same caller starts with the same counters.
func TestLimitsSurviveNewSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: `
tools:
  echo:
    limits:
      - {name: echo_cap, per: subject_tool, algorithm: fixed_window, limit: 2, period: 1h}
`})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tok := token(t, "acme", "alice")
	cs := connect(t, e.mcpURL(0), tok, "")
	for range 2 {
		if _, err := callTool(ctx, cs, "echo", map[string]any{"text": "x"}); err != nil {
			t.Fatal(err)
		}
	}
	_ = cs.Close()
	for _, proto := range []string{"", "2025-06-18"} {
		cs := connect(t, e.mcpURL(0), token(t, "acme", "alice"), proto)
		if _, err := callTool(ctx, cs, "echo", map[string]any{"text": "x"}); !isRateLimited(err) {
			t.Fatalf("new session (%q): %v, want 429", proto, err)
		}
	}
	cs = connect(t, e.mcpURL(0), token(t, "acme", "bob"), "")
	if _, err := callTool(ctx, cs, "echo", map[string]any{"text": "x"}); err != nil {
		t.Fatalf("another subject: %v", err)
	}
}

// A shadow rule is evaluated and counted, never enforced; the headers
// describe the enforced rule.
func TestShadowRule(t *testing.T) {
	t.Parallel()
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newLimitEnv(t, m.redis, m.instances, `
tools:
  echo:
    limits:
      - {name: echo_cap, per: tenant_tool, algorithm: fixed_window, limit: 100, period: 1h}
      - {name: echo_trial, per: subject_tool, algorithm: fixed_window, limit: 2, period: 1h, shadow: true}
`, upstream.Options{Stateless: true, JSONResponse: true})
			tok := token(t, "acme", "alice")
			for i := range 5 {
				r := e.callRaw(i, tok, i, "echo", map[string]any{"text": "x"})
				if r.Status != http.StatusOK {
					t.Fatalf("call %d: %d %s (a shadow rule must not deny)", i, r.Status, r.Body)
				}
				if r.Header.Get("X-RateLimit-Limit") != "100" || intHeader(t, r.Header, "X-RateLimit-Remaining") != int64(99-i) {
					t.Fatalf("call %d: headers %v describe the shadow rule", i, r.Header)
				}
			}
			var shadow float64
			for _, b := range e.base {
				shadow += scrape(t, b)[`mcpgate_shadow_denials_total{rule="echo_trial"}`]
			}
			if shadow != 3 {
				t.Fatalf("shadow denials counted: %v, want 3", shadow)
			}
		})
	}
}
