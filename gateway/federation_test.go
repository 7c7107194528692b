//lint:file-ignore SA1019 sampling is deprecated in MCP 2026-07-28 but still served; the federation relays it.

package gateway

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// stdioEchoes is how many echo calls the stdio upstream c behind gateway
// instance i served, asked of the process itself (its count tool) by a
// tenant of its own.
func (e *fedEnv) stdioEchoes(i int) int {
	e.t.Helper()
	cs := fedConnect(e.t, e.mcpURL(i), token(e.t, "auditor", "auditor"), "2025-11-25", nil)
	got, isErr := fedCall(e.t, cs, "c__count", nil)
	_ = cs.Close()
	n, err := strconv.Atoi(got)
	if err != nil || isErr {
		e.t.Fatalf("c__count on instance %d = %q (isError %v)", i, got, isErr)
	}
	return n
}

// The federated gateway lists the union of its three upstreams' tools,
// trimmed to the caller's scopes (a prefix scope grants one upstream); a
// call outside them is a 403 that reaches no upstream; every call, prompt
// and resource read goes to the upstream that exposes it, and only there.
func TestFederationMergedScopedRouted(t *testing.T) {
	t.Parallel()
	e := newFedEnv(t, fedSetup{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	all := fedConnect(t, e.mcpURL(0), token(t, "acme", "alice"), "2025-11-25", nil)
	want := slices.Concat(fedToolsA, fedToolsB, fedToolsC)
	slices.Sort(want)
	if got := toolNames(t, all); !slices.Equal(got, want) {
		t.Fatalf("tools/list with tools:* =\n%v\nwant\n%v", got, want)
	}

	scoped := fedConnect(t, e.mcpURL(0), sign(t, claims("acme", "bob", "tools:a__* prompts:c__*")), "2025-11-25", nil)
	if got := toolNames(t, scoped); !slices.Equal(got, fedToolsA) {
		t.Fatalf("tools/list with tools:a__* = %v, want a's tools only %v", got, fedToolsA)
	}
	prompts, err := scoped.ListPrompts(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(prompts.Prompts) != 1 || prompts.Prompts[0].Name != "c__greet" {
		t.Fatalf("prompts/list with prompts:c__* = %+v, want c__greet only", prompts.Prompts)
	}
	wantCall(t, scoped, "a__echo", map[string]any{"text": "in scope"}, "in scope")
	// b's tool is outside tools:a__*: refused by the gateway, as for a
	// single upstream (the SDK client sees the 403; a raw POST shows it).
	if _, err := callTool(ctx, scoped, "b__echo", map[string]any{"text": "x"}); err == nil || !strings.Contains(err.Error(), "Forbidden") && !strings.Contains(err.Error(), "scope") {
		t.Fatalf("b__echo with tools:a__*: %v, want 403", err)
	}
	r := post(t, e.mcpURL(0), sign(t, claims("acme", "bob", "tools:a__*")), callBody(7, "b__echo", map[string]any{"text": "x"}), nil)
	if r.Status != http.StatusForbidden || r.code() != CodeForbidden || !strings.Contains(string(r.Body), `b__echo`) {
		t.Fatalf("raw b__echo with tools:a__*: %d %s, want 403 naming b__echo", r.Status, r.Body)
	}
	if n := e.b.TotalCalls(); n != 0 {
		t.Fatalf("b saw %d calls, want none (every call to it was out of scope)", n)
	}

	// Routing: each call reaches its upstream under its own name.
	wantCall(t, all, "a__echo", map[string]any{"text": "a1"}, "a1")
	if got, isErr := fedCall(t, all, "a__search", map[string]any{"query": "q", "limit": 1}); isErr || !strings.Contains(got, `Result 1 for \"q\"`) {
		t.Fatalf("a__search = %q (isError %v)", got, isErr)
	}
	wantCall(t, all, "b__echo", map[string]any{"text": "b1"}, "b1")
	for i := range 2 {
		wantCall(t, all, "b__update_product", map[string]any{"id": strconv.Itoa(i)}, fmt.Sprintf("product %d updated", i))
	}
	for i := range 3 {
		wantCall(t, all, "c__echo", map[string]any{"text": strconv.Itoa(i)}, "c: "+strconv.Itoa(i))
	}
	for tool, n := range map[string]int64{"echo": 2, "search": 1} {
		if got := e.a.Calls(tool); got != n {
			t.Errorf("a saw %d %s calls, want %d", got, tool, n)
		}
	}
	if got := e.a.TotalCalls(); got != 3 {
		t.Errorf("a saw %d calls, want 3", got)
	}
	if got, got2 := e.b.Calls("echo"), e.b.Calls("update_product"); got != 1 || got2 != 2 || e.b.TotalCalls() != 3 {
		t.Errorf("b saw echo %d, update_product %d, total %d; want 1, 2, 3", got, got2, e.b.TotalCalls())
	}
	if n := e.stdioEchoes(0); n != 3 {
		t.Errorf("c served %d echo calls, want 3", n)
	}

	// A prompt of each upstream, under its prefix, reaches that upstream.
	for name, wantText := range map[string]string{"a__summarize": "summarize: x", "b__review": "review: x", "c__greet": "hello from c"} {
		p, err := all.GetPrompt(ctx, &sdk.GetPromptParams{Name: name, Arguments: map[string]string{"text": "x"}})
		if err != nil {
			t.Fatalf("prompts/get %s: %v", name, err)
		}
		if tc, ok := p.Messages[0].Content.(*sdk.TextContent); !ok || tc.Text != wantText {
			t.Errorf("prompts/get %s = %+v, want %q", name, p.Messages[0].Content, wantText)
		}
	}
	if a, b := e.a.Requests("prompts/get"), e.b.Requests("prompts/get"); a != 1 || b != 1 {
		t.Errorf("prompts/get reached a %d and b %d times, want 1 each", a, b)
	}
	// Resources pass unprefixed: a listed URI, a URI of a's template, and
	// the stdio upstream's resource.
	for uri, wantText := range map[string]string{
		"file:///docs/readme.md": "contents of file:///docs/readme.md",
		"file:///docs/other.md":  "contents of file:///docs/other.md",
		"test://c/info":          "info of c",
	} {
		res, err := all.ReadResource(ctx, &sdk.ReadResourceParams{URI: uri})
		if err != nil {
			t.Fatalf("resources/read %s: %v", uri, err)
		}
		if len(res.Contents) != 1 || res.Contents[0].Text != wantText {
			t.Errorf("resources/read %s = %+v, want %q", uri, res.Contents, wantText)
		}
	}
	if a, b := e.a.Requests("resources/read"), e.b.Requests("resources/read"); a != 2 || b != 0 {
		t.Errorf("resources/read reached a %d and b %d times, want 2 and 0", a, b)
	}
}

// outcomes counts the answers of concurrent calls, by tool.
type outcomes struct {
	mu      sync.Mutex
	ok      map[string]int
	limited map[string]int
	other   []string
}

func (o *outcomes) add(tool string, res *sdk.CallToolResult, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ok == nil {
		o.ok, o.limited = map[string]int{}, map[string]int{}
	}
	switch {
	case err == nil && !res.IsError:
		o.ok[tool]++
	case err == nil:
		o.other = append(o.other, fmt.Sprintf("%s: tool error %q", tool, testenv.ToolText(res)))
	case isRateLimited(err):
		o.limited[tool]++
	default:
		o.other = append(o.other, fmt.Sprintf("%s: %v", tool, err))
	}
}

// hammer makes calls tools/call from workers goroutines over sessions
// (spread over the instances), the tool of call i being tools[i%len(tools)].
func hammer(t *testing.T, sessions []*sdk.ClientSession, workers, calls int, tools ...string) *outcomes {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	o := &outcomes{}
	run(workers, calls, func(i int) {
		tool := tools[i%len(tools)]
		args := map[string]any{"text": strconv.Itoa(i)}
		if strings.HasSuffix(tool, "search") {
			args = map[string]any{"query": strconv.Itoa(i)}
		}
		res, err := callTool(ctx, sessions[i%len(sessions)], tool, args)
		o.add(tool, res, err)
	})
	if len(o.other) > 0 {
		t.Fatalf("%d calls failed otherwise than 429, first: %s", len(o.other), o.other[0])
	}
	return o
}

// sessionsOn opens n SDK sessions with tok, spread over e's instances.
func (e *fedEnv) sessionsOn(n int, tok string) []*sdk.ClientSession {
	out := make([]*sdk.ClientSession, n)
	for i := range out {
		out[i] = fedConnect(e.t, e.mcpURL(i), tok, "2025-11-25", nil)
	}
	return out
}

// fedStoreSetup is a fedSetup for a store mode of storeModes.
func fedStoreSetup(t *testing.T, redis bool, instances int, s fedSetup) fedSetup {
	s.Config = storeYAML(redis) + s.Config
	s.Instances = instances
	if redis {
		s.Redis = testenv.StartRedis(t, nil)
	}
	return s
}

// An upstream's limit (upstreams[].limits, per tenant) admits exactly L
// calls over all that upstream's tools under 32 concurrent callers, while
// the other upstream's tools pass untouched; on the memory store, and on
// Redis shared by two gateways (each with its own federation).
func TestFederationUpstreamLimitExact(t *testing.T) {
	t.Parallel()
	const (
		limit   = 25
		calls   = 160 // 80 to a, 80 to b
		workers = 32
	)
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newFedEnv(t, fedStoreSetup(t, m.redis, m.instances, fedSetup{
				ALimits: fmt.Sprintf("[{name: a_cap, per: tenant, algorithm: fixed_window, limit: %d, period: 1h}]", limit),
			}))
			o := hammer(t, e.sessionsOn(8, token(t, "acme", "alice")), workers, calls, "a__echo", "a__search", "b__echo", "b__search")
			okA, deniedA := o.ok["a__echo"]+o.ok["a__search"], o.limited["a__echo"]+o.limited["a__search"]
			if okA != limit || deniedA != calls/2-limit {
				t.Fatalf("a's tools: admitted %d (echo %d, search %d), rate-limited %d; want %d and %d",
					okA, o.ok["a__echo"], o.ok["a__search"], deniedA, limit, calls/2-limit)
			}
			if reached := e.a.Calls("echo") + e.a.Calls("search"); reached != limit || e.a.TotalCalls() != limit {
				t.Fatalf("a saw %d calls (total %d), want exactly %d", reached, e.a.TotalCalls(), limit)
			}
			if okB := o.ok["b__echo"] + o.ok["b__search"]; okB != calls/2 || len(o.limited) > 2 {
				t.Fatalf("b's tools: admitted %d, limited %v; want all %d admitted", okB, o.limited, calls/2)
			}
			if got := e.b.TotalCalls(); got != calls/2 {
				t.Fatalf("b saw %d calls, want %d", got, calls/2)
			}
			// The denial names the upstream's rule.
			r := post(t, e.mcpURL(1), token(t, "acme", "alice"), callBody(1, "a__echo", map[string]any{"text": "x"}), nil)
			if r.Status != http.StatusTooManyRequests {
				t.Fatalf("a__echo after the cap: %d %s", r.Status, r.Body)
			}
			if d := r.denial(t); d.Rule != "a_cap" || d.Scope != "tenant" || d.Limit != limit {
				t.Fatalf("denied by %+v, want a_cap (tenant, limit %d)", d, limit)
			}
		})
	}
}

// A tier's per-tenant rule counts every call, whichever upstream serves it:
// exactly L admitted over a mix of a's, b's and the stdio upstream's tools,
// each admitted call reaching its upstream once; on the memory store, and
// on Redis shared by two gateways.
func TestFederationTierLimitExact(t *testing.T) {
	t.Parallel()
	const (
		limit   = 30
		calls   = 150
		workers = 32
	)
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newFedEnv(t, fedStoreSetup(t, m.redis, m.instances, fedSetup{Config: fmt.Sprintf(`
default_tier: capped
tiers:
  capped:
    limits:
      - {name: all_cap, per: tenant, algorithm: fixed_window, limit: %d, period: 1h}
`, limit)}))
			o := hammer(t, e.sessionsOn(8, token(t, "acme", "alice")), workers, calls, "a__echo", "b__echo", "c__echo")
			total, denied := 0, 0
			for _, tool := range []string{"a__echo", "b__echo", "c__echo"} {
				total += o.ok[tool]
				denied += o.limited[tool]
			}
			if total != limit || denied != calls-limit {
				t.Fatalf("admitted %d (%v), rate-limited %d (%v); want %d and %d", total, o.ok, denied, o.limited, limit, calls-limit)
			}
			if got := e.a.Calls("echo"); got != int64(o.ok["a__echo"]) {
				t.Errorf("a saw %d echo calls, the gateway admitted %d", got, o.ok["a__echo"])
			}
			if got := e.b.Calls("echo"); got != int64(o.ok["b__echo"]) {
				t.Errorf("b saw %d echo calls, the gateway admitted %d", got, o.ok["b__echo"])
			}
			served := 0
			for i := range e.gws {
				served += e.stdioEchoes(i)
			}
			if served != o.ok["c__echo"] {
				t.Errorf("the stdio processes served %d echo calls, the gateway admitted %d", served, o.ok["c__echo"])
			}
		})
	}
}

// An HTTP upstream dies: its tools answer a tool error naming it; after
// federate.DefaultFailures failures its breaker opens and answers without
// calling it, even once it is back; the other upstreams keep serving;
// /readyz and /metrics show each upstream's state; after the cooldown a
// probe reaches it and its calls succeed again.
// Not parallel: it waits out federate.DefaultCooldown (10s) and closes a
// server mid-test.
func TestFederationUpstreamBreaker(t *testing.T) {
	e := newFedEnv(t, fedSetup{})
	cs := fedConnect(t, e.mcpURL(0), token(t, "acme", "alice"), "2025-11-25", nil)
	wantCall(t, cs, "a__echo", map[string]any{"text": "before"}, "before")

	e.a.stop()
	for i := range federate.DefaultFailures {
		got, isErr := fedCall(t, cs, "a__echo", map[string]any{"text": "down"})
		if !isErr || !strings.Contains(got, `upstream "a"`) || strings.Contains(got, "circuit is open") {
			t.Fatalf("call %d to the dead upstream = %q (isError %v), want a tool error naming it", i+1, got, isErr)
		}
	}
	got, isErr := fedCall(t, cs, "a__echo", map[string]any{"text": "open"})
	if !isErr || !strings.Contains(got, `upstream "a"`) || !strings.Contains(got, "circuit is open") || !strings.Contains(got, "retry in") {
		t.Fatalf("call after %d failures = %q (isError %v), want the open breaker's answer", federate.DefaultFailures, got, isErr)
	}
	// The others keep serving.
	wantCall(t, cs, "b__echo", map[string]any{"text": "b up"}, "b up")
	wantCall(t, cs, "c__echo", map[string]any{"text": "c up"}, "c: c up")

	ready := readyz(t, e.base[0])
	for _, line := range []string{
		fmt.Sprintf("upstream a (http): open, %d tools, %d consecutive failures, retry after ", len(fedToolsA), federate.DefaultFailures),
		fmt.Sprintf("upstream b (http): up, %d tools\n", len(fedToolsB)),
		fmt.Sprintf("upstream c (stdio): up, %d tools\n", len(fedToolsC)),
	} {
		if !strings.Contains(ready, line) {
			t.Errorf("/readyz lacks %q:\n%s", line, ready)
		}
	}
	m := scrape(t, e.base[0])
	for series, v := range map[string]float64{
		`mcpgate_upstream_state{state="open",upstream="a"}`: 1,
		`mcpgate_upstream_state{state="up",upstream="a"}`:   0,
		`mcpgate_upstream_state{state="up",upstream="b"}`:   1,
		`mcpgate_upstream_state{state="up",upstream="c"}`:   1,
	} {
		if got, ok := m[series]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, v)
		}
	}
	// The calls a refused while its breaker was open are counted as such.
	if m[`mcpgate_upstream_calls_total{outcome="refused",upstream="a"}`] < float64(federate.DefaultFailures)+1 ||
		m[`mcpgate_upstream_calls_total{outcome="ok",upstream="b"}`] < 1 {
		t.Errorf("upstream call outcomes: a refused %v, b ok %v", m[`mcpgate_upstream_calls_total{outcome="refused",upstream="a"}`],
			m[`mcpgate_upstream_calls_total{outcome="ok",upstream="b"}`])
	}

	// Back on its address before the cooldown ends: the breaker still
	// answers, and nothing reaches the upstream.
	e.a.start()
	reached := e.a.TotalCalls()
	got, isErr = fedCall(t, cs, "a__echo", map[string]any{"text": "still open"})
	if !isErr || !strings.Contains(got, "circuit is open") {
		t.Fatalf("call within the cooldown = %q (isError %v), want the open breaker's answer", got, isErr)
	}
	if n := e.a.TotalCalls(); n != reached {
		t.Fatalf("a call within the cooldown reached the upstream (%d calls, was %d)", n, reached)
	}
	// After the cooldown the breaker lets a probe through.
	testenv.Eventually(t, federate.DefaultCooldown+20*time.Second, "a's breaker to become half open",
		func() bool { return strings.Contains(readyz(t, e.base[0]), "upstream a (http): half_open") })
	wantCall(t, cs, "a__echo", map[string]any{"text": "back"}, "back")
	if n := e.a.TotalCalls(); n != reached+1 {
		t.Fatalf("a saw %d calls after recovery, want %d", n, reached+1)
	}
	if ready := readyz(t, e.base[0]); !strings.Contains(ready, fmt.Sprintf("upstream a (http): up, %d tools\n", len(fedToolsA))) {
		t.Errorf("/readyz after recovery:\n%s", ready)
	}
	m = scrape(t, e.base[0])
	if m[`mcpgate_upstream_state{state="up",upstream="a"}`] != 1 || m[`mcpgate_upstream_state{state="open",upstream="a"}`] != 0 ||
		m[`mcpgate_upstream_state{state="half_open",upstream="a"}`] != 0 {
		t.Errorf("a's state metrics after recovery: up %v, open %v, half_open %v", m[`mcpgate_upstream_state{state="up",upstream="a"}`],
			m[`mcpgate_upstream_state{state="open",upstream="a"}`], m[`mcpgate_upstream_state{state="half_open",upstream="a"}`])
	}
}

// The stdio process crashes: the call that crashed it gets a JSON-RPC
// error naming the upstream (it broke off mid-call, as a single upstream's
// failure is answered), the process is restarted (readyz counts the
// restart), and calls resume on the new process; the HTTP upstreams never
// notice.
func TestFederationStdioRestart(t *testing.T) {
	t.Parallel()
	e := newFedEnv(t, fedSetup{})
	cs := fedConnect(t, e.mcpURL(0), token(t, "acme", "alice"), "2025-11-25", nil)
	wantCall(t, cs, "c__echo", map[string]any{"text": "1"}, "c: 1")
	if _, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "c__crash"}); err == nil || !strings.Contains(err.Error(), `upstream "c" failed`) {
		t.Fatalf("c__crash: err = %v, want a JSON-RPC error naming c", err)
	}
	testenv.Eventually(t, 30*time.Second, "the stdio process to be restarted", func() bool {
		return strings.Contains(readyz(t, e.base[0]), fmt.Sprintf("upstream c (stdio): up, %d tools, 1 restarts", len(fedToolsC)))
	})
	wantCall(t, cs, "c__echo", map[string]any{"text": "2"}, "c: 2")
	if n := e.stdioEchoes(0); n != 1 {
		t.Errorf("the new process served %d echo calls, want 1 (it is a new process)", n)
	}
	wantCall(t, cs, "a__echo", map[string]any{"text": "a"}, "a")
	if m := scrape(t, e.base[0]); m[`mcpgate_upstream_state{state="up",upstream="c"}`] != 1 {
		t.Errorf("c's state metric after the restart: %v", m[`mcpgate_upstream_state{state="up",upstream="c"}`])
	}
}

// Clients of MCP 2025-06-18 and 2025-11-25 (sessions) and 2026-07-28
// (stateless) all list the merged tools, call every upstream, get a prompt
// and read a resource through the federated gateway. (A 2026-07-28
// client's per-request _meta stays on its side: see federate's forwardMeta.)
func TestFederationProtocolVersions(t *testing.T) {
	t.Parallel()
	e := newFedEnv(t, fedSetup{})
	want := slices.Concat(fedToolsA, fedToolsB, fedToolsC)
	slices.Sort(want)
	for _, v := range []string{"2025-06-18", "2025-11-25", "2026-07-28"} {
		t.Run(v, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cs := fedConnect(t, e.mcpURL(0), token(t, "acme", "user-"+v), v, nil)
			if got := cs.InitializeResult().ProtocolVersion; got != v {
				t.Fatalf("negotiated %s, want %s", got, v)
			}
			if stateless := cs.ID() == ""; stateless != (v == "2026-07-28") {
				t.Errorf("session id %q", cs.ID())
			}
			if got := toolNames(t, cs); !slices.Equal(got, want) {
				t.Fatalf("tools/list = %v, want %v", got, want)
			}
			for up, srv := range map[string]*fedHTTP{"a": e.a, "b": e.b} {
				before := srv.Calls("echo")
				res, err := callTool(ctx, cs, up+"__echo", map[string]any{"text": v})
				if err != nil || res.IsError || testenv.ToolText(res) != v {
					t.Errorf("%s__echo: %v, %+v; want %q", up, err, res, v)
				} else if n := srv.Calls("echo"); n != before+1 {
					t.Errorf("%s saw %d echo calls, want %d", up, n, before+1)
				}
			}
			before := e.stdioEchoes(0)
			wantCall(t, cs, "c__echo", map[string]any{"text": v}, "c: "+v)
			if n := e.stdioEchoes(0); n != before+1 {
				t.Errorf("c served %d echo calls, want %d", n, before+1)
			}
			for name, wantText := range map[string]string{"a__summarize": "summarize: " + v, "c__greet": "hello from c"} {
				p, err := cs.GetPrompt(ctx, &sdk.GetPromptParams{Name: name, Arguments: map[string]string{"text": v}})
				if err != nil {
					t.Errorf("prompts/get %s: %v", name, err)
				} else if tc, ok := p.Messages[0].Content.(*sdk.TextContent); !ok || tc.Text != wantText {
					t.Errorf("prompts/get %s = %+v, want %q", name, p.Messages[0].Content, wantText)
				}
			}
			for uri, wantText := range map[string]string{"file:///docs/readme.md": "contents of file:///docs/readme.md", "test://c/info": "info of c"} {
				r, err := cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: uri})
				if err != nil {
					t.Errorf("resources/read %s: %v", uri, err)
				} else if len(r.Contents) != 1 || r.Contents[0].Text != wantText {
					t.Errorf("resources/read %s = %+v, want %q", uri, r.Contents, wantText)
				}
			}
		})
	}
}

// What an upstream asks of its client crosses the gateway: a sampling
// request (from an HTTP upstream, on the client's own upstream session, and
// from the stdio one, on its shared session) is answered by the client's
// CreateMessageHandler; log messages (after logging/setLevel) and progress
// notifications, with the client's own progress token, reach the client.
func TestFederationSamplingLogsProgress(t *testing.T) {
	t.Parallel()
	e := newFedEnv(t, fedSetup{})
	logs := make(chan string, 16)
	progress := make(chan any, 16)
	cs := fedConnect(t, e.mcpURL(0), token(t, "acme", "alice"), "2025-11-25", &sdk.ClientOptions{
		CreateMessageHandler: func(ctx context.Context, req *sdk.CreateMessageRequest) (*sdk.CreateMessageResult, error) {
			tc, _ := req.Params.Messages[0].Content.(*sdk.TextContent)
			if tc == nil {
				return nil, fmt.Errorf("sampling message %T", req.Params.Messages[0].Content)
			}
			return &sdk.CreateMessageResult{Role: "assistant", Model: "test-model", Content: &sdk.TextContent{Text: "re: " + tc.Text}}, nil
		},
		LoggingMessageHandler: func(ctx context.Context, req *sdk.LoggingMessageRequest) {
			s, _ := req.Params.Data.(string)
			logs <- s
		},
		ProgressNotificationHandler: func(ctx context.Context, req *sdk.ProgressNotificationClientRequest) {
			progress <- req.Params.ProgressToken
		},
	})
	wantCall(t, cs, "a__sample", map[string]any{"text": "q-a"}, "a sampled: re: q-a")
	if n := e.a.Calls("sample"); n != 1 {
		t.Errorf("a saw %d sample calls, want 1", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// c is a stdio server: its one session serves every client, and nothing
	// in its request says whose call it is for, so no client is asked.
	if res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "c__sample", Arguments: map[string]any{"text": "q-c"}}); err != nil || !res.IsError {
		t.Fatalf("c__sample: %v %+v; want the tool's error result (its sampling refused)", err, res)
	}
	if err := cs.SetLoggingLevel(ctx, &sdk.SetLoggingLevelParams{Level: "info"}); err != nil {
		t.Fatalf("logging/setLevel: %v", err)
	}
	for _, up := range []string{"a", "c"} {
		params := &sdk.CallToolParams{Name: up + "__notify", Arguments: map[string]any{"text": "hi"}}
		params.SetProgressToken("tok-" + up)
		res, err := cs.CallTool(ctx, params)
		if err != nil || res.IsError {
			t.Fatalf("%s__notify: %v %+v", up, err, res)
		}
		// The stdio server's log message goes to mcpgate's log: it could
		// be of any client's call.
		if up == "a" {
			select {
			case got := <-logs:
				if got != up+" says hi" {
					t.Errorf("log message %q, want %q", got, up+" says hi")
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("no log message from %s", up)
			}
		}
		select {
		case got := <-progress:
			if got != "tok-"+up {
				t.Errorf("progress token %v, want the client's own %q", got, "tok-"+up)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("no progress notification from %s", up)
		}
	}
	select {
	case got := <-logs:
		t.Errorf("the client got the stdio server's log message %q", got)
	default:
	}
}
