package gosdk_test

// The gateway's end-to-end scenarios, with the middleware in a go-sdk
// server and go-sdk clients over Streamable HTTP, each on the in-process
// store and on a real redis-server.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/gosdk"
	"github.com/mcpgate/mcpgate/usage"
)

// decodeStrict decodes data into v, refusing members v does not have.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// 40 concurrent calls from four sessions under a limit of 7: exactly 7
// reach the tool handler, the 33 others are denied with -33029.
func TestExactAdmission(t *testing.T) {
	t.Parallel()
	const (
		limit   = 7
		calls   = 40
		clients = 4
	)
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t, m.redis, fmt.Sprintf(`
tools:
  echo:
    limits:
      - {name: echo_cap, per: tenant_tool, algorithm: fixed_window, limit: %d, period: 1h}
`, limit), options{})
			tok := token(t, "acme", "alice")
			sessions := make([]*mcp.ClientSession, clients)
			for i := range sessions {
				sessions[i] = s.connect(tok)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var ok, limited atomic.Int64
			var mu sync.Mutex
			var other []error
			run(calls, calls, func(i int) {
				res, err := call(ctx, sessions[i%clients], "echo", map[string]any{"text": strconv.Itoa(i)})
				switch e := rpcError(err); {
				case err == nil && !res.IsError && resultText(res) == strconv.Itoa(i):
					ok.Add(1)
				case e != nil && e.Code == gosdk.CodeRateLimited:
					limited.Add(1)
				default:
					mu.Lock()
					other = append(other, fmt.Errorf("call %d: %v, %+v", i, err, res))
					mu.Unlock()
				}
			})
			if len(other) > 0 {
				t.Fatalf("%d calls failed otherwise, first: %v", len(other), other[0])
			}
			if got := s.reached("echo"); got != limit {
				t.Fatalf("the handler ran %d times, want exactly %d", got, limit)
			}
			if ok.Load() != limit || limited.Load() != calls-limit {
				t.Fatalf("admitted %d, rate-limited %d; want %d and %d", ok.Load(), limited.Load(), limit, calls-limit)
			}
		})
	}
}

// A monthly quota Q with a tool cost c admits exactly floor(Q/c) of many
// concurrent calls; the rest are denied with scope quota, and after the
// engine's Close (its final flush) the durable record holds exactly what
// reached the handler.
func TestExactQuota(t *testing.T) {
	t.Parallel()
	const (
		quota = 20
		cost  = 3
		calls = 24
		want  = quota / cost // 6
	)
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t, m.redis, fmt.Sprintf(`
default_tier: metered
tiers:
  metered:
    monthly_quota: %d
tools:
  echo:
    cost: %d
`, quota, cost), options{usage: true})
			cs := s.connect(token(t, "quota-co", "alice"))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var ok, denied atomic.Int64
			var mu sync.Mutex
			var bad []string
			run(8, calls, func(i int) {
				_, err := call(ctx, cs, "echo", map[string]any{"text": strconv.Itoa(i)})
				e := rpcError(err)
				switch {
				case err == nil:
					ok.Add(1)
				case e != nil && e.Code == gosdk.CodeRateLimited:
					var d enforce.Denial
					if json.Unmarshal(e.Data, &d) != nil || d.Scope != enforce.ScopeQuota || d.Rule != enforce.QuotaRule || d.Limit != quota {
						mu.Lock()
						bad = append(bad, string(e.Data))
						mu.Unlock()
					}
					denied.Add(1)
				default:
					mu.Lock()
					bad = append(bad, err.Error())
					mu.Unlock()
				}
			})
			if len(bad) > 0 {
				t.Fatalf("unexpected answers: %q", bad)
			}
			reached := s.reached("echo")
			if reached != want || ok.Load() != want || denied.Load() != calls-want {
				t.Fatalf("handler ran %d times, %d admitted, %d denied; want exactly %d admitted of %d", reached, ok.Load(), denied.Load(), want, calls)
			}
			u, _, _, err := s.engine.Usage(ctx, "quota-co", usage.Period(time.Now()))
			if err != nil || u.Used() != reached*cost || u.Calls != reached {
				t.Fatalf("engine.Usage = %+v, %v; want %d used in %d calls", u, err, reached*cost, reached)
			}
			if err := s.engine.Close(); err != nil { // the final flush
				t.Fatal(err)
			}
			rec := s.durable("quota-co")
			if rec.Used() != reached*cost || rec.NetCalls() != reached {
				t.Fatalf("durable record %+v; want %d used in %d calls (what reached the handler)", rec, reached*cost, reached)
			}
		})
	}
}

// A tool reporting its cost in _meta.usage.tokens (cost.from_result) is
// charged what it reports, not the estimate: the middleware settles the
// call with its marshalled result.
func TestCostFromResult(t *testing.T) {
	t.Parallel()
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t, m.redis, `
tools:
  llm:
    cost: {estimate: 100, from_result: _meta.usage.tokens}
`, options{usage: true})
			cs := s.connect(token(t, "llm-co", "alice"))
			ctx := context.Background()
			for range 2 {
				if _, err := call(ctx, cs, "llm", nil); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.engine.Close(); err != nil {
				t.Fatal(err)
			}
			if rec := s.durable("llm-co"); rec.Used() != 14 || rec.NetCalls() != 2 {
				t.Fatalf("durable record %+v; want 2 calls charged 7 each (reported), not the estimate 100", rec)
			}
		})
	}
}

// Consecutive failing calls open the loop breaker: the next call is denied
// with scope breaker and never reaches its handler.
func TestBreakerOpens(t *testing.T) {
	t.Parallel()
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t, m.redis, `
breaker:
  consecutive_failures: 3
  cooldown: 1m
`, options{})
			cs := s.connect(token(t, "loop-co", "looper"))
			ctx := context.Background()
			for i := range 3 {
				res, err := call(ctx, cs, "fail", nil)
				if err != nil || !res.IsError {
					t.Fatalf("failing call %d: %v, %+v; want an isError result", i+1, err, res)
				}
			}
			_, err := call(ctx, cs, "echo", map[string]any{"text": "x"})
			d := denial(t, err)
			if d.Scope != enforce.ScopeBreaker || d.Rule != enforce.BreakerRule || d.RetryAfterSeconds < 1 {
				t.Fatalf("denial %+v, want scope %q rule %q", d, enforce.ScopeBreaker, enforce.BreakerRule)
			}
			if s.reached("fail") != 3 || s.reached("echo") != 0 {
				t.Fatalf("handlers reached: fail %d, echo %d; want 3 and 0", s.reached("fail"), s.reached("echo"))
			}
			// The breaker is the subject's: another subject is not stopped.
			if _, err := call(ctx, s.connect(token(t, "loop-co", "other")), "echo", map[string]any{"text": "y"}); err != nil {
				t.Fatalf("another subject: %v", err)
			}
		})
	}
}

// While the breaker counts identical calls, a call whose arguments have no
// canonical form (a member spelled twice) is refused before its handler:
// each respelling of one call would otherwise escape the count.
func TestIdenticalCallsNeedCanonicalArguments(t *testing.T) {
	t.Parallel()
	s := newServer(t, false, `
breaker:
  identical_calls: {count: 3, within: 1m}
`, options{})
	cs := s.connect(token(t, "loop-co", "looper"))
	ctx := context.Background()
	twice := json.RawMessage(`{"text":"x","text":"x"}`)
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: twice})
	if e := rpcError(err); e == nil || e.Code != jsonrpc.CodeInvalidParams || !strings.Contains(e.Message, "canonical") {
		t.Fatalf("call with a member spelled twice: %v; want invalid params", err)
	}
	if _, err := call(ctx, cs, "echo", map[string]any{"text": "x"}); err != nil {
		t.Fatalf("canonical call: %v", err)
	}
	if n := s.reached("echo"); n != 1 {
		t.Fatalf("echo's handler ran %d times, want 1 (the canonical call)", n)
	}
}

// N concurrent identical calls of a cacheable tool: its handler runs once,
// every caller gets its answer, and a later identical call is a hit.
func TestCacheSingleFlight(t *testing.T) {
	t.Parallel()
	const n = 12
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t, m.redis, `
tools:
  slow:
    cache: {ttl: 10m}
`, options{})
			release := make(chan struct{})
			s.setRelease(release)
			sessions := []*mcp.ClientSession{s.connect(token(t, "cache-co", "a")), s.connect(token(t, "cache-co", "b"))}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := range n {
				wg.Go(func() {
					res, err := call(ctx, sessions[i%2], "slow", map[string]any{"key": "k"})
					if err == nil && resultText(res) != "slow k" {
						err = fmt.Errorf("answer %q", resultText(res))
					}
					errs <- err
				})
			}
			allDone := make(chan struct{})
			go func() { wg.Wait(); close(allDone) }()
			select {
			case <-s.started: // the one load is running: let the others join it
				time.Sleep(100 * time.Millisecond)
			case <-allDone: // every call failed before the handler
			}
			close(release)
			<-allDone
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if got := s.reached("slow"); got != 1 {
				t.Fatalf("the handler ran %d times for %d identical concurrent calls, want once", got, n)
			}
			if _, err := call(ctx, sessions[0], "slow", map[string]any{"key": "k"}); err != nil {
				t.Fatal(err)
			}
			if got := s.reached("slow"); got != 1 {
				t.Fatalf("a later identical call reached the handler (%d runs): not served from the cache", got)
			}
			// Another tenant has its own entry.
			if _, err := call(ctx, s.connect(token(t, "other-co", "a")), "slow", map[string]any{"key": "k"}); err != nil {
				t.Fatal(err)
			}
			if got := s.reached("slow"); got != 2 {
				t.Fatalf("another tenant's call: the handler ran %d times in all, want 2", got)
			}
		})
	}
}

// A denial is a JSON-RPC error with code -33029, the gateway's message and
// data with exactly the gateway's fields.
func TestDenialData(t *testing.T) {
	t.Parallel()
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t, m.redis, `
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: 2, period: 1h}
`, options{})
			cs := s.connect(token(t, "deny-co", "alice"))
			ctx := context.Background()
			for range 2 {
				if _, err := call(ctx, cs, "echo", map[string]any{"text": "x"}); err != nil {
					t.Fatal(err)
				}
			}
			_, err := call(ctx, cs, "echo", map[string]any{"text": "x"})
			d := denial(t, err)
			if d.Scope != "tenant" || d.Rule != "per_tenant" || d.Limit != 2 || d.Remaining != 0 || d.RetryAfterSeconds < 1 || d.RetryAfterSeconds > 3600 {
				t.Fatalf("denial data %+v", d)
			}
			want := fmt.Sprintf(`rate limit exceeded (tenant rule "per_tenant"); retry in %ds`, d.RetryAfterSeconds)
			if msg := rpcError(err).Message; msg != want {
				t.Fatalf("message %q, want %q", msg, want)
			}
			var raw map[string]json.RawMessage
			if err := json.Unmarshal(rpcError(err).Data, &raw); err != nil || len(raw) != 5 {
				t.Fatalf("data %s: want exactly scope, rule, limit, remaining, retry_after_seconds", rpcError(err).Data)
			}
			if s.reached("echo") != 2 {
				t.Fatalf("the handler ran %d times, want 2", s.reached("echo"))
			}
		})
	}
}

// Under deny_as: result a denied tools/call is a tool result: isError, a
// text for the model and the denial as structuredContent. Other methods are
// still denied with -33029.
func TestDenyAsResult(t *testing.T) {
	t.Parallel()
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t, m.redis, `
tiers:
  free:
    deny_as: result
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: 1, period: 1h}
      - {name: lists, per: tenant, methods: [tools/list], algorithm: fixed_window, limit: 1, period: 1h}
`, options{})
			cs := s.connect(token(t, "result-co", "alice"))
			ctx := context.Background()
			if _, err := call(ctx, cs, "echo", map[string]any{"text": "x"}); err != nil {
				t.Fatal(err)
			}
			res, err := call(ctx, cs, "echo", map[string]any{"text": "x"})
			if err != nil {
				t.Fatalf("denied call under deny_as: result: %v, want a result", err)
			}
			if !res.IsError || !hasAll(resultText(res), "Rate limit reached", `"per_tenant"`, "retry in") {
				t.Fatalf("result %+v (%q), want isError with the denial's text", res, resultText(res))
			}
			b, _ := json.Marshal(res.StructuredContent)
			var d enforce.Denial
			if err := decodeStrict(b, &d); err != nil || d.Scope != "tenant" || d.Rule != "per_tenant" || d.Limit != 1 || d.Remaining != 0 || d.RetryAfterSeconds < 1 {
				t.Fatalf("structuredContent %s (%v)", b, err)
			}
			if s.reached("echo") != 1 {
				t.Fatalf("the handler ran %d times, want 1", s.reached("echo"))
			}
			if _, err := cs.ListTools(ctx, nil); err != nil {
				t.Fatal(err)
			}
			_, err = cs.ListTools(ctx, nil)
			if d := denial(t, err); d.Rule != "lists" {
				t.Fatalf("tools/list denial %+v, want rule lists", d)
			}
		})
	}
}

// A cancelled call is settled: its concurrency slot is released, so the
// next call is admitted.
func TestCancelledCallReleasesSlot(t *testing.T) {
	t.Parallel()
	for _, m := range storeModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t, m.redis, `
tools:
  slow:
    limits:
      - {name: one_at_a_time, per: tenant_tool, algorithm: concurrency, limit: 1, period: 10m}
`, options{})
			s.setRelease(make(chan struct{})) // never closed: the first call waits until cancelled
			cs := s.connect(token(t, "cancel-co", "alice"))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := call(ctx, cs, "slow", map[string]any{"key": "first"})
				done <- err
			}()
			select {
			case <-s.started:
			case err := <-done:
				t.Fatalf("the first call ended before its handler started: %v", err)
			}
			// While it runs, a second call finds the slot taken.
			_, err := call(context.Background(), cs, "slow", map[string]any{"key": "second"})
			if d := denial(t, err); d.Rule != "one_at_a_time" {
				t.Fatalf("denial %+v", d)
			}
			cancel()
			if err := <-done; err == nil {
				t.Fatal("the cancelled call succeeded")
			}
			// notifications/cancelled reaches the server asynchronously: poll
			// until the slot is free (no bound other than the test's).
			s.setRelease(nil)
			for {
				_, err := call(context.Background(), cs, "slow", map[string]any{"key": "third", "ms": 0})
				if err == nil {
					break
				}
				if d := denial(t, err); d.Rule != "one_at_a_time" {
					t.Fatalf("denial %+v", d)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// A store that fails under on_error: closed answers -33503 without running
// the handler.
func TestStoreDownClosed(t *testing.T) {
	t.Parallel()
	s := newServer(t, true, `
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: 100, period: 1h}
`, options{})
	cs := s.connect(token(t, "down-co", "alice"))
	ctx := context.Background()
	if _, err := call(ctx, cs, "echo", map[string]any{"text": "x"}); err != nil {
		t.Fatal(err)
	}
	s.redis.Kill()
	_, err := call(ctx, cs, "echo", map[string]any{"text": "x"})
	if e := rpcError(err); e == nil || e.Code != gosdk.CodeUnavailable {
		t.Fatalf("call with the store down: %v, want code %d", err, gosdk.CodeUnavailable)
	}
	if s.reached("echo") != 1 {
		t.Fatalf("the handler ran %d times, want 1", s.reached("echo"))
	}
}

// Without a valid bearer token the HTTP handler answers 401 with a Bearer
// challenge; in process, a request without TokenInfo is refused by the
// default Identity with -33001.
func TestUnauthenticated(t *testing.T) {
	t.Parallel()
	s := newServer(t, false, "", options{})
	expired := claims("acme", "alice", "tools:*")
	expired["exp"] = time.Now().Add(-time.Hour).Unix()
	for name, tok := range map[string]string{"none": "", "garbage": "not-a-jwt", "expired": sign(t, expired)} {
		req, err := http.NewRequest(http.MethodPost, s.url, bytes.NewReader([]byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") != `Bearer realm="mcpgate"` {
			t.Errorf("%s token: %d, WWW-Authenticate %q; want 401 with a Bearer challenge", name, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
	}

	srv := mcp.NewServer(&mcp.Implementation{Name: "in-process", Version: "1"}, nil)
	srv.AddReceivingMiddleware(gosdk.Middleware(s.engine, nil))
	serverEnd, clientEnd := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := srv.Connect(ctx, serverEnd, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	_, err = mcp.NewClient(&mcp.Implementation{Name: "c", Version: "1"}, nil).Connect(ctx, clientEnd, nil)
	if e := rpcError(err); e == nil || e.Code != gosdk.CodeUnauthorized {
		t.Fatalf("initialize without TokenInfo: %v, want code %d", err, gosdk.CodeUnauthorized)
	}
}

// A custom Options.Identity may return any tenant: one the engine cannot
// meter (empty, not valid UTF-8, too long) is refused with -33001, the tool
// not run nor charged, rather than answered as a rate limit (-33029) or
// billed to no one or to another tenant.
func TestInvalidTenantFromIdentity(t *testing.T) {
	t.Parallel()
	s := newServer(t, false, "", options{})
	for name, tenant := range map[string]string{"empty": "", "invalid UTF-8": "acme\xff", "too long": strings.Repeat("t", 257)} {
		srv := mcp.NewServer(&mcp.Implementation{Name: "in-process", Version: "1"}, nil)
		s.addTools(srv)
		srv.AddReceivingMiddleware(gosdk.Middleware(s.engine, &gosdk.Options{
			Identity: func(_ context.Context, req mcp.Request) (gosdk.Identity, error) {
				if _, ok := req.(*mcp.CallToolRequest); ok {
					return gosdk.Identity{Tenant: tenant, Subject: "alice"}, nil
				}
				return gosdk.Identity{Tenant: "acme", Subject: "alice"}, nil
			},
		}))
		serverEnd, clientEnd := mcp.NewInMemoryTransports()
		ctx := t.Context()
		ss, err := srv.Connect(ctx, serverEnd, nil)
		if err != nil {
			t.Fatal(err)
		}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "1"}, nil).Connect(ctx, clientEnd, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = call(ctx, cs, "echo", map[string]any{"text": "hi"})
		if e := rpcError(err); e == nil || e.Code != gosdk.CodeUnauthorized {
			t.Errorf("%s tenant: tools/call = %v, want code %d", name, err, gosdk.CodeUnauthorized)
		}
		cs.Close()
		ss.Close()
	}
	if n := s.reached("echo"); n != 0 {
		t.Fatalf("the tool ran %d times for invalid tenants", n)
	}
}

// Scopes: a tool outside the caller's scopes is refused with -33003 without
// reaching its handler or being charged, and hidden from tools/list.
func TestScopes(t *testing.T) {
	t.Parallel()
	s := newServer(t, false, `
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: 1, period: 1h}
`, options{})
	cs := s.connect(sign(t, claims("scoped-co", "alice", "tools:echo")))
	ctx := context.Background()
	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Tools) != 1 || list.Tools[0].Name != "echo" {
		var names []string
		for _, tl := range list.Tools {
			names = append(names, tl.Name)
		}
		t.Fatalf("tools/list shows %q, want only echo", names)
	}
	_, err = call(ctx, cs, "fail", nil)
	e := rpcError(err)
	if e == nil || e.Code != gosdk.CodeForbidden || string(e.Data) != `{"tool":"fail"}` {
		t.Fatalf("call outside the scopes: %v, want code %d with data {\"tool\":\"fail\"}", err, gosdk.CodeForbidden)
	}
	// The refused call was not charged: the one call of the limit is left.
	if _, err := call(ctx, cs, "echo", map[string]any{"text": "x"}); err != nil {
		t.Fatalf("the allowed tool after a refused one: %v", err)
	}
	if s.reached("fail") != 0 || s.reached("echo") != 1 {
		t.Fatalf("handlers reached: fail %d, echo %d", s.reached("fail"), s.reached("echo"))
	}
}
