package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/mcp"
)

// failureConfig gives each tool its own failure policy and a small limit.
const failureConfig = `
store:
  redis: "@@REDIS@@"
  timeout: 250ms
  on_error: open
tools:
  echo:
    on_error: open
    limits:
      - {name: echo_cap, per: tenant_tool, algorithm: fixed_window, limit: 3, period: 1h}
  search:
    on_error: closed
    limits:
      - {name: search_cap, per: tenant_tool, algorithm: fixed_window, limit: 3, period: 1h}
  llm_complete:
    on_error: local
    limits:
      - {name: llm_cap, per: tenant_tool, algorithm: fixed_window, limit: 5, period: 1h}
`

var failureArgs = map[string]any{"text": "x", "query": "q", "prompt": "p"}

// With redis-server killed mid-test, each tool follows its failure policy:
// open admits, closed answers 503 with Retry-After, local decides with the
// in-process store and the same rules (exactly its limit, under
// concurrency). The store breaker then answers without touching Redis, and
// /readyz stays 200 (store.on_error is open: the instance serves calls)
// with a line saying the store is down. After Redis restarts, the gateway
// (not restarted) goes back to deciding in Redis.
func TestStoreFailurePolicies(t *testing.T) {
	t.Parallel()
	redis := testenv.StartRedis(t, nil)
	calls := &storeCalls{}
	e := newEnv(t, setup{Config: failureConfig, Redis: redis, Upstream: upstream.Options{Stateless: true, JSONResponse: true},
		WrapStore: func(s *redisstore.Store) limit.GuardedStore { calls.Store = s; return calls }})
	g := e.gws[0]
	tok := token(t, "acme", "alice")
	call := func(tool string, id any) *response {
		t.Helper()
		return e.callRaw(0, tok, id, tool, failureArgs)
	}
	for _, tool := range []string{"echo", "search", "llm_complete"} {
		if r := call(tool, 1); r.Status != http.StatusOK {
			t.Fatalf("%s with Redis up: %d %s", tool, r.Status, r.Body)
		}
	}
	if r := get(t, e.base[0]+"/readyz", ""); r.Status != http.StatusOK {
		t.Fatalf("/readyz with Redis up: %d %s", r.Status, r.Body)
	}

	redis.Kill()

	if r := get(t, e.base[0]+"/readyz", ""); r.Status != http.StatusOK || !strings.Contains(string(r.Body), "limit store unreachable") ||
		!strings.Contains(string(r.Body), "decisions follow on_error=open") {
		t.Fatalf("/readyz with Redis down under store.on_error open: %d %s, want 200 saying the store is down", r.Status, r.Body)
	}
	// open: admitted past the limit of 3 (nothing can count them).
	for i := range 6 {
		if r := call("echo", i); r.Status != http.StatusOK || r.Msg.Result == nil {
			t.Fatalf("open, Redis down, call %d: %d %s", i, r.Status, r.Body)
		}
	}
	if n := e.up.Calls("echo"); n != 7 {
		t.Fatalf("open: upstream saw %d echo calls, want 7", n)
	}
	// closed: 503, Retry-After, the request's id, never the upstream.
	for _, id := range []any{"closed-1", 2} {
		r := call("search", id)
		if r.Status != http.StatusServiceUnavailable || r.code() != CodeUnavailable {
			t.Fatalf("closed, Redis down: %d %s", r.Status, r.Body)
		}
		if ra := intHeader(t, r.Header, "Retry-After"); ra < 1 {
			t.Fatalf("closed: Retry-After %d", ra)
		}
		if got, want := string(r.Msg.ID), map[any]string{"closed-1": `"closed-1"`, 2: "2"}[id]; got != want {
			t.Fatalf("closed: id %s, want %s", got, want)
		}
	}
	if n := e.up.Calls("search"); n != 1 {
		t.Fatalf("closed: upstream saw %d search calls, want 1", n)
	}
	// local: the in-process store with the same rule, exactly 5 of 100
	// concurrent calls.
	var ok, limited atomic.Int64
	var mu sync.Mutex
	var bad []string
	run(32, 100, func(i int) {
		r, err := postCtx(context.Background(), e.mcpURL(0), tok, callBody(i, "llm_complete", failureArgs), nil)
		switch {
		case err != nil:
			mu.Lock()
			bad = append(bad, err.Error())
			mu.Unlock()
		case r.Status == http.StatusOK:
			ok.Add(1)
		case r.Status == http.StatusTooManyRequests && r.denial(t).Rule == "llm_cap" && r.denial(t).Scope == "tenant_tool":
			limited.Add(1)
		default:
			mu.Lock()
			bad = append(bad, string(r.Body))
			mu.Unlock()
		}
	})
	if len(bad) > 0 || ok.Load() != 5 || limited.Load() != 95 {
		t.Fatalf("local, Redis down: admitted %d, limited %d, other %d (%v); want 5, 95, 0", ok.Load(), limited.Load(), len(bad), bad)
	}
	if n := e.up.Calls("llm_complete"); n != 6 {
		t.Fatalf("local: upstream saw %d llm_complete calls, want 6", n)
	}

	// The breaker is open: no call waits for Redis.
	if g.Engine().StoreAvailable() {
		t.Fatal("store breaker still closed after repeated failures")
	}
	reached := calls.n.Load()
	for i := range 40 {
		if r := call("search", i); r.Status != http.StatusServiceUnavailable {
			t.Fatalf("closed, breaker open: %d", r.Status)
		}
	}
	if n := calls.n.Load() - reached; n != 0 {
		t.Fatalf("%d of 40 calls with the breaker open reached the store", n)
	}
	m := scrape(t, e.base[0])
	if m[`mcpgate_limit_store_up`] != 0 {
		t.Errorf("mcpgate_limit_store_up = %v while Redis is down, want 0", m[`mcpgate_limit_store_up`])
	}
	for _, p := range []string{"open", "closed", "local"} {
		if m[`mcpgate_degraded_decisions_total{policy="`+p+`"}`] < 1 {
			t.Errorf("no degraded decision counted for policy %s", p)
		}
	}
	if r := get(t, e.base[0]+"/admin/limits?tenant=acme", testAdmin); !strings.Contains(string(r.Body), "unavailable") {
		t.Errorf("/admin/limits does not report the store down: %s", r.Body)
	}

	// Recovery without restarting the gateway.
	redis.Restart(t)
	eventually(t, 10*time.Second, "/readyz to recover", func() bool {
		r := get(t, e.base[0]+"/readyz", "")
		return r.Status == http.StatusOK && !strings.Contains(string(r.Body), "limit store")
	})
	// rueidis spreads commands over several connections: each one still
	// open to the dead server fails once (EOF) before it is replaced, and
	// such a failure is a degraded decision. Let every one of them fail on
	// a PING first, so that the counts below are Redis's alone.
	eventually(t, 10*time.Second, "every connection to the restarted Redis", func() bool {
		for range 16 {
			if g.probe(context.Background()) != nil {
				return false
			}
		}
		return true
	})
	// The local store spent llm_cap: an admitted call now is Redis's
	// decision (its data set is empty after the restart).
	eventually(t, 10*time.Second, "decisions to go back to Redis", func() bool {
		return call("llm_complete", 0).Status == http.StatusOK
	})
	// Calls of another tenant, until 16 in a row are decided in Redis (no
	// degraded decision): under load a pipelined connection to the dead
	// server can still be in rotation after the PINGs above, and its one
	// failure would be taken for acme's below.
	warm := token(t, "warm", "w")
	degraded := func() float64 { return scrape(t, e.base[0])[`mcpgate_degraded_decisions_total{policy="local"}`] }
	eventually(t, 10*time.Second, "16 decisions in a row in Redis", func() bool {
		before := degraded()
		for i := range 16 {
			e.callRaw(0, warm, i, "llm_complete", failureArgs)
		}
		return degraded() == before
	})
	if !g.Engine().StoreAvailable() {
		t.Fatal("store breaker open after recovery")
	}
	client := redis.Client(t)
	before := scriptCalls(t, client)
	var statuses []int
	for i := range 6 {
		statuses = append(statuses, call("llm_complete", i).Status)
	}
	if want := []int{200, 200, 200, 200, 429, 429}; !slices.Equal(statuses, want) {
		t.Fatalf("llm_complete on the restarted Redis: %v, want %v", statuses, want)
	}
	// echo is limited again (open no longer applies): 3 in a fresh Redis.
	statuses = statuses[:0]
	for i := range 4 {
		statuses = append(statuses, call("echo", i).Status)
	}
	if want := []int{200, 200, 200, 429}; !slices.Equal(statuses, want) {
		t.Fatalf("echo on the restarted Redis: %v, want %v", statuses, want)
	}
	if r := call("search", 1); r.Status != http.StatusOK {
		t.Fatalf("closed tool after recovery: %d %s", r.Status, r.Body)
	}
	if after := scriptCalls(t, client); after-before < 5 {
		t.Fatalf("Redis ran %d scripts after recovery, want the decisions there", after-before)
	}
	keys, err := client.Do(context.Background(), client.B().Keys().Pattern("mcpgate:rl:{acme}:*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	if len(keys) != 3 {
		t.Fatalf("acme's keys in the restarted Redis: %q, want one per tool", keys)
	}
	if m := scrape(t, e.base[0]); m[`mcpgate_limit_store_up`] != 1 {
		t.Errorf("mcpgate_limit_store_up = %v after recovery, want 1", m[`mcpgate_limit_store_up`])
	}
}

// /readyz follows store.on_error when the limit store is down: under open
// and local the instance still serves calls, so it stays ready (taking
// every instance out of the load balancer would turn the degraded mode
// chosen into an outage) and says the store is down; under closed every
// call it governs is refused, so it is not ready.
func TestReadyzFollowsStoreOnError(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		onError string
		status  int
		line    string
	}{
		{"", http.StatusOK, "decisions follow on_error=open"}, // the default
		{"open", http.StatusOK, "decisions follow on_error=open"},
		{"local", http.StatusOK, "decisions follow on_error=local"},
		{"closed", http.StatusServiceUnavailable, "store.on_error=closed refuses calls"},
	} {
		t.Run(c.onError, func(t *testing.T) {
			t.Parallel()
			redis := testenv.StartRedis(t, nil)
			e := newEnv(t, setup{Redis: redis, Upstream: upstream.Options{Stateless: true, JSONResponse: true}, Config: `
store:
  redis: "@@REDIS@@"
  timeout: 250ms
  on_error: "` + c.onError + `"
tools:
  echo:
    limits:
      - {name: echo_cap, per: tenant_tool, algorithm: fixed_window, limit: 100, period: 1h}
`})
			if r := get(t, e.base[0]+"/readyz", ""); r.Status != http.StatusOK || strings.Contains(string(r.Body), "limit store") {
				t.Fatalf("/readyz with Redis up: %d %s", r.Status, r.Body)
			}
			redis.Kill()
			r := get(t, e.base[0]+"/readyz", "")
			if r.Status != c.status || !strings.Contains(string(r.Body), "limit store unreachable") || !strings.Contains(string(r.Body), c.line) {
				t.Fatalf("/readyz with Redis down under on_error %s: %d %q, want %d with %q", c.onError, r.Status, r.Body, c.status, c.line)
			}
			want := http.StatusOK
			if c.onError == "closed" {
				want = http.StatusServiceUnavailable
			}
			if r := e.callRaw(0, token(t, "acme", "alice"), 1, "echo", failureArgs); r.Status != want {
				t.Fatalf("a call with Redis down under on_error %s: %d %s, want %d", c.onError, r.Status, r.Body, want)
			}
		})
	}
}

// A result cache whose own Redis (cache.redis) is down does not make the
// instance unready: its calls are served uncached. /readyz says so once
// the cache's breaker has opened.
func TestReadyzWithTheCacheStoreDown(t *testing.T) {
	t.Parallel()
	redis := testenv.StartRedis(t, nil)
	e := newEnv(t, setup{Config: cacheConfig, Upstream: jsonUpstream, CacheRedis: redis})
	c := e.gws[0].Engine().Cache()
	tok := token(t, "acme", "alice")
	q := map[string]any{"query": "down"}
	expectResult(t, "up", e.callRaw(0, tok, 1, "search", q), "miss")
	redis.Kill()
	for i := 0; c.StoreAvailable(); i++ {
		if i == cache.DefaultBreakerFailures {
			t.Fatalf("cache breaker still closed after %d calls with its Redis down", i)
		}
		expectResult(t, "cache Redis down", e.callRaw(0, tok, 10+i, "search", q), "miss")
	}
	r := get(t, e.base[0]+"/readyz", "")
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), "result cache store unavailable") {
		t.Fatalf("/readyz with the cache's Redis down: %d %q, want 200 saying calls are served uncached", r.Status, r.Body)
	}
	expectResult(t, "breaker open", e.callRaw(0, tok, 100, "search", q), "miss")
}

// storeCalls counts the decisions that reach the Redis store (Take,
// TakeMetered, Evaluate), which still takes them all.
type storeCalls struct {
	*redisstore.Store
	n atomic.Int64
}

func (s *storeCalls) Take(ctx context.Context, checks []limit.Check, cost int64) (limit.Decision, error) {
	s.n.Add(1)
	return s.Store.Take(ctx, checks, cost)
}

func (s *storeCalls) TakeMetered(ctx context.Context, checks []limit.Check, m limit.Meter, cost int64) (limit.Decision, limit.MeterResult, error) {
	s.n.Add(1)
	return s.Store.TakeMetered(ctx, checks, m, cost)
}

func (s *storeCalls) Evaluate(ctx context.Context, req limit.Request) (limit.Outcome, error) {
	s.n.Add(1)
	return s.Store.Evaluate(ctx, req)
}

// A store that hangs (its process stopped: every command waits) costs each
// call the store timeout only until the breaker opens; after that calls are
// answered without asking the store, and the background probe closes the
// breaker once Redis answers again.
func TestStoreBreakerSkipsHungStore(t *testing.T) {
	t.Parallel()
	redis := testenv.StartRedis(t, nil)
	calls := &storeCalls{}
	e := newEnv(t, setup{Redis: redis, Upstream: upstream.Options{Stateless: true, JSONResponse: true},
		WrapStore: func(s *redisstore.Store) limit.GuardedStore { calls.Store = s; return calls }, Config: `
store:
  redis: "@@REDIS@@"
  timeout: 25ms
tools:
  search:
    on_error: closed
    limits:
      - {name: search_cap, per: tenant_tool, algorithm: fixed_window, limit: 1000, period: 1h}
`})
	g := e.gws[0]
	tok := token(t, "acme", "alice")
	// The first calls dial, load the script and run under -race on a busy
	// machine: any of them may miss the 25ms deadline (and fail closed).
	// Wait until Redis decides one.
	admitted := func() bool { return e.callRaw(0, tok, 0, "search", failureArgs).Status == http.StatusOK }
	eventually(t, 10*time.Second, "a call admitted by Redis", admitted)
	thaw := redis.Freeze(t)
	before := calls.n.Load()
	// Until the breaker opens, each call fails: the first by the 25ms
	// deadline; a later one may fail sooner (the client may refuse a call
	// at once on a connection it is closing for want of a reply), which
	// counts toward the breaker all the same.
	var tripped int
	for g.Engine().StoreAvailable() {
		start := time.Now()
		r := e.callRaw(0, tok, tripped, "search", failureArgs)
		if r.Status != http.StatusServiceUnavailable {
			t.Fatalf("closed, store hung: %d %s", r.Status, r.Body)
		}
		if el := time.Since(start); tripped == 0 && el < 20*time.Millisecond {
			t.Fatalf("the first call to the hung store took %v: it did not wait for the store", el)
		}
		tripped++
		if tripped > enforce.DefaultStoreFailures {
			t.Fatalf("breaker still closed after %d timeouts", tripped)
		}
	}
	if tripped != enforce.DefaultStoreFailures {
		t.Fatalf("breaker opened after %d timeouts, want %d", tripped, enforce.DefaultStoreFailures)
	}
	// With the breaker open, calls are answered without the store (and so
	// without waiting for its deadline).
	for i := range 40 {
		if r := e.callRaw(0, tok, i, "search", failureArgs); r.Status != http.StatusServiceUnavailable {
			t.Fatalf("breaker open: %d %s", r.Status, r.Body)
		}
	}
	if n := calls.n.Load() - before; n != int64(tripped) {
		t.Fatalf("%d calls reached the hung store, want %d (those before the breaker opened)", n, tripped)
	}
	thaw()
	eventually(t, 10*time.Second, "the probe to close the breaker", g.Engine().StoreAvailable)
	eventually(t, 10*time.Second, "a call admitted by Redis after the hang", admitted)
}

// After a denial from Redis, the same key is denied in-process until the
// retry time: hammering it runs no script in Redis. Afterwards the next call
// reaches Redis again. Other keys are unaffected.
func TestDenialCacheSparesRedis(t *testing.T) {
	t.Parallel()
	redis := testenv.StartRedis(t, nil)
	// The gateways' clock stands still while the key is hammered: a cached
	// denial then holds however long a loaded machine takes over the 200
	// calls. Redis keeps its own clock: the period leaves the first four
	// calls ample time to fall in one window.
	clock := newClock(time.Now())
	e := newEnv(t, setup{Redis: redis, Instances: 2, Upstream: upstream.Options{Stateless: true, JSONResponse: true}, Now: clock.Now, Config: storeYAML(true) + `
tools:
  echo:
    limits:
      - {name: echo_burst, per: tenant_tool, algorithm: sliding_window, limit: 2, period: 3s}
`})
	client := redis.Client(t)
	tok := token(t, "acme", "alice")
	first := time.Now()
	for i := range 2 {
		if r := e.callRaw(i, tok, i, "echo", failureArgs); r.Status != http.StatusOK {
			t.Fatalf("call %d: %d %s", i, r.Status, r.Body)
		}
	}
	// One denial per instance comes from Redis and is remembered there.
	for i := range 2 {
		if r := e.callRaw(i, tok, i, "echo", failureArgs); r.Status != http.StatusTooManyRequests {
			t.Fatalf("third call on instance %d: %d %s", i, r.Status, r.Body)
		}
	}
	before := scriptCalls(t, client)
	hitsBefore := scrape(t, e.base[0])["mcpgate_denial_cache_hits_total"] + scrape(t, e.base[1])["mcpgate_denial_cache_hits_total"]
	const hammer = 200
	var denied atomic.Int64
	run(16, hammer, func(i int) {
		r, err := postCtx(context.Background(), e.mcpURL(i), tok, callBody(i, "echo", failureArgs), nil)
		if err == nil && r.Status == http.StatusTooManyRequests && r.denial(t).Rule == "echo_burst" && r.Header.Get("Retry-After") != "" {
			denied.Add(1)
		}
	})
	if denied.Load() != hammer {
		t.Fatalf("%d of %d hammering calls denied with a full 429", denied.Load(), hammer)
	}
	if after := scriptCalls(t, client); after != before {
		t.Fatalf("hammering a denied key ran %d scripts in Redis, want 0", after-before)
	}
	hitsAfter := scrape(t, e.base[0])["mcpgate_denial_cache_hits_total"] + scrape(t, e.base[1])["mcpgate_denial_cache_hits_total"]
	if hitsAfter-hitsBefore != hammer {
		t.Fatalf("denial cache hits went up by %v, want %d", hitsAfter-hitsBefore, hammer)
	}
	// Another caller is not affected by the cached denial.
	if r := e.callRaw(0, token(t, "other", "bob"), 1, "echo", failureArgs); r.Status != http.StatusOK {
		t.Fatalf("another tenant: %d %s", r.Status, r.Body)
	}
	if after := scriptCalls(t, client); after != before+1 {
		t.Fatalf("another tenant's call ran %d scripts, want 1", after-before)
	}
	// After the retry time, the key goes to Redis again and is admitted:
	// once Redis's window has passed, and the gateways' clock with it.
	time.Sleep(time.Until(first.Add(3100 * time.Millisecond)))
	clock.Set(time.Now())
	before = scriptCalls(t, client)
	if r := e.callRaw(0, tok, 9, "echo", failureArgs); r.Status != http.StatusOK {
		t.Fatalf("after the retry time: %d %s", r.Status, r.Body)
	}
	if after := scriptCalls(t, client); after != before+1 {
		t.Fatalf("the call after the retry time ran %d scripts, want 1", after-before)
	}
	if n := e.up.Calls("echo"); n != 4 {
		t.Fatalf("upstream saw %d echo calls, want 4", n)
	}
}

// An upstream that cannot be reached gets a 502 JSON-RPC error (with the
// call's rate-limit headers, since the call was admitted), and the call's
// concurrency slot is released all the same.
func TestUpstreamDown(t *testing.T) {
	t.Parallel()
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL + "/mcp"
	dead.Close()
	e := newEnv(t, setup{UpstreamURL: deadURL, Config: `
tools:
  slow:
    limits:
      - {name: slow_in_flight, per: tenant_tool, algorithm: concurrency, limit: 1, period: 1m}
`})
	tok := token(t, "acme", "alice")
	for i := range 3 {
		r := e.callRaw(0, tok, i, "slow", map[string]any{"ms": 1})
		if r.Status != http.StatusBadGateway || r.code() != mcp.CodeInternalError || string(r.Msg.ID) != strconv.Itoa(i) {
			t.Fatalf("call %d to a dead upstream: %d %s (a 429 means the slot leaked)", i, r.Status, r.Body)
		}
		if r.Header.Get("X-RateLimit-Limit") != "1" {
			t.Errorf("call %d: no rate-limit headers on an admitted call: %v", i, r.Header)
		}
	}
	if got := scrape(t, e.base[0])[`mcpgate_requests_total{method="tools/call",outcome="upstream_error"}`]; got != 3 {
		t.Fatalf("upstream errors counted: %v, want 3", got)
	}
}
