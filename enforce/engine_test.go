package enforce_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/sqlite"
	"github.com/redis/rueidis"
)

// engines builds n engines on one store: the in-process store (n must be
// 1), or one real redis-server or 6-node Redis Cluster shared by all of
// them, as gateway instances and Go MCP servers share it. On the Cluster
// the global rules live in their own slot: a layered request goes out as
// two halves together. With a usage path, all meter into one
// SQLite file.
func engines(t *testing.T, store string, n int, yaml, usagePath string) []*enforce.Engine {
	t.Helper()
	cfg, err := policy.Parse("engine_test.yaml", []byte("upstream: {url: \"http://127.0.0.1:1/mcp\"}\nauth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}\nstore: {timeout: 10s}\n"+yaml))
	if err != nil {
		t.Fatal(err)
	}
	var us usage.Store
	if usagePath != "" {
		s, err := sqlite.Open(usagePath)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		us = s
	}
	var connect func() rueidis.Client
	switch store {
	case "redis":
		redis := testenv.StartRedis(t, nil)
		connect = func() rueidis.Client { return redis.Client(t) }
	case "cluster":
		cluster := testenv.StartCluster(t)
		connect = func() rueidis.Client { return cluster.Client(t) }
	default:
		if n != 1 {
			t.Fatal("the in-process store serves one engine")
		}
	}
	out := make([]*enforce.Engine, n)
	for i := range out {
		opts := enforce.Options{Config: cfg, Usage: us}
		if connect != nil {
			client := connect()
			st, err := redisstore.New(client, &redisstore.Options{Timeout: cfg.Store.Timeout})
			if err != nil {
				t.Fatal(err)
			}
			opts.Shared = st
			opts.Probe = func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() }
		}
		e, err := enforce.New(opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		out[i] = e
	}
	return out
}

var stores = []string{"memory", "redis", "cluster"}

// run admits call on the engines round robin from callers goroutines,
// calls work for each admitted call, settles it with outcome, and returns
// how many were admitted.
func run(t *testing.T, es []*enforce.Engine, callers int, call enforce.Call, work func() enforce.Outcome) int64 {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			e := es[i%len(es)]
			ticket, d := e.Admit(t.Context(), call)
			if d.Unavailable || d.Degraded != "" {
				// Exactness holds while the store answers (a generous
				// store.timeout above): a degraded decision is another test.
				t.Errorf("decision degraded: %+v", d)
			}
			if !d.Allowed {
				ticket.Done(t.Context(), enforce.Outcome{})
				return
			}
			admitted.Add(1)
			ticket.Done(t.Context(), work())
		})
	}
	wg.Wait()
	return admitted.Load()
}

// Layered rules across engines: exactly the tenant's limit is admitted
// under concurrency, and a global denial charges nothing (all or nothing):
// the tenant counters of a call the global rule refused are untouched.
// Concurrent callers stay at or below the global limit in the concurrent
// phase: on a Cluster a global half charged by a call whose tenant half
// was denied is given back a round trip later, and a concurrent call can
// be refused by that charge (never admitted past a limit).
func TestExactAdmissionAcrossEngines(t *testing.T) {
	t.Parallel()
	for _, store := range stores {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			n := 1
			if store != "memory" {
				n = 3
			}
			es := engines(t, store, n, `
global:
  - {name: all, algorithm: fixed_window, limit: 20, period: 1h}
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: 9, period: 1h}
      - {name: per_tool, per: tenant_tool, algorithm: token_bucket, limit: 100, period: 1h}
`, "")
			var reached atomic.Int64
			work := func() enforce.Outcome { reached.Add(1); return enforce.Outcome{} }
			acme := enforce.Call{Tenant: "acme", Subject: "a", Name: "search"}
			if got := run(t, es, 20, acme, work); got != 9 || reached.Load() != 9 {
				t.Fatalf("acme: %d admitted, %d reached the work; want exactly 9 (its tenant limit)", got, reached.Load())
			}
			globex := enforce.Call{Tenant: "globex", Subject: "b", Name: "search"}
			if got := run(t, es, 11, globex, work); got != 9 {
				t.Fatalf("globex: %d admitted, want 9", got)
			}
			// Two left under the global rule: initech gets them, then each
			// call is denied by the global rule without touching initech's
			// own counters.
			initech := enforce.Call{Tenant: "initech", Subject: "c", Name: "search"}
			for i := range 6 {
				ticket, d := es[i%len(es)].Admit(t.Context(), initech)
				ticket.Done(t.Context(), enforce.Outcome{})
				if want := i < 2; d.Allowed != want || (!want && d.Scope != "global") {
					t.Fatalf("initech call %d: %+v, want allowed %v (then global denials)", i, d, want)
				}
			}
			cs, err := es[0].Counters(t.Context(), "free", "initech", "c")
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				if c.Rule.Name == "per_tenant" && c.Result.Remaining != 7 {
					t.Fatalf("initech per_tenant: %d remaining, want 7 (global denials charged nothing)", c.Result.Remaining)
				}
			}
			if got := reached.Load(); got != 18 {
				t.Fatalf("%d calls reached the work, want 18", got)
			}
		})
	}
}

// A monthly quota of Q with a tool cost c admits exactly Q/c calls across
// engines, and after Close the durable usage equals what ran.
func TestExactQuotaAndDurableUsage(t *testing.T) {
	t.Parallel()
	for _, store := range stores {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			n := 1
			if store != "memory" {
				n = 2
			}
			path := filepath.Join(t.TempDir(), "usage.db")
			es := engines(t, store, n, `
tiers:
  free:
    monthly_quota: 20
tools:
  llm: {cost: 3}
`, path)
			var reached atomic.Int64
			got := run(t, es, 40, enforce.Call{Tenant: "acme", Subject: "a", Name: "llm"}, func() enforce.Outcome {
				reached.Add(1)
				return enforce.Outcome{}
			})
			if got != 6 || reached.Load() != 6 {
				t.Fatalf("%d admitted (%d ran), want 6 = floor(20/3)", got, reached.Load())
			}
			_, d := es[0].Admit(t.Context(), enforce.Call{Tenant: "acme", Subject: "a", Name: "llm"})
			if d.Allowed || d.Scope != enforce.ScopeQuota || d.Limit.Rule.Name != enforce.QuotaRule {
				t.Fatalf("past the quota: %+v, want a quota denial", d)
			}
			for _, e := range es {
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
			}
			s, err := sqlite.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			rec, ok, err := s.Get(t.Context(), "acme", usage.Period(time.Now()))
			if err != nil || !ok {
				t.Fatalf("durable usage: %v %v", ok, err)
			}
			if rec.Usage.Used() != 18 || rec.Usage.NetCalls() != 6 {
				t.Fatalf("durable usage %+v: used %d, calls %d; want 18 and 6", rec.Usage, rec.Usage.Used(), rec.Usage.NetCalls())
			}
		})
	}
}

// The loop breaker opens after consecutive failures and then refuses the
// agent's calls without running them; a cancelled call is no failure.
func TestBreakerOpensOnFailures(t *testing.T) {
	t.Parallel()
	for _, store := range stores {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			es := engines(t, store, 1, `
breaker:
  consecutive_failures: 3
  cooldown: 1h
`, "")
			e := es[0]
			call := enforce.Call{Tenant: "acme", Subject: "loopy", Name: "flaky"}
			for i := range 5 {
				ticket, d := e.Admit(t.Context(), call)
				if !d.Allowed {
					t.Fatalf("call %d denied before three failures: %+v", i, d)
				}
				status := enforce.ToolError
				if i%2 == 1 {
					status = enforce.Cancelled // says nothing of the agent
				}
				ticket.Done(t.Context(), enforce.Outcome{Status: status})
			}
			_, d := e.Admit(t.Context(), call)
			if d.Allowed || d.Scope != enforce.ScopeBreaker || d.Limit.Rule.Name != enforce.BreakerRule {
				t.Fatalf("after three failures: %+v, want the breaker's denial", d)
			}
			if _, d := e.Admit(t.Context(), enforce.Call{Tenant: "acme", Subject: "other", Name: "flaky"}); !d.Allowed {
				t.Fatalf("another subject was refused: %+v", d)
			}
		})
	}
}

// parseConfig parses the config yaml with auth added.
func parseConfig(t *testing.T, yaml string) *policy.Config {
	t.Helper()
	cfg, err := policy.Parse("x.yaml", []byte("auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}\n"+yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// newEngine starts an engine on o with the config yaml (auth added), closed
// when the test ends.
func newEngine(t *testing.T, yaml string, o enforce.Options) *enforce.Engine {
	t.Helper()
	o.Config = parseConfig(t, yaml)
	e, err := enforce.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// mustAdmit admits call on e, failing the test on a denial.
func mustAdmit(t *testing.T, e *enforce.Engine, call enforce.Call) *enforce.Ticket {
	t.Helper()
	ticket, d := e.Admit(t.Context(), call)
	if !d.Allowed {
		t.Fatalf("denied: %+v", d)
	}
	return ticket
}

// Two calls admitted together, the later one failing first: the earlier
// one's success resets the count, although it saw no failure on admission,
// so fail, succeed, fail does not open a breaker of two.
func TestBreakerSuccessAfterAnOverlappingFailure(t *testing.T) {
	t.Parallel()
	for _, store := range stores {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			e := engines(t, store, 1, `
breaker:
  consecutive_failures: 2
  cooldown: 1h
`, "")[0]
			call := enforce.Call{Tenant: "acme", Subject: "agent", Name: "flaky"}
			admit := func() *enforce.Ticket { return mustAdmit(t, e, call) }
			a, b := admit(), admit()
			b.Done(t.Context(), enforce.Outcome{Status: enforce.ToolError})
			a.Done(t.Context(), enforce.Outcome{Status: enforce.OK})
			admit().Done(t.Context(), enforce.Outcome{Status: enforce.ToolError})
			if _, d := e.Admit(t.Context(), call); !d.Allowed {
				t.Fatalf("fail, succeed, fail opened a breaker of two consecutive failures: %+v", d)
			}
			// Two in a row still open it.
			admit().Done(t.Context(), enforce.Outcome{Status: enforce.ToolError})
			if _, d := e.Admit(t.Context(), call); d.Allowed || d.Scope != enforce.ScopeBreaker {
				t.Fatalf("after two failures in a row: %+v, want the breaker's denial", d)
			}
		})
	}
}

// An answer that comes after its caller gave up (Answered with a context
// that has ended) says nothing of the agent: the breaker counts no
// failure.
func TestAnswerAfterTheCallerLeftIsNoFailure(t *testing.T) {
	t.Parallel()
	for _, store := range stores {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			e := engines(t, store, 1, `
breaker:
  consecutive_failures: 2
  cooldown: 1h
`, "")[0]
			call := enforce.Call{Tenant: "acme", Subject: "loopy", Name: "flaky"}
			for i := range 3 {
				ticket, d := e.Admit(t.Context(), call)
				if !d.Allowed {
					t.Fatalf("call %d denied: %+v; an answer its caller left before counted as a failure", i, d)
				}
				left, leave := context.WithCancel(t.Context())
				leave()
				ticket.Answered(left, json.RawMessage(`{"content":[],"isError":true}`), true)
				ticket.Done(t.Context(), enforce.Outcome{Status: enforce.Abandoned})
			}
			// The same answers while the caller waits open it.
			for range 2 {
				ticket, _ := e.Admit(t.Context(), call)
				ticket.Answered(t.Context(), json.RawMessage(`{"content":[],"isError":true}`), true)
				ticket.Done(t.Context(), enforce.Outcome{Status: enforce.ToolError})
			}
			if _, d := e.Admit(t.Context(), call); d.Allowed || d.Scope != enforce.ScopeBreaker {
				t.Fatalf("after two failures its caller saw: %+v, want the breaker's denial", d)
			}
		})
	}
}

// A tool whose cost is corrected from its result is charged what it
// reported, and Done says so.
func TestCostCorrection(t *testing.T) {
	t.Parallel()
	es := engines(t, "memory", 1, `
usage: {flush_interval: 1h}
tiers:
  free:
    monthly_quota: 1000
tools:
  llm: {cost: {estimate: 100, from_result: "_meta.usage.tokens"}}
`, filepath.Join(t.TempDir(), "usage.db"))
	e := es[0]
	ticket, d := e.Admit(t.Context(), enforce.Call{Tenant: "acme", Subject: "a", Name: "llm"})
	if !d.Allowed || d.Cost != 100 || !ticket.WantsAnswer() {
		t.Fatalf("admission: %+v (wants answer %v)", d, ticket.WantsAnswer())
	}
	result := json.RawMessage(`{"content":[],"_meta":{"usage":{"tokens":42}}}`)
	ticket.Answered(t.Context(), result, false)
	if got := ticket.Done(t.Context(), enforce.Outcome{Status: enforce.OK}); got != 42 {
		t.Fatalf("Done charged %d, want 42", got)
	}
	u, _, live, err := e.Usage(t.Context(), "acme", usage.Period(time.Now()))
	if err != nil || !live || u.Used() != 42 {
		t.Fatalf("usage %+v live %v err %v: want 42 used", u, live, err)
	}
}

// Admit and Done are safe to call in any state: Done on a denied ticket
// does nothing, a second Done does nothing, and a ticket's session lease
// is empty for a tool call.
func TestTicketContract(t *testing.T) {
	t.Parallel()
	es := engines(t, "memory", 1, `
tiers:
  free:
    limits:
      - {name: one, per: tenant, algorithm: concurrency, limit: 1, period: 1m}
`, "")
	e := es[0]
	call := enforce.Call{Tenant: "acme", Subject: "a", Name: "slow"}
	first, d := e.Admit(t.Context(), call)
	if !d.Allowed {
		t.Fatal(d)
	}
	second, d := e.Admit(t.Context(), call)
	if d.Allowed {
		t.Fatal("a second concurrent call was admitted under a concurrency limit of 1")
	}
	second.Done(t.Context(), enforce.Outcome{}) // denied: nothing to release
	if slots := first.SessionSlots(); slots.Held() {
		t.Fatalf("a tool call holds session slots under lease %q", slots.Lease())
	}
	first.Done(t.Context(), enforce.Outcome{})
	first.Done(t.Context(), enforce.Outcome{}) // once only
	third, d := e.Admit(t.Context(), call)
	if !d.Allowed {
		t.Fatalf("the slot was not released by Done: %+v", d)
	}
	third.Done(t.Context(), enforce.Outcome{})
}

// Done returns the cost the call was charged in the end, however often it
// is called: nothing for a call the quota denied (it used to return the
// tool's cost), and the corrected cost, not the estimate, for a Done
// repeated after a correction.
func TestDoneReturnsTheCostCharged(t *testing.T) {
	e := newEngine(t, `upstream: {url: "http://127.0.0.1:1/mcp"}
usage: {flush_interval: 1h}
tiers:
  free: {monthly_quota: 8}
default_tier: free
tools:
  llm: {cost: 3}
`, enforce.Options{Usage: openSQLite(t)})
	ctx := t.Context()
	tk := mustAdmit(t, e, acmeCall)
	if got := tk.Done(ctx, enforce.Outcome{Cost: 5}); got != 5 {
		t.Errorf("Done of a call corrected to 5 returned %d", got)
	}
	if got := tk.Done(ctx, enforce.Outcome{}); got != 5 {
		t.Errorf("Done repeated after a correction to 5 returned %d, want 5", got)
	}
	tk = mustAdmit(t, e, acmeCall)
	if got := tk.Done(ctx, enforce.Outcome{}); got != 3 {
		t.Errorf("Done of a call charged its cost of 3 returned %d", got)
	}
	tk, d := e.Admit(ctx, acmeCall) // 8 used: the quota denies
	if d.Allowed {
		t.Fatal("a call admitted past the quota")
	}
	if got := tk.Done(ctx, enforce.Outcome{}); got != 0 {
		t.Errorf("Done of a call the quota denied returned %d charged, want 0", got)
	}
}

// Every method other than tools/call is counted by the rules that name it,
// and an initialize takes the session slots (kept past the call).
func TestMethodsAndSessionSlots(t *testing.T) {
	t.Parallel()
	es := engines(t, "memory", 1, `
sessions: {max_per_tenant: 5, max_per_subject: 2}
tiers:
  free:
    limits:
      - {name: lists, per: tenant, methods: [tools/list], algorithm: fixed_window, limit: 2, period: 1h}
`, "")
	e := es[0]
	for i := range 3 {
		ticket, d := e.Admit(t.Context(), enforce.Call{Tenant: "acme", Subject: "a", Method: "tools/list", Name: "tools/list"})
		ticket.Done(t.Context(), enforce.Outcome{})
		if want := i < 2; d.Allowed != want {
			t.Fatalf("tools/list %d: allowed %v, want %v", i, d.Allowed, want)
		}
	}
	var sessions []enforce.SessionSlots
	for i := range 3 {
		ticket, d := e.Admit(t.Context(), enforce.Call{Tenant: "acme", Subject: "a", Method: "initialize", Name: "initialize"})
		ticket.Done(t.Context(), enforce.Outcome{})
		if i == 2 {
			if d.Allowed || d.Limit.Rule.Name != enforce.RuleSessionsSubject || ticket.SessionSlots().Held() {
				t.Fatalf("third session of one subject: %+v, want %s and no slots", d, enforce.RuleSessionsSubject)
			}
			continue
		}
		slots := ticket.SessionSlots()
		if !d.Allowed || !slots.Held() {
			t.Fatalf("session %d: %+v, lease %q", i, d, slots.Lease())
		}
		sessions = append(sessions, slots)
	}
	// Slots found by their lease (another request of the session) are the
	// same slots: renewing them holds, and once released they are gone.
	again := e.SessionSlotsOf("acme", "a", sessions[0].Lease())
	for _, check := range []func(context.Context) (bool, error){again.Renew, again.Check, sessions[0].Renew} {
		if held, err := check(t.Context()); err != nil || !held {
			t.Fatalf("a live session's slots: held %v, %v", held, err)
		}
	}
	again.Release(t.Context())
	if held, err := sessions[0].Renew(t.Context()); err != nil || held {
		t.Fatalf("released slots: held %v, %v; want gone", held, err)
	}
	if held, _ := (enforce.SessionSlots{}).Renew(t.Context()); held {
		t.Fatal("the zero SessionSlots holds something")
	}
	ticket, d := e.Admit(t.Context(), enforce.Call{Tenant: "acme", Subject: "a", Method: "initialize", Name: "initialize"})
	ticket.Done(t.Context(), enforce.Outcome{})
	if !d.Allowed {
		t.Fatalf("after a session ended: %+v", d)
	}
}

// A shared store that fails follows each tool's on_error: open admits,
// closed is unavailable, local decides in process with the same rules.
func TestStoreFailurePolicies(t *testing.T) {
	t.Parallel()
	redis := testenv.StartRedis(t, nil)
	cfg, err := policy.Parse("engine_test.yaml", []byte(`
upstream: {url: "http://127.0.0.1:1/mcp"}
auth: {jwt: {hs256_secret_env: ENGINE_TEST_SECRET}}
store: {on_error: open}
tiers:
  free:
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 2, period: 1h}
tools:
  shut: {on_error: closed}
  here: {on_error: local}
`))
	if err != nil {
		t.Fatal(err)
	}
	client := redis.Client(t)
	st, err := redisstore.New(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforce.New(enforce.Options{Config: cfg, Shared: st,
		Probe: func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	redis.Kill()
	admit := func(tool string) enforce.Decision {
		ticket, d := e.Admit(t.Context(), enforce.Call{Tenant: "acme", Subject: "a", Name: tool})
		ticket.Done(t.Context(), enforce.Outcome{})
		return d
	}
	for i := range 4 {
		if d := admit("open"); !d.Allowed || d.Degraded != policy.FailOpen {
			t.Fatalf("open %d: %+v", i, d)
		}
		if d := admit("shut"); d.Allowed || !d.Unavailable {
			t.Fatalf("closed %d: %+v", i, d)
		}
		if d := admit("here"); d.Allowed != (i < 2) || d.Degraded != policy.FailLocal {
			t.Fatalf("local %d: %+v, want the in-process limit of 2", i, d)
		}
	}
	if e.StoreAvailable() {
		t.Fatal("the store breaker did not open after repeated failures")
	}
}

// An adapter may give a call's cost (Call.Cost) and the cost it reported
// (Outcome.Cost) itself: a monthly quota of 20 then admits exactly 20/5
// calls of cost 5 whatever the tool's configured cost; and calls whose
// estimate of 10 is corrected to the 1 they report are admitted while 10
// fit: 11 in a row (without the corrections, 2).
func TestCallAndOutcomeCost(t *testing.T) {
	t.Parallel()
	cfg := `
tiers:
  free:
    monthly_quota: 20
tools:
  llm: {cost: 10}
`
	admitAll := func(e *enforce.Engine, call enforce.Call, o enforce.Outcome) (n int) {
		for range 40 {
			ticket, d := e.Admit(t.Context(), call)
			if d.Allowed {
				n++
			}
			ticket.Done(t.Context(), o)
		}
		return n
	}
	given := engines(t, "memory", 1, cfg, filepath.Join(t.TempDir(), "given.db"))[0]
	if n := admitAll(given, enforce.Call{Tenant: "acme", Subject: "a", Name: "llm", Cost: 5}, enforce.Outcome{}); n != 4 {
		t.Errorf("Call.Cost 5 under a quota of 20: %d admitted, want 4", n)
	}
	reported := engines(t, "memory", 1, cfg, filepath.Join(t.TempDir(), "reported.db"))[0]
	if n := admitAll(reported, enforce.Call{Tenant: "acme", Subject: "a", Name: "llm"}, enforce.Outcome{Cost: 1}); n != 11 {
		t.Errorf("an estimate of 10 corrected to 1 under a quota of 20: %d admitted, want 11", n)
	}
}
