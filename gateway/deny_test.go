package gateway

// deny_as: result. A denied tools/call is answered 200 with a tool result
// (isError, a text for the model, the retry data as structuredContent) and
// the same rate-limit headers as a 429; deny_as: http keeps the 429, which
// the Go SDK client reports without its retry data.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/limit"
)

// denyConfig gives tier free deny_as: result and one call per minute of
// each tool; search overrides it with deny_as: http.
const denyConfig = `
default_tier: free
tiers:
  free:
    deny_as: result
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 1, period: 1m}
tools:
  search: {deny_as: http}
`

// toolResult is the part of a CallToolResult a denial fills.
type toolResult struct {
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StructuredContent *denied `json:"structuredContent"`
	IsError           bool    `json:"isError"`
	Meta              struct {
		Denial *denied `json:"io.mcpgate/denial"`
	} `json:"_meta"`
}

// deniedResultOf decodes r as a result-mode denial of a tool that declares
// no outputSchema: 200, JSON, a result (no error) with isError, one text,
// and the denial as structuredContent and in _meta, with a Retry-After
// equal to its retry_after_seconds.
func deniedResultOf(t *testing.T, r *response) (toolResult, int64) {
	t.Helper()
	res, ra := deniedAnswerOf(t, r)
	if res.StructuredContent == nil || *res.StructuredContent != *res.Meta.Denial {
		t.Fatalf("result %s: want structuredContent, the same as _meta's denial", r.Msg.Result)
	}
	return res, ra
}

// deniedTypedResultOf decodes r as deniedResultOf does, for a tool that
// declares an outputSchema: the denial is in _meta only, not in
// structuredContent (which the schema would refuse).
func deniedTypedResultOf(t *testing.T, r *response) (toolResult, int64) {
	t.Helper()
	res, ra := deniedAnswerOf(t, r)
	if res.StructuredContent != nil || strings.Contains(string(r.Msg.Result), "structuredContent") {
		t.Fatalf("result %s: want no structuredContent for a tool with an outputSchema", r.Msg.Result)
	}
	return res, ra
}

// deniedAnswerOf checks what every result-mode denial has: 200, JSON, a
// result with isError, one text, the denial in _meta and a Retry-After
// equal to its retry_after_seconds.
func deniedAnswerOf(t *testing.T, r *response) (toolResult, int64) {
	t.Helper()
	if r.Status != http.StatusOK || r.Msg.Error != nil || r.Msg.Result == nil {
		t.Fatalf("want 200 with a result, got %d %s", r.Status, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var res toolResult
	if err := json.Unmarshal(r.Msg.Result, &res); err != nil {
		t.Fatalf("result %s: %v", r.Msg.Result, err)
	}
	if !res.IsError || len(res.Content) != 1 || res.Content[0].Type != "text" || res.Meta.Denial == nil {
		t.Fatalf("result %s: want isError, one text content and _meta[%q]", r.Msg.Result, enforce.MetaDenial)
	}
	ra := intHeader(t, r.Header, "Retry-After")
	if res.Meta.Denial.RetryAfterSeconds != ra {
		t.Fatalf("retry_after_seconds %d, Retry-After %d", res.Meta.Denial.RetryAfterSeconds, ra)
	}
	return res, ra
}

// The raw contract of deny_as: result, on the memory store and on Redis
// shared by two instances: status, headers, id, text, structuredContent,
// metrics; the upstream sees only the admitted call.
func TestDenyAsResultContract(t *testing.T) {
	t.Parallel()
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newLimitEnv(t, m.redis, m.instances, denyConfig, upstream.Options{Stateless: true, JSONResponse: true})
			tok := token(t, "acme", "alice")
			if r := e.callRaw(0, tok, 1, "echo", map[string]any{"text": "x"}); r.Status != http.StatusOK || isErrorResult(r.Msg.Result) {
				t.Fatalf("first call: %d %s", r.Status, r.Body)
			}
			r := e.callRaw(1, tok, "req-7", "echo", map[string]any{"text": "x"})
			res, ra := deniedResultOf(t, r)
			if string(r.Msg.ID) != `"req-7"` || r.Msg.JSONRPC != "2.0" {
				t.Fatalf("envelope %s: want jsonrpc 2.0 and id \"req-7\"", r.Body)
			}
			if ra < 1 || ra > 60 {
				t.Fatalf("Retry-After %d, want 1..60", ra)
			}
			if want := (denied{Scope: "tenant_tool", Rule: "per_tool", Limit: 1, Remaining: 0, RetryAfterSeconds: ra}); *res.StructuredContent != want {
				t.Fatalf("structuredContent %+v, want %+v", *res.StructuredContent, want)
			}
			wantText := fmt.Sprintf(`Rate limit reached (tenant_tool rule "per_tool"): retry in %d seconds.`, ra)
			if ra == 1 {
				wantText = `Rate limit reached (tenant_tool rule "per_tool"): retry in 1 second.`
			}
			if res.Content[0].Text != wantText {
				t.Fatalf("text %q, want %q", res.Content[0].Text, wantText)
			}
			if got := intHeader(t, r.Header, "X-RateLimit-Limit"); got != 1 {
				t.Errorf("X-RateLimit-Limit %d, want 1", got)
			}
			if got := intHeader(t, r.Header, "X-RateLimit-Remaining"); got != 0 {
				t.Errorf("X-RateLimit-Remaining %d, want 0", got)
			}
			if now := time.Now().Unix(); intHeader(t, r.Header, "X-RateLimit-Reset") <= now {
				t.Errorf("X-RateLimit-Reset %s is not in the future", r.Header.Get("X-RateLimit-Reset"))
			}
			if got := r.Header.Get("RateLimit-Policy"); got != `"per_tool";q=1;w=60` {
				t.Errorf("RateLimit-Policy %q", got)
			}
			if got := r.Header.Get("RateLimit"); !strings.HasPrefix(got, `"per_tool";r=0;t=`) {
				t.Errorf("RateLimit %q", got)
			}
			// search says deny_as: http: its second call is the 429.
			if r := e.callRaw(0, tok, 3, "search", map[string]any{"query": "q"}); r.Status != http.StatusOK {
				t.Fatalf("first search: %d %s", r.Status, r.Body)
			}
			r = e.callRaw(1, tok, 4, "search", map[string]any{"query": "q"})
			if r.Status != http.StatusTooManyRequests || r.code() != CodeRateLimited || r.denial(t).Rule != "per_tool" {
				t.Fatalf("search under deny_as: http: %d %s, want the 429", r.Status, r.Body)
			}
			if e.up.Calls("echo") != 1 || e.up.Calls("search") != 1 {
				t.Fatalf("upstream saw %d echo and %d search calls, want 1 each", e.up.Calls("echo"), e.up.Calls("search"))
			}
			// Counted as a 429 is: one denial per tool, on the instance that answered.
			got := scrape(t, e.base[1%len(e.base)])
			if n := got[`mcpgate_denials_total{rule="per_tool",scope="tenant_tool"}`]; n != 2 {
				t.Errorf("mcpgate_denials_total per_tool = %v, want 2", n)
			}
			if n := got[`mcpgate_requests_total{method="tools/call",outcome="denied"}`]; n != 2 {
				t.Errorf("denied tools/call requests = %v, want 2", n)
			}
		})
	}
}

// The Go SDK client: under deny_as: result CallTool returns a result with
// IsError and the retry time in StructuredContent; under deny_as: http it
// returns an error that says "Too Many Requests" and nothing else (the SDK
// does not read the 429's body), which is why result mode exists.
func TestDenyAsGoSDKClient(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: denyConfig})
	cs := connect(t, e.mcpURL(0), token(t, "acme", "alice"), "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for tool, args := range map[string]map[string]any{"echo": {"text": "x"}, "search": {"query": "q"}} {
		if res, err := callTool(ctx, cs, tool, args); err != nil || res.IsError {
			t.Fatalf("first %s: %v %+v", tool, err, res)
		}
	}

	res, err := callTool(ctx, cs, "echo", map[string]any{"text": "x"})
	if err != nil {
		t.Fatalf("denied echo under deny_as: result: the SDK returned an error: %v", err)
	}
	if !res.IsError {
		t.Fatalf("denied echo: IsError false: %+v", res)
	}
	sc, ok := res.StructuredContent.(map[string]any)
	if !ok {
		t.Fatalf("StructuredContent %T %v, want an object", res.StructuredContent, res.StructuredContent)
	}
	ra, ok := sc["retry_after_seconds"].(float64)
	if !ok || ra < 1 || ra > 60 || ra != float64(int64(ra)) {
		t.Fatalf("structuredContent.retry_after_seconds = %v, want whole seconds in 1..60 (%v)", sc["retry_after_seconds"], sc)
	}
	if sc["scope"] != "tenant_tool" || sc["rule"] != "per_tool" {
		t.Fatalf("structuredContent %v", sc)
	}
	txt, ok := res.Content[0].(*sdk.TextContent)
	if len(res.Content) != 1 || !ok || !strings.Contains(txt.Text, fmt.Sprintf("retry in %d second", int64(ra))) {
		t.Fatalf("content %+v: want one text naming the retry in %v seconds", res.Content, ra)
	}

	_, err = callTool(ctx, cs, "search", map[string]any{"query": "q"})
	if !isRateLimited(err) {
		t.Fatalf("denied search under deny_as: http: %v, want the SDK's 429 error", err)
	}
	for _, s := range []string{"retry", "per_tool", "33029"} {
		if strings.Contains(err.Error(), s) {
			t.Logf("note: the SDK's 429 error now carries %q: %v", s, err)
		}
	}
	// The session survives both denials.
	if res, err := callTool(ctx, cs, "echo", map[string]any{"text": "x"}); err != nil || !res.IsError {
		t.Fatalf("echo after the denials: %v %+v, want the same result-mode denial", err, res)
	}
}

// A quota denial under deny_as: result is the quota's data in a result, and
// charges nothing: the meter holds exactly what was admitted.
func TestDenyAsResultQuota(t *testing.T) {
	t.Parallel()
	st := openUsageDB(t, "")
	now := time.Date(2031, 3, 31, 23, 0, 0, 0, time.UTC) // an hour before the period ends
	e := newEnv(t, setup{Usage: st, Now: newClock(now).Now, Upstream: stateless, Config: `
usage: {flush_interval: 50ms}
default_tier: free
tiers:
  free: {monthly_quota: 2, deny_as: result}
`})
	tok := token(t, "acme", "alice")
	for i := range 2 {
		if r := e.callRaw(0, tok, i, "echo", map[string]any{"text": "x"}); r.Status != http.StatusOK || isErrorResult(r.Msg.Result) {
			t.Fatalf("call %d: %d %s", i, r.Status, r.Body)
		}
	}
	for i := range 3 {
		res, ra := deniedResultOf(t, e.callRaw(0, tok, 10+i, "echo", map[string]any{"text": "x"}))
		if want := (denied{Scope: "quota", Rule: enforce.QuotaRule, Limit: 2, Remaining: 0, RetryAfterSeconds: 3600}); *res.StructuredContent != want || ra != 3600 {
			t.Fatalf("denial %d: %+v (Retry-After %d), want %+v", i, *res.StructuredContent, ra, want)
		}
		if want := `Monthly quota used up (quota rule "monthly_quota", 2 cost units): retry in 3600 seconds.`; res.Content[0].Text != want {
			t.Fatalf("text %q, want %q", res.Content[0].Text, want)
		}
	}
	want := limit.Usage{Charged: 2, Calls: 2}
	if got := e.live(0, "acme", "2031-03"); got != want || e.up.Calls("echo") != 2 {
		t.Fatalf("meter %+v, upstream %d calls: want %+v and 2 calls", got, e.up.Calls("echo"), want)
	}
	waitDurable(t, st, "acme", "2031-03", want)
}

// Result-mode denials still feed the loop breaker: consecutive_denials of
// them open it, and the breaker's own denial is a result too (across two
// instances sharing Redis).
func TestDenyAsResultFeedsBreaker(t *testing.T) {
	t.Parallel()
	e := newBreakerEnv(t, nil, `
tiers:
  free:
    deny_as: result
    limits:
      - {name: one, per: subject, algorithm: fixed_window, limit: 1, period: 1h}
breaker:
  consecutive_denials: 3
  cooldown: 30s
`, stateless)
	tok := token(t, "acme", "loopy")
	if r := e.callRaw(0, tok, 0, "echo", map[string]any{"text": "x"}); r.Status != http.StatusOK || isErrorResult(r.Msg.Result) {
		t.Fatalf("first call: %d %s", r.Status, r.Body)
	}
	for i := 1; i <= 3; i++ {
		res, _ := deniedResultOf(t, e.callRaw(i, tok, i, "echo", map[string]any{"text": "x"}))
		if res.StructuredContent.Scope != "subject" {
			t.Fatalf("denial %d: %+v, want the rate limit's (subject)", i, *res.StructuredContent)
		}
	}
	for i := 4; i <= 5; i++ {
		res, ra := deniedResultOf(t, e.callRaw(i, tok, i, "echo", map[string]any{"text": "x"}))
		if sc := *res.StructuredContent; sc.Scope != "breaker" || sc.Rule != enforce.BreakerRule || ra < 1 || ra > 30 {
			t.Fatalf("call %d after 3 denials: %+v (Retry-After %d), want the open breaker's, cooldown 30s", i, sc, ra)
		}
		if !strings.HasPrefix(res.Content[0].Text, `Loop breaker open (breaker rule "loop_breaker": `) {
			t.Fatalf("text %q", res.Content[0].Text)
		}
	}
	if got := e.up.Calls("echo"); got != 1 {
		t.Fatalf("upstream saw %d calls, want 1", got)
	}
}

// Methods other than tools/call have no tool result to carry a denial:
// under deny_as: result they still get the 429.
func TestDenyAsResultOtherMethods(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true, JSONResponse: true}, Config: `
tiers:
  free:
    deny_as: result
    limits:
      - {name: lists, per: tenant, methods: [tools/list], algorithm: fixed_window, limit: 1, period: 1m}
`})
	tok := token(t, "acme", "alice")
	const list = `{"jsonrpc":"2.0","id":9,"method":"tools/list"}`
	if r := post(t, e.mcpURL(0), tok, list, nil); r.Status != http.StatusOK || r.Msg.Result == nil {
		t.Fatalf("first tools/list: %d %s", r.Status, r.Body)
	}
	r := post(t, e.mcpURL(0), tok, list, nil)
	if r.Status != http.StatusTooManyRequests || r.code() != CodeRateLimited || r.denial(t).Rule != "lists" || r.Header.Get("Retry-After") == "" {
		t.Fatalf("second tools/list: %d %s, want the 429", r.Status, r.Body)
	}
}

// Text for every kind of denial, including one that can never be admitted.
func TestDenialText(t *testing.T) {
	t.Parallel()
	never := limit.Decision{Rule: limit.Rule{Name: "tiny", Period: time.Minute}, RetryAfter: limit.Never}
	cases := []struct {
		d     limit.Decision
		scope string
		want  string
	}{
		{limit.Decision{Rule: limit.Rule{Name: "per_tenant"}, RetryAfter: 42 * time.Second}, "tenant", `Rate limit reached (tenant rule "per_tenant"): retry in 42 seconds.`},
		{limit.Decision{Rule: limit.Rule{Name: "g"}, RetryAfter: time.Millisecond}, "global", `Rate limit reached (global rule "g"): retry in 1 second.`},
		{never, "tenant_tool", `Call refused: its cost exceeds the capacity of tenant_tool rule "tiny", so it can never be admitted. Do not retry it.`},
	}
	for _, c := range cases {
		if got := (enforce.Decision{Limit: c.d, Scope: c.scope}).Text(); got != c.want {
			t.Errorf("Text(%s) = %q, want %q", c.d.Rule.Name, got, c.want)
		}
	}
}

// schemaConfig: deny_as: result, one call per hour of each tool.
const schemaConfig = `
default_tier: free
tiers:
  free:
    deny_as: result
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 1, period: 1h}
`

// listRaw makes a tools/list with a raw POST as tok and returns the names
// listed.
func listRaw(t *testing.T, url, tok string) []string {
	t.Helper()
	r := post(t, url, tok, `{"jsonrpc":"2.0","id":"l","method":"tools/list"}`, nil)
	var res struct {
		Tools []struct {
			Name string `json:"name"`
		} `json:"tools"`
	}
	if r.Status != http.StatusOK || r.Msg.Result == nil || json.Unmarshal(r.Msg.Result, &res) != nil {
		t.Fatalf("tools/list: %d %s", r.Status, r.Body)
	}
	names := make([]string, len(res.Tools))
	for i, tool := range res.Tools {
		names[i] = tool.Name
	}
	return names
}

// A tool that declares an outputSchema (search) is denied without
// structuredContent, over a JSON and an event-stream upstream: the denial
// is in _meta, the text tells the retry time. The gateway knows it from
// the start (it lists the upstream's tools itself), before any client
// listed them; a tool without an outputSchema (echo) keeps
// structuredContent. A list trimmed to a caller's scopes unlearns nothing
// of the tools it does not show; a reload keeps what was learnt unless the
// upstream changes, and then the lists callers get teach it again.
func TestDenyAsResultOutputSchema(t *testing.T) {
	t.Parallel()
	for _, m := range []struct {
		name string
		up   upstream.Options
	}{
		{"json", upstream.Options{Stateless: true, JSONResponse: true}},
		{"sse", upstream.Options{Stateless: true}},
	} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, setup{Config: schemaConfig, Upstream: m.up})
			alice := token(t, "acme", "alice")
			bob := sign(t, claims("acme", "bob", "tools:echo"))
			search := func(id int) *response {
				return e.callRaw(0, alice, id, "search", map[string]any{"query": "q"})
			}
			learntSearchSchema(t, e.gws[0], "the start-up listing of the upstream's tools")
			if r := search(1); r.Status != http.StatusOK || isErrorResult(r.Msg.Result) {
				t.Fatalf("first search: %d %s", r.Status, r.Body)
			}
			// No client listed the tools: the gateway knows all the same.
			res, ra := deniedTypedResultOf(t, search(2))
			if want := (denied{Scope: "tenant_tool", Rule: "per_tool", Limit: 1, Remaining: 0, RetryAfterSeconds: ra}); *res.Meta.Denial != want || ra < 1 || ra > 3600 {
				t.Fatalf("_meta denial %+v, want %+v in 1..3600 s", *res.Meta.Denial, want)
			}
			if want := fmt.Sprintf(`Rate limit reached (tenant_tool rule "per_tool"): retry in %d seconds.`, ra); res.Content[0].Text != want {
				t.Fatalf("text %q, want %q", res.Content[0].Text, want)
			}

			// bob's list shows echo only: search stays known.
			if got := listRaw(t, e.mcpURL(0), bob); len(got) != 1 || got[0] != "echo" {
				t.Fatalf("bob's tools/list: %v, want [echo]", got)
			}
			deniedTypedResultOf(t, search(3))

			// echo declares none: structuredContent.
			if r := e.callRaw(0, alice, 5, "echo", map[string]any{"text": "x"}); r.Status != http.StatusOK || isErrorResult(r.Msg.Result) {
				t.Fatalf("first echo: %d %s", r.Status, r.Body)
			}
			deniedResultOf(t, e.callRaw(0, alice, 6, "echo", map[string]any{"text": "x"}))

			// A reload to the same upstream keeps it; to another, forgets it
			// and lists that one's tools, as a start does.
			e.apply(setup{Config: schemaConfig})
			deniedTypedResultOf(t, search(8))
			e.apply(setup{Config: schemaConfig, UpstreamURL: strings.Replace(e.upURL, "127.0.0.1", "localhost", 1)})
			learntSearchSchema(t, e.gws[0], "the reload's listing of the other upstream's tools")
			deniedTypedResultOf(t, search(9))
			listRaw(t, e.mcpURL(0), bob)
			deniedTypedResultOf(t, search(10))
			if got := listRaw(t, e.mcpURL(0), alice); !slices.Contains(got, "search") {
				t.Fatalf("alice's tools/list: %v, want search in it", got)
			}
			deniedTypedResultOf(t, search(11))
			if n := e.up.Calls("search"); n != 1 {
				t.Fatalf("upstream saw %d search calls, want 1", n)
			}
		})
	}
}

// Behind a load balancer, on one Redis: a client that never listed its
// tools through the instance that denies it still gets a denial its SDK
// accepts for a tool with an outputSchema (every instance lists the
// upstream's tools at start).
func TestDenyAsResultOutputSchemaEveryInstance(t *testing.T) {
	t.Parallel()
	e := newLimitEnv(t, true, 2, schemaConfig, upstream.Options{Stateless: true, JSONResponse: true})
	for i := range e.gws {
		learntSearchSchema(t, e.gws[i], "the start-up listing of instance "+fmt.Sprint(i))
	}
	e.searchDeniedTyped(t, token(t, "acme", "alice"), 0, 1)
}

// learntSearchSchema waits until g knows that search declares an
// outputSchema, from the listing named what.
func learntSearchSchema(t *testing.T, g *Gateway, what string) {
	t.Helper()
	eventually(t, 10*time.Second, what, func() bool { return g.rt.Load().outputs.declares("search") })
}

// searchDeniedTyped makes search's one call of the hour as tok through
// instance a, then calls it again through instance b: a denial without
// structuredContent (search declares an outputSchema).
func (e *env) searchDeniedTyped(t *testing.T, tok string, a, b int) {
	t.Helper()
	if r := e.callRaw(a, tok, 1, "search", map[string]any{"query": "q"}); r.Status != http.StatusOK {
		t.Fatalf("first search: %d %s", r.Status, r.Body)
	}
	deniedTypedResultOf(t, e.callRaw(b, tok, 2, "search", map[string]any{"query": "q"}))
}

// A reload that turns deny_as: result on lists the upstream's tools, as a
// start with it does: a client that listed its tools before the reload (or
// through another instance) is denied with a result its SDK accepts.
func TestReloadDenyAsResultListsOutputSchemas(t *testing.T) {
	t.Parallel()
	httpDenials := strings.Replace(schemaConfig, "deny_as: result", "deny_as: http", 1)
	up := upstream.Options{Stateless: true, JSONResponse: true}
	e := newEnv(t, setup{Config: httpDenials, Upstream: up})
	e.apply(setup{Config: schemaConfig, Upstream: up})
	learntSearchSchema(t, e.gws[0], "the reload's listing")
	if n := e.up.Requests("tools/list"); n != 1 {
		t.Fatalf("upstream tools/list %d, want the reload's one", n)
	}
	e.searchDeniedTyped(t, token(t, "acme", "alice"), 0, 0)
}

// With upstreams:, the names learnt are the exposed ones: a's and b's
// search (an outputSchema) lose structuredContent, the stdio upstream's
// echo (none) keeps it.
func TestDenyAsResultOutputSchemaFederated(t *testing.T) {
	t.Parallel()
	e := newFedEnv(t, fedSetup{Config: schemaConfig})
	tok := token(t, "acme", "alice")
	listRaw(t, e.mcpURL(0), tok)
	for i, c := range []struct {
		tool  string
		args  map[string]any
		typed bool
	}{
		{"a__search", map[string]any{"query": "q"}, true},
		{"b__search", map[string]any{"query": "q"}, true},
		{"c__echo", map[string]any{"text": "x"}, false},
		{"a__echo", map[string]any{"text": "x"}, false},
	} {
		if r := post(t, e.mcpURL(0), tok, callBody(2*i, c.tool, c.args), nil); r.Status != http.StatusOK || isErrorResult(r.Msg.Result) {
			t.Fatalf("first %s: %d %s", c.tool, r.Status, r.Body)
		}
		r := post(t, e.mcpURL(0), tok, callBody(2*i+1, c.tool, c.args), nil)
		var res toolResult
		if c.typed {
			res, _ = deniedTypedResultOf(t, r)
		} else {
			res, _ = deniedResultOf(t, r)
		}
		if d := *res.Meta.Denial; d.Rule != "per_tool" || d.Scope != "tenant_tool" {
			t.Fatalf("%s denied by %+v, want per_tool", c.tool, d)
		}
	}
}

// The answer's shape: the denial in _meta under enforce.MetaDenial always,
// and as structuredContent unless the tool declares an outputSchema.
func TestDeniedResultShape(t *testing.T) {
	t.Parallel()
	d := enforce.Decision{Scope: "tenant", Limit: limit.Decision{Rule: limit.Rule{Name: "per_tenant"}, Limit: 10, RetryAfter: 42 * time.Second}}
	const (
		text   = `"content":[{"type":"text","text":"Rate limit reached (tenant rule \"per_tenant\"): retry in 42 seconds."}]`
		denial = `{"scope":"tenant","rule":"per_tenant","limit":10,"remaining":0,"retry_after_seconds":42}`
	)
	for _, c := range []struct {
		outputSchema bool
		want         string
	}{
		{false, `{` + text + `,"structuredContent":` + denial + `,"isError":true,"_meta":{"io.mcpgate/denial":` + denial + `}}`},
		{true, `{` + text + `,"isError":true,"_meta":{"io.mcpgate/denial":` + denial + `}}`},
	} {
		b, err := json.Marshal(d.Result(c.outputSchema))
		if err != nil || string(b) != c.want {
			t.Errorf("Result(%t) = %s (%v), want %s", c.outputSchema, b, err, c.want)
		}
		var meta struct {
			Meta map[string]json.RawMessage `json:"_meta"`
		}
		if json.Unmarshal(b, &meta) != nil || string(meta.Meta[enforce.MetaDenial]) != denial {
			t.Errorf("Result(%t): _meta %v has no %q", c.outputSchema, meta.Meta, enforce.MetaDenial)
		}
	}
}

// toolSchemas learns from tools/list results: a tool with an outputSchema
// (not null; a twin in another letter case counts), a later list saying
// otherwise, tools a list does not show (kept), results it cannot read
// (nothing learnt), its bounds, and concurrent use.
func TestToolSchemasLearn(t *testing.T) {
	t.Parallel()
	var nilSchemas *toolSchemas
	nilSchemas.onToolsList(json.RawMessage(`{"tools":[{"name":"a","outputSchema":{}}]}`), nil)
	if nilSchemas.declares("a") {
		t.Fatal("a nil toolSchemas learnt")
	}

	s := &toolSchemas{}
	s.onToolsList(json.RawMessage(`{"tools":[
		{"name":"a","inputSchema":{"type":"object"},"outputSchema":{"type":"object"}},
		{"name":"b","inputSchema":{"type":"object"}},
		{"name":"c","outputSchema":null},
		{"name":"d","OutputSchema":{"type":"object"}},
		{"Name":"e","outputSchema":{}},
		{"name":"f","NAME":"g","outputSchema":{}},
		{"name":5,"outputSchema":{}},
		7,
		{"name":"h\u00e9","outputSchema":{}}
	],"nextCursor":"p2"}`), nil)
	want := map[string]bool{"a": true, "b": false, "c": false, "d": true, "e": false, "f": false, "g": false, "hé": true, "": false}
	check := func(when string) {
		t.Helper()
		for name, w := range want {
			if got := s.declares(name); got != w {
				t.Errorf("%s: declares(%q) = %t, want %t", when, name, got, w)
			}
		}
	}
	check("first list")

	// Another page, or another caller's list: a now says it has none, b
	// one; the tools it does not list keep what they had.
	s.onToolsList(json.RawMessage(`{"tools":[{"name":"a"},{"name":"b","outputSchema":{"type":"object"}}]}`), nil)
	want["a"], want["b"] = false, true
	check("second list")

	// Unreadable results and errors teach nothing.
	for _, bad := range []string{`{"Tools":[{"name":"x","outputSchema":{}}]}`, `{"tools":{}}`, `[]`, `{"tools":[{"name":"x","outputSchema":{}}]`, `null`} {
		s.onToolsList(json.RawMessage(bad), nil)
	}
	s.onToolsList(nil, json.RawMessage(`{"code":-32603,"message":"boom"}`))
	want["x"] = false
	check("unreadable results")

	// Bounds: names too long, and tools beyond the bound, are not learnt
	// (their denials keep structuredContent).
	var b strings.Builder
	b.WriteString(`{"tools":[`)
	long := strings.Repeat("n", enforce.MaxOutputSchemaToolName+1)
	fmt.Fprintf(&b, `{"name":%q,"outputSchema":{}}`, long)
	for i := range enforce.MaxOutputSchemaTools + 10 {
		fmt.Fprintf(&b, `,{"name":"t%d","outputSchema":{}}`, i)
	}
	b.WriteString(`]}`)
	fresh := &toolSchemas{}
	fresh.onToolsList(json.RawMessage(b.String()), nil)
	if fresh.declares(long) {
		t.Error("a name over MaxOutputSchemaToolName was learnt")
	}
	n := 0
	for i := range enforce.MaxOutputSchemaTools + 10 {
		if fresh.declares(fmt.Sprint("t", i)) {
			n++
		}
	}
	if n != enforce.MaxOutputSchemaTools {
		t.Errorf("%d tools learnt, want the bound %d", n, enforce.MaxOutputSchemaTools)
	}

	// Concurrent lists and denials (for the race detector).
	c := &toolSchemas{}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 200 {
				c.onToolsList(json.RawMessage(fmt.Sprintf(`{"tools":[{"name":"t%d","outputSchema":{}},{"name":"u"}]}`, (i+j)%16)), nil)
				c.declares(fmt.Sprintf("t%d", j%16))
			}
		})
	}
	wg.Wait()
	if !c.declares("t0") || c.declares("u") {
		t.Error("concurrent lists: t0 not learnt, or u learnt")
	}
}
