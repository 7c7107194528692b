package gateway

// End-to-end tests of the loop breaker: real redis-server, two gateway
// instances sharing it, the demo upstream (SDK sessions and SSE answers
// unless a test says otherwise), a real HTTP server as the alert webhook.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
)

// newBreakerEnv starts two gateways sharing redis (a new one when nil) with
// cfg after the store section.
func newBreakerEnv(t *testing.T, redis *testenv.Redis, cfg string, up upstream.Options) *env {
	t.Helper()
	if redis == nil {
		redis = testenv.StartRedis(t, nil)
	}
	return newEnv(t, setup{Redis: redis, Instances: 2, Upstream: up, Config: storeYAML(true) + cfg})
}

// agent is one caller: a token and, with a stateful upstream, the id of an
// SDK session it opened, which its raw calls carry.
type agent struct {
	t        *testing.T
	e        *env
	tok, sid string
	ids      atomic.Int64
}

// newAgent opens an SDK session (initialize) for tenant/subject on instance
// 0 unless stateless.
func newAgent(t *testing.T, e *env, tenant, subject string, stateless bool) *agent {
	t.Helper()
	a := &agent{t: t, e: e, tok: token(t, tenant, subject)}
	if !stateless {
		a.sid = connect(t, e.mcpURL(0), a.tok, "").ID()
		if a.sid == "" {
			t.Fatal("the SDK session has no id")
		}
	}
	return a
}

// call makes one raw tools/call through instance i.
func (a *agent) call(i int, tool string, args map[string]any) *response {
	a.t.Helper()
	r, err := a.callCtx(context.Background(), i, tool, args)
	if err != nil {
		a.t.Fatal(err)
	}
	return r
}

// post sends body, a raw JSON-RPC request, through instance i.
func (a *agent) post(i int, body string) *response {
	a.t.Helper()
	var hdr http.Header
	if a.sid != "" {
		hdr = http.Header{"Mcp-Session-Id": {a.sid}}
	}
	r, err := postCtx(context.Background(), a.e.mcpURL(i), a.tok, body, hdr)
	if err != nil {
		a.t.Fatal(err)
	}
	return r
}

func (a *agent) callCtx(ctx context.Context, i int, tool string, args map[string]any) (*response, error) {
	var hdr http.Header
	if a.sid != "" {
		hdr = http.Header{"Mcp-Session-Id": {a.sid}}
	}
	return postCtx(ctx, a.e.mcpURL(i), a.tok, callBody(a.ids.Add(1), tool, args), hdr)
}

// Arguments of calls whose arguments do not matter.
var (
	failArgs = map[string]any{"message": "boom"}
	echoArgs = map[string]any{"text": "hi"}
)

// mustPass fails unless r is a tool result that reached the upstream
// (isError results included).
func mustPass(t *testing.T, r *response, what string) {
	t.Helper()
	if r.Status != http.StatusOK || r.Msg.Error != nil || r.Msg.Result == nil {
		t.Fatalf("%s: %d %s, want a tool result", what, r.Status, r.Body)
	}
}

// mustDeny fails unless r is a 429 with data.scope scope; it returns
// Retry-After, checked against the body's retry_after_seconds.
func mustDeny(t *testing.T, r *response, scope, what string) int64 {
	t.Helper()
	if r.Status != http.StatusTooManyRequests || r.code() != CodeRateLimited {
		t.Fatalf("%s: %d %s, want 429 (scope %s)", what, r.Status, r.Body, scope)
	}
	d := r.denial(t)
	if d.Scope != scope {
		t.Fatalf("%s: scope %q (%s), want %q", what, d.Scope, r.Body, scope)
	}
	ra := intHeader(t, r.Header, "Retry-After")
	if ra < 1 || ra != d.RetryAfterSeconds {
		t.Fatalf("%s: Retry-After %d, retry_after_seconds %d: want equal and >= 1", what, ra, d.RetryAfterSeconds)
	}
	if scope == "breaker" && d.Rule != enforce.BreakerRule {
		t.Fatalf("%s: rule %q, want %q", what, d.Rule, enforce.BreakerRule)
	}
	return ra
}

// hook is an alert webhook: a real HTTP server recording the events POSTed
// to it. The first failFirst attempts answer 500; with hang, every request
// blocks until the client gives up or the test ends.
type hook struct {
	srv      *httptest.Server
	attempts atomic.Int64
	mu       sync.Mutex
	events   []BreakerEvent
	raw      []map[string]any
	times    []time.Time
}

func newHook(t *testing.T, failFirst int64, hang bool) *hook {
	h := &hook{}
	release := make(chan struct{})
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := h.attempts.Add(1)
		if hang {
			select {
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("webhook got %s with Content-Type %q", r.Method, r.Header.Get("Content-Type"))
		}
		if n <= failFirst {
			http.Error(w, "down for now", http.StatusInternalServerError)
			return
		}
		var ev BreakerEvent
		var raw map[string]any
		dec := json.NewDecoder(r.Body)
		if err := dec.Decode(&raw); err != nil {
			t.Errorf("webhook body: %v", err)
		}
		b, _ := json.Marshal(raw)
		_ = json.Unmarshal(b, &ev)
		h.mu.Lock()
		h.events, h.raw, h.times = append(h.events, ev), append(h.raw, raw), append(h.times, time.Now())
		h.mu.Unlock()
	}))
	t.Cleanup(h.srv.Close)
	t.Cleanup(func() { close(release) }) // runs first: hanging handlers return
	return h
}

// eventsFor returns the events received for breaker key.
func (h *hook) eventsFor(key string) (evs []BreakerEvent, raw []map[string]any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, ev := range h.events {
		if ev.Key == key {
			evs, raw = append(evs, ev), append(raw, h.raw[i])
		}
	}
	return evs, raw
}

// waitEvent waits for the one event of key and checks it.
func (h *hook) waitEvent(t *testing.T, key, tenant, subject, reason string, counts BreakerCounts, cooldown time.Duration) BreakerEvent {
	t.Helper()
	eventually(t, 5*time.Second, "the breaker event of "+key, func() bool { evs, _ := h.eventsFor(key); return len(evs) > 0 })
	time.Sleep(100 * time.Millisecond) // a duplicate would show up by now
	evs, raw := h.eventsFor(key)
	if len(evs) != 1 {
		t.Fatalf("%d events for %s, want exactly 1: %+v", len(evs), key, evs)
	}
	for _, f := range []string{"event", "tenant", "subject", "key", "reason", "counts", "opened_at", "until"} {
		if _, ok := raw[0][f]; !ok {
			t.Fatalf("event %v has no %q", raw[0], f)
		}
	}
	ev := evs[0]
	if ev.Event != "breaker_opened" || ev.Tenant != tenant || ev.Subject != subject || ev.Reason != reason || ev.Counts != counts {
		t.Fatalf("event %+v, want tenant %s subject %s reason %s counts %+v", ev, tenant, subject, reason, counts)
	}
	if d := ev.Until.Sub(ev.OpenedAt); d < cooldown-50*time.Millisecond || d > cooldown+50*time.Millisecond {
		t.Fatalf("event until - opened_at = %v, want the cooldown %v", d, cooldown)
	}
	if late := time.Since(ev.OpenedAt); late < 0 || late > 10*time.Second {
		t.Fatalf("event opened_at %v is %v from now", ev.OpenedAt, late)
	}
	return ev
}

// triggersConfig has every trigger on; each subtest fires one of them with
// its own subject (and tool, so that upstream counts stay apart).
const triggersConfig = `
tools:
  search:
    limits:
      - {name: search_cap, per: subject, algorithm: fixed_window, limit: 2, period: 1h}
breaker:
  consecutive_denials: 4
  consecutive_failures: 3
  identical_calls: {count: 5, within: 1m}
  cooldown: 30s
  alert_webhook: %s
`

// Each trigger opens the breaker after exactly its count, counted across two
// instances (calls alternate between them): the call after is refused with
// scope "breaker" and Retry-After = the cooldown left, on both instances and
// from a fresh SDK session, and the upstream sees nothing more. The webhook
// gets one event per breaker.
func TestBreakerTriggers(t *testing.T) {
	t.Parallel()
	h := newHook(t, 0, false)
	e := newBreakerEnv(t, nil, fmt.Sprintf(triggersConfig, h.srv.URL), upstream.Options{})
	const tenant = "acme"
	cases := []struct {
		name, subject, tool, reason string
		// args of the i-th call
		args func(i int) map[string]any
		// admitted before the trigger, then denied by the rate limit
		passed, limited int
		counts          BreakerCounts
	}{
		{"consecutive_denials", "den", "search", "consecutive_denials",
			func(i int) map[string]any { return map[string]any{"query": fmt.Sprint("q", i)} },
			2, 4, BreakerCounts{Denials: 4}},
		{"consecutive_failures", "fails", "fail", "consecutive_failures",
			func(i int) map[string]any { return map[string]any{"message": fmt.Sprint("boom ", i)} },
			3, 0, BreakerCounts{Failures: 3}},
		{"identical_calls", "ident", "echo", "identical_calls",
			func(int) map[string]any { return map[string]any{"text": "same again"} },
			5, 0, BreakerCounts{Identical: 5}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			a := newAgent(t, e, tenant, c.subject, false)
			i := 0
			for ; i < c.passed; i++ {
				var r *response
				if c.tool == "echo" && i%2 == 1 {
					// the same call spelled otherwise: same fingerprint
					r = a.post(i, fmt.Sprintf(`{"jsonrpc": "2.0", "method": "tools/call", "id": "x%d",
						"params": {"arguments": { "text" :  "same again" }, "name": "echo"}}`, i))
				} else {
					r = a.call(i, c.tool, c.args(i))
				}
				mustPass(t, r, fmt.Sprintf("call %d", i+1))
				if failed := isErrorResult(r.Msg.Result); failed != (c.tool == "fail") {
					t.Fatalf("call %d: isError %t: %s", i+1, failed, r.Body)
				}
			}
			for ; i < c.passed+c.limited; i++ {
				mustDeny(t, a.call(i, c.tool, c.args(i)), "subject", fmt.Sprintf("call %d", i+1))
			}
			opened := time.Now()
			ra := mustDeny(t, a.call(i, c.tool, c.args(i)), "breaker", fmt.Sprintf("call %d (after the trigger)", i+1))
			if ra < 29 || ra > 30 {
				t.Fatalf("Retry-After %d right after opening, want the cooldown left (30s)", ra)
			}
			if got := e.up.Calls(c.tool); got != int64(c.passed) {
				t.Fatalf("upstream saw %d %s calls, want exactly %d", got, c.tool, c.passed)
			}
			// Both instances refuse, with any arguments and any tool.
			for j := range 6 {
				mustDeny(t, a.call(j, c.tool, c.args(100+j)), "breaker", fmt.Sprintf("instance %d while open", j%2))
				mustDeny(t, a.call(j, "echo", map[string]any{"text": fmt.Sprint("other ", j)}), "breaker", "another tool while open")
			}
			// A fresh session (a new initialize through the SDK) does not escape.
			cs := connect(t, e.mcpURL(1), a.tok, "")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := callTool(ctx, cs, c.tool, c.args(200)); !isRateLimited(err) {
				t.Fatalf("fresh SDK session: %v, want 429", err)
			}
			fresh := &agent{t: t, e: e, tok: a.tok, sid: cs.ID()}
			ra = mustDeny(t, fresh.call(0, c.tool, c.args(201)), "breaker", "fresh session")
			if left := 30*time.Second - time.Since(opened); ra < int64(left/time.Second) || ra > 30 {
				t.Fatalf("Retry-After %d, want the cooldown left (%v)", ra, left)
			}
			if got := e.up.Calls(c.tool); got != int64(c.passed) {
				t.Fatalf("upstream saw %d %s calls after the breaker opened, want still %d", got, c.tool, c.passed)
			}
			h.waitEvent(t, keyspace.Breaker(tenant, "subject:"+c.subject), tenant, c.subject, c.reason, c.counts, 30*time.Second)
		})
	}
}

// An SDK client goes on as soon as it reads its answer from the SSE stream,
// before the gateway's handler returns: the failure that opens the breaker
// must be recorded before that answer is written, or the agent's next call
// slips through. Twenty agents, each on its own instance pair and session.
func TestBreakerFailureOpensBeforeTheAnswer(t *testing.T) {
	t.Parallel()
	// twenty sessions of one tenant: above the default initialize rule
	e := newBreakerEnv(t, nil, `
tiers:
  free:
    limits:
      - {name: inits, per: tenant, methods: [initialize], algorithm: token_bucket, limit: 100, period: 1m}
breaker:
  consecutive_failures: 3
  cooldown: 30s
`, upstream.Options{})
	const agents = 20
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for k := range agents {
		cs := connect(t, e.mcpURL(k), token(t, "acme", fmt.Sprint("sdk", k)), "")
		for i := range 3 {
			res, err := callTool(ctx, cs, "fail", map[string]any{"message": fmt.Sprint(i)})
			if err != nil || !res.IsError {
				t.Fatalf("agent %d, failure %d: %v %+v", k, i+1, err, res)
			}
		}
		if _, err := callTool(ctx, cs, "echo", echoArgs); !isRateLimited(err) {
			t.Fatalf("agent %d: the call after 3 failures: %v, want 429", k, err)
		}
	}
	if got := e.up.Calls("echo"); got != 0 {
		t.Fatalf("upstream saw %d echo calls, want 0", got)
	}
}

// After the cooldown exactly one probe goes through, however many callers
// race for it on both instances; its success closes the breaker. A failed
// probe reopens it for twice the cooldown, capped by max_cooldown. An
// identical-calls window that ran out starts over.
func TestBreakerHalfOpenProbe(t *testing.T) {
	t.Parallel()
	h := newHook(t, 0, false)
	e := newBreakerEnv(t, nil, fmt.Sprintf(`
breaker:
  consecutive_failures: 2
  identical_calls: {count: 3, within: 800ms}
  cooldown: 1s
  max_cooldown: 3s
  alert_webhook: %s
`, h.srv.URL), upstream.Options{})
	a := newAgent(t, e, "acme", "prober", false)
	n := 0
	msg := func() map[string]any { n++; return map[string]any{"message": fmt.Sprint("m", n)} }
	text := func() map[string]any { n++; return map[string]any{"text": fmt.Sprint("t", n)} }
	open := func(what string) int64 {
		t.Helper()
		mustPass(t, a.call(0, "fail", msg()), what+": failure 1")
		mustPass(t, a.call(1, "fail", msg()), what+": failure 2")
		return mustDeny(t, a.call(0, "echo", text()), "breaker", what)
	}
	if ra := open("opened"); ra != 1 {
		t.Fatalf("Retry-After %d, want 1 (cooldown 1s)", ra)
	}
	time.Sleep(time.Second + 50*time.Millisecond)

	// Half-open: 16 concurrent callers on both instances, one probe.
	const callers = 16
	slowBefore := e.up.Calls("slow")
	var start sync.WaitGroup
	start.Add(1)
	var mu sync.Mutex
	var passed []int
	var deniedRA []int64
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			start.Wait()
			r, err := a.callCtx(context.Background(), i, "slow", map[string]any{"ms": 800})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case r.Status == http.StatusOK && r.Msg.Error == nil:
				passed = append(passed, i)
			case r.Status == http.StatusTooManyRequests && r.denial(t).Scope == "breaker":
				deniedRA = append(deniedRA, intHeader(t, r.Header, "Retry-After"))
			default:
				t.Errorf("caller %d: %d %s", i, r.Status, r.Body)
			}
		})
	}
	start.Done()
	wg.Wait()
	if len(passed) != 1 || e.up.Calls("slow")-slowBefore != 1 {
		t.Fatalf("%d callers passed, upstream saw %d slow calls; want exactly one probe", len(passed), e.up.Calls("slow")-slowBefore)
	}
	t.Logf("callers refused while the probe ran were told Retry-After %v", deniedRA)
	// Its success closed the breaker: at once on the probe's instance, and
	// within the in-process hold on the other.
	mustPass(t, a.call(passed[0], "echo", text()), "after a successful probe, on its instance")
	closed := time.Now()
	eventually(t, 2*time.Second, "the other instance to see the breaker closed", func() bool {
		return a.call(passed[0]+1, "echo", text()).Status == http.StatusOK
	})
	if d := time.Since(closed); d > enforce.BreakerCacheHold+500*time.Millisecond {
		t.Fatalf("the other instance refused for %v after the breaker closed", d)
	}

	// Failed probes double the cooldown, up to max_cooldown.
	if ra := open("reopened"); ra != 1 {
		t.Fatalf("Retry-After %d after a close, want the base cooldown again (1)", ra)
	}
	for _, want := range []int64{2, 3} {
		time.Sleep(time.Duration(want-1)*time.Second + 50*time.Millisecond)
		failBefore := e.up.Calls("fail")
		r := a.call(1, "fail", msg())
		mustPass(t, r, "probe")
		if !isErrorResult(r.Msg.Result) || e.up.Calls("fail") != failBefore+1 {
			t.Fatalf("probe: %s", r.Body)
		}
		for j := range 2 {
			if ra := mustDeny(t, a.call(j, "echo", text()), "breaker", "after a failed probe"); ra != want {
				t.Fatalf("after a failed probe, instance %d: Retry-After %d, want %d", j, ra, want)
			}
		}
	}

	// identical_calls counts within a window: one that ran out starts over.
	w := newAgent(t, e, "acme", "windowed", false)
	same := map[string]any{"text": "again"}
	echoes := e.up.Calls("echo")
	mustPass(t, w.call(0, "echo", same), "identical 1")
	mustPass(t, w.call(1, "echo", same), "identical 2")
	time.Sleep(900 * time.Millisecond)
	for k := range 3 {
		mustPass(t, w.call(k, "echo", same), fmt.Sprintf("identical %d of a new window", k+1))
	}
	mustDeny(t, w.call(1, "echo", same), "breaker", "identical 4 of the new window")
	if got := e.up.Calls("echo") - echoes; got != 5 {
		t.Fatalf("upstream saw %d identical echoes, want 5", got)
	}

	// Every opening was alerted once, with its cooldown, and counted.
	key := keyspace.Breaker("acme", "subject:prober")
	want := []string{"consecutive_failures 1s", "consecutive_failures 1s", "probe_failed 2s", "probe_failed 3s"}
	var got []string
	eventually(t, 5*time.Second, "the alerts", func() bool {
		evs, _ := h.eventsFor(key)
		got = got[:0]
		for _, ev := range evs {
			got = append(got, fmt.Sprint(ev.Reason, " ", ev.Until.Sub(ev.OpenedAt).Round(100*time.Millisecond)))
		}
		return len(got) >= len(want)
	})
	if !slices.Equal(got, want) {
		t.Fatalf("alerts %q, want %q", got, want)
	}
	opened := map[string]float64{}
	for i := range e.base {
		for series, v := range scrape(t, e.base[i]) {
			if strings.HasPrefix(series, "mcpgate_breakers_opened_total") {
				opened[series] += v
			}
		}
	}
	wantOpened := map[string]float64{
		`mcpgate_breakers_opened_total{reason="consecutive_failures"}`: 2,
		`mcpgate_breakers_opened_total{reason="probe_failed"}`:         2,
		`mcpgate_breakers_opened_total{reason="identical_calls"}`:      1,
	}
	for series, n := range wantOpened {
		if opened[series] != n {
			t.Fatalf("metrics %v, want %v", opened, wantOpened)
		}
	}
}
