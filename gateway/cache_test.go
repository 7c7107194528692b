package gateway

// End-to-end tests of the result cache through the gateway: stampedes
// across instances sharing Redis, tenant isolation, canonical arguments,
// tag invalidation (mutating tools, admin API), negative entries and what is
// never cached, SSE answers, warm-up, and the request path in front of a hit.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sort"
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

// cacheConfig makes the demo tools cacheable. search entries are tagged
// with their query, so a test controls the tag of an entry through the
// argument it searches for; update_product{id} drops the entries tagged
// with its id. echo is shared by every tenant, and tagged the same way.
// ghost is a tool the upstream does not know (a JSON-RPC error).
const cacheConfig = `
tools:
  search:
    cache:
      ttl: 10m
      jitter: "10%"
      tags: ["product:{{args.query}}"]
  echo:
    cache: {ttl: 10m, shared: true, tags: ["product:{{args.text}}"]}
  fail:
    cache: {ttl: 10m, negative_ttl: 1m}
  ghost:
    cache: {ttl: 10m}
  update_product:
    invalidates: ["product:{{args.id}}"]
`

// jsonUpstream answers JSON without sessions: raw POSTs need no initialize.
var jsonUpstream = upstream.Options{Stateless: true, JSONResponse: true}

// cacheSrc is the X-Mcp-Cache header of an answer ("" when not cached).
func cacheSrc(r *response) string { return r.Header.Get("X-Mcp-Cache") }

// expectResult checks a 200 with a tools/call result and the wanted cache
// source, and returns the result.
func expectResult(t *testing.T, what string, r *response, src string) json.RawMessage {
	t.Helper()
	if r.Status != http.StatusOK || r.Msg.Error != nil || r.Msg.Result == nil {
		t.Fatalf("%s: %d %s", what, r.Status, r.Body)
	}
	if got := cacheSrc(r); got != src {
		t.Fatalf("%s: X-Mcp-Cache %q, want %q (%s)", what, got, src, r.Body)
	}
	return r.Msg.Result
}

// The stores the tag and isolation tests run on: the embedded memory store
// (one instance), and Redis shared by two instances, each with its own
// client and cache.
var cacheModes = []struct {
	name  string
	redis bool
}{{"memory", false}, {"redis", true}}

func newCacheEnv(t *testing.T, redis bool, cfg string, up upstream.Options) *env {
	t.Helper()
	s := setup{Config: cfg, Upstream: up}
	if redis {
		s.CacheRedis = testenv.StartRedis(t, nil)
		s.Instances = 2
	}
	return newEnv(t, s)
}

// 100 concurrent identical calls on a cold key, spread over two instances
// that share Redis (each with its own client and cache), reach the upstream
// exactly once; every caller gets its own id back with the one result.
func TestCacheStampedeAcrossInstances(t *testing.T) {
	t.Parallel()
	// The upstream holds the first call until every caller is waiting.
	first := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	up := jsonUpstream
	up.OnRequest = func(r *http.Request) {
		if r.Method == http.MethodPost {
			once.Do(func() { close(first) })
			<-release
		}
	}
	// The caches get newTestCache's 2s store Timeout: a flight whose lock
	// request times out (100ms by default) loads without the store, by
	// design one extra load per instance, and under -race on a loaded
	// machine a Redis round trip can take that long. This test is about
	// coalescing, not about a slow store.
	e := newEnv(t, setup{Config: cacheConfig, Upstream: up, Instances: 2, CacheRedis: testenv.StartRedis(t, nil)})
	tok := token(t, "acme", "alice")
	args := map[string]any{"query": "stampede"}

	const callers = 100
	ids := make([]any, callers)
	resps := make([]*response, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		ids[i] = i
		if i%3 == 1 {
			ids[i] = fmt.Sprintf("req-%d", i)
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			resps[i], errs[i] = postCtx(ctx, e.mcpURL(i), tok, callBody(ids[i], "search", args), nil)
		})
	}
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("no call reached the upstream")
	}
	time.Sleep(500 * time.Millisecond) // let every caller arrive and wait
	released := time.Now()
	close(release)
	wg.Wait()
	// Waiters are woken when the value lands, not when the loader's lock
	// (10s) would expire.
	if d := time.Since(released); d > 3*time.Second {
		t.Errorf("callers finished %v after the load ended: woken by lock expiry, not by the commit?", d)
	}

	if got := e.up.Calls("search"); got != 1 {
		t.Fatalf("upstream saw %d search calls, want exactly 1 (cache stats: %+v, %+v)", got, e.gws[0].cache.Stats(), e.gws[1].cache.Stats())
	}
	sources := map[string]int{}
	perInstance := [2]map[string]int{{}, {}}
	var want json.RawMessage
	for i, r := range resps {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if r.Status != http.StatusOK || r.Msg.Result == nil {
			t.Fatalf("caller %d: %d %s", i, r.Status, r.Body)
		}
		wantID, _ := json.Marshal(ids[i])
		if !bytes.Equal(r.Msg.ID, wantID) {
			t.Fatalf("caller %d: id %s, want %s", i, r.Msg.ID, wantID)
		}
		if want == nil {
			want = r.Msg.Result
		} else if !bytes.Equal(r.Msg.Result, want) {
			t.Fatalf("caller %d: result %s differs from %s", i, r.Msg.Result, want)
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("caller %d: Content-Type %q", i, ct)
		}
		sources[cacheSrc(r)]++
		perInstance[i%2][cacheSrc(r)]++
	}
	t.Logf("sources: %v; instance 0: %v, instance 1: %v", sources, perInstance[0], perInstance[1])
	if sources["miss"] != 1 || sources["miss"]+sources["coalesced"]+sources["hit"] != callers {
		t.Fatalf("sources %v: want exactly 1 miss, the rest coalesced or hits", sources)
	}
	for i, m := range perInstance {
		if m["coalesced"] == 0 {
			t.Errorf("instance %d coalesced no caller (%v): the callers did not wait for the one load", i, m)
		}
	}
	// Later calls, on either instance, are hits.
	for i := range 2 {
		r := e.callRaw(i, tok, 1000+i, "search", args)
		if got := expectResult(t, fmt.Sprintf("later call on instance %d", i), r, "hit"); !bytes.Equal(got, want) {
			t.Fatalf("hit %s differs from the loaded %s", got, want)
		}
	}
	if got := e.up.Calls("search"); got != 1 {
		t.Fatalf("after the hits, upstream saw %d search calls, want 1", got)
	}
}

// A tenant never gets another tenant's entry; a shared tool's entry serves
// every tenant. The key does not depend on member order, whitespace,
// string escapes or number format.
func TestCacheTenantsAndCanonicalArguments(t *testing.T) {
	t.Parallel()
	for _, m := range cacheModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newCacheEnv(t, m.redis, cacheConfig, jsonUpstream)
			acme, globex := token(t, "acme", "alice"), token(t, "globex", "gina")
			q := map[string]any{"query": "isolated"}

			expectResult(t, "acme first", e.callRaw(0, acme, 1, "search", q), "miss")
			expectResult(t, "acme again", e.callRaw(1, acme, 2, "search", q), "hit")
			// Another subject of the same tenant shares the tenant's entry.
			expectResult(t, "acme, other subject", e.callRaw(0, token(t, "acme", "bob"), 3, "search", q), "hit")
			expectResult(t, "globex first", e.callRaw(1, globex, 4, "search", q), "miss")
			expectResult(t, "globex again", e.callRaw(0, globex, 5, "search", q), "hit")
			if got := e.up.Calls("search"); got != 2 {
				t.Fatalf("upstream saw %d search calls, want 2 (one per tenant)", got)
			}

			// shared: true serves every tenant from one entry.
			s := map[string]any{"text": "shared"}
			expectResult(t, "shared, acme", e.callRaw(0, acme, 6, "echo", s), "miss")
			expectResult(t, "shared, globex", e.callRaw(1, globex, 7, "echo", s), "hit")
			if got := e.up.Calls("echo"); got != 1 {
				t.Fatalf("upstream saw %d echo calls, want 1 (shared entry)", got)
			}

			// Canonical arguments: one entry for every spelling.
			body := func(id int, args string) string {
				return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"search","arguments":%s}}`, id, args)
			}
			first := post(t, e.mcpURL(0), acme, body(10, `{"query":"canon","limit":2}`), nil)
			want := expectResult(t, "canonical first", first, "miss")
			for i, args := range []string{
				`{"limit":2.0,"query":"canon"}`,
				"{ \n\t\"limit\" : 2 ,  \"query\" : \"canon\" }",
				`{"query":"c\u0061non","limit":2e0}`,
				`{"limit":20e-1,"query":"canon"}`,
			} {
				r := post(t, e.mcpURL(i), acme, body(11+i, args), nil)
				if got := expectResult(t, "spelling "+args, r, "hit"); !bytes.Equal(got, want) {
					t.Fatalf("spelling %s: %s, want %s", args, got, want)
				}
				if string(r.Msg.ID) != fmt.Sprint(11+i) {
					t.Fatalf("spelling %s: id %s", args, r.Msg.ID)
				}
			}
			expectResult(t, "other arguments", post(t, e.mcpURL(0), acme, body(20, `{"query":"canon","limit":3}`), nil), "miss")
			if got := e.up.Calls("search"); got != 4 {
				t.Fatalf("upstream saw %d search calls, want 4", got)
			}
		})
	}
}

// adminInvalidate posts to /admin/cache/invalidate.
func adminInvalidate(t *testing.T, base, tok, body string) *response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/admin/cache/invalidate", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	r, err := do(req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A successful call of a mutating tool drops the entries tagged with its
// rendered invalidates, in the caller's tenant and in the shared scope; a
// failed one drops nothing; the admin API drops on demand.
func TestCacheTagInvalidation(t *testing.T) {
	t.Parallel()
	for _, m := range cacheModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newCacheEnv(t, m.redis, cacheConfig, jsonUpstream)
			acme, globex := token(t, "acme", "alice"), token(t, "globex", "gina")
			q := func(s string) map[string]any { return map[string]any{"query": s} }
			id := 0
			call := func(i int, tok, tool string, args map[string]any) *response {
				id++
				return e.callRaw(i, tok, id, tool, args)
			}

			expectResult(t, "acme 42", call(0, acme, "search", q("42")), "miss")
			expectResult(t, "acme 42", call(1, acme, "search", q("42")), "hit")
			expectResult(t, "acme 43", call(0, acme, "search", q("43")), "miss")
			expectResult(t, "globex 42", call(1, globex, "search", q("42")), "miss")

			// update_product 42 drops acme's product:42 entry only.
			if res := expectResult(t, "update 42", call(0, acme, "update_product", map[string]any{"id": "42"}), ""); isErrorResult(res) {
				t.Fatalf("update_product failed: %s", res)
			}
			expectResult(t, "acme 42 after update", call(1, acme, "search", q("42")), "miss")
			expectResult(t, "acme 43 after update", call(0, acme, "search", q("43")), "hit")
			expectResult(t, "globex 42 after acme's update", call(1, globex, "search", q("42")), "hit")

			// A failed mutation (isError) invalidates nothing.
			expectResult(t, "acme empty", call(0, acme, "search", q("")), "miss")
			if res := expectResult(t, "failed update", call(1, acme, "update_product", map[string]any{"id": ""}), ""); !isErrorResult(res) {
				t.Fatalf("update_product with no id succeeded: %s", res)
			}
			expectResult(t, "acme empty after a failed update", call(0, acme, "search", q("")), "hit")

			// Shared entries with the tag are dropped by any tenant's mutation.
			expectResult(t, "shared 7", call(0, acme, "echo", map[string]any{"text": "7"}), "miss")
			expectResult(t, "shared 7", call(1, globex, "echo", map[string]any{"text": "7"}), "hit")
			expectResult(t, "update 7", call(1, globex, "update_product", map[string]any{"id": "7"}), "")
			expectResult(t, "shared 7 after update", call(0, acme, "echo", map[string]any{"text": "7"}), "miss")

			// The admin API.
			body := `{"tenant":"acme","tags":["product:43"]}`
			for _, tok := range []string{"", "wrong-token"} {
				if r := adminInvalidate(t, e.base[0], tok, body); r.Status != http.StatusUnauthorized {
					t.Fatalf("invalidate with token %q: %d %s, want 401", tok, r.Status, r.Body)
				}
			}
			expectResult(t, "acme 43 after refused invalidations", call(1, acme, "search", q("43")), "hit")
			for _, bad := range []string{`{"tenant":"acme"}`, `{"tags":["x"]}`, `{"tenant":"acme","tags":["x"],"extra":1}`, `nope`} {
				if r := adminInvalidate(t, e.base[0], testAdmin, bad); r.Status != http.StatusBadRequest {
					t.Fatalf("invalidate %s: %d %s, want 400", bad, r.Status, r.Body)
				}
			}
			r := adminInvalidate(t, e.base[0], testAdmin, body)
			var out struct {
				Invalidated int `json:"invalidated"`
			}
			if r.Status != http.StatusOK || json.Unmarshal(r.Body, &out) != nil || out.Invalidated != 1 {
				t.Fatalf("invalidate: %d %s, want 200 with 1 invalidated", r.Status, r.Body)
			}
			expectResult(t, "acme 43 after the admin API", call(1, acme, "search", q("43")), "miss")
			expectResult(t, "globex 42 after the admin API", call(0, globex, "search", q("42")), "hit")
			if got := e.up.Calls("search"); got != 6 {
				t.Fatalf("upstream saw %d search calls, want 6", got)
			}
		})
	}
}

// A mutation answered as SSE has invalidated before its caller can read
// the answer: the response event reaches an SDK client before the stream
// ends, and a read right after the write never gets the stale entry.
func TestCacheReadYourWrites(t *testing.T) {
	t.Parallel()
	redis := testenv.StartRedis(t, nil)
	e := newEnv(t, setup{Config: cacheConfig + "store:\n  redis: \"@@REDIS@@\"\n", Redis: redis, CacheRedis: redis})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs := connect(t, e.mcpURL(0), token(t, "acme", "alice"), "")
	q := map[string]any{"query": "ryw"}
	if _, err := callTool(ctx, cs, "search", q); err != nil {
		t.Fatal(err)
	}
	const rounds = 30
	for i := range rounds {
		if res, err := callTool(ctx, cs, "update_product", map[string]any{"id": "ryw"}); err != nil || res.IsError {
			t.Fatalf("update %d: %v %+v", i, err, res)
		}
		if _, err := callTool(ctx, cs, "search", q); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
	}
	if got := e.up.Calls("search"); got != rounds+1 {
		t.Fatalf("upstream saw %d search calls, want %d: %d reads after a write got the stale entry",
			got, rounds+1, rounds+1-got)
	}
}

// isError results are cached for negative_ttl; JSON-RPC errors and HTTP
// failures of the upstream (5xx, 429) are relayed to the caller, with the
// caller's id, and never cached.
func TestCacheNegativeAndUncacheable(t *testing.T) {
	t.Parallel()
	// A front in front of the upstream answers 503 or 429 on demand.
	var mode atomic.Value
	mode.Store("")
	var inner atomic.Pointer[http.Handler]
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load().(string) {
		case "503":
			http.Error(w, "upstream overloaded", http.StatusServiceUnavailable)
		case "429":
			w.Header().Set("Retry-After", "7")
			http.Error(w, "slow down", http.StatusTooManyRequests)
		default:
			(*inner.Load()).ServeHTTP(w, r)
		}
	}))
	t.Cleanup(front.Close)
	e := newEnv(t, setup{Config: cacheConfig, Upstream: jsonUpstream, UpstreamURL: front.URL + "/mcp"})
	h := e.up.Handler()
	inner.Store(&h)
	tok := token(t, "acme", "alice")

	// Negative caching.
	boom := map[string]any{"message": "boom"}
	r1 := e.callRaw(0, tok, 1, "fail", boom)
	if res := expectResult(t, "fail", r1, "miss"); !isErrorResult(res) {
		t.Fatalf("fail: %s is not an error result", res)
	}
	r2 := e.callRaw(0, tok, "two", "fail", boom)
	if res := expectResult(t, "fail again", r2, "hit"); !isErrorResult(res) || !bytes.Equal(res, r1.Msg.Result) {
		t.Fatalf("fail again: %s, want the cached %s", res, r1.Msg.Result)
	}
	if string(r2.Msg.ID) != `"two"` {
		t.Fatalf("fail again: id %s", r2.Msg.ID)
	}
	if got := e.up.Calls("fail"); got != 1 {
		t.Fatalf("upstream saw %d fail calls, want 1", got)
	}

	// A JSON-RPC error (unknown tool) is relayed every time.
	for i := range 3 {
		r := e.callRaw(0, tok, 100+i, "ghost", map[string]any{})
		if r.Msg.Error == nil || r.Msg.Result != nil || string(r.Msg.ID) != fmt.Sprint(100+i) {
			t.Fatalf("ghost %d: %d %s, want a JSON-RPC error with id %d", i, r.Status, r.Body, 100+i)
		}
		if src := cacheSrc(r); src != "" {
			t.Fatalf("ghost %d: X-Mcp-Cache %q on an error", i, src)
		}
	}
	if got := e.up.Calls("ghost"); got != 3 {
		t.Fatalf("upstream saw %d ghost calls, want 3 (errors are not cached)", got)
	}

	// Upstream 5xx and 429 keep their status (and Retry-After), are not
	// cached, and the next call loads.
	q := map[string]any{"query": "flaky"}
	for _, c := range []struct {
		mode   string
		status int
	}{{"503", http.StatusServiceUnavailable}, {"429", http.StatusTooManyRequests}, {"503", http.StatusServiceUnavailable}} {
		mode.Store(c.mode)
		r := e.callRaw(0, tok, "flaky-"+c.mode, "search", q)
		if r.Status != c.status || r.Msg.Error == nil || string(r.Msg.ID) != `"flaky-`+c.mode+`"` {
			t.Fatalf("upstream %s: %d %s, want %d with a JSON-RPC error and the caller's id", c.mode, r.Status, r.Body, c.status)
		}
		if c.mode == "429" && r.Header.Get("Retry-After") != "7" {
			t.Fatalf("upstream 429: Retry-After %q, want the upstream's 7", r.Header.Get("Retry-After"))
		}
		if src := cacheSrc(r); src != "" {
			t.Fatalf("upstream %s: X-Mcp-Cache %q", c.mode, src)
		}
	}
	mode.Store("")
	expectResult(t, "after the failures", e.callRaw(0, tok, 3, "search", q), "miss")
	expectResult(t, "after the failures, again", e.callRaw(0, tok, 4, "search", q), "hit")
	if got := e.up.Calls("search"); got != 1 {
		t.Fatalf("upstream saw %d search calls, want 1", got)
	}
}

// An upstream answering with an event stream is cached from its final
// result and served as JSON, to raw clients and to the SDK's client.
func TestCacheSSEAnswersServedAsJSON(t *testing.T) {
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
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s: Content-Type %q, want application/json", src, ct)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(r.Body, &m); err != nil || string(m["id"]) != fmt.Sprint(i+10) {
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

// The hit path through the gateway against a direct upstream call: a
// measurement, logged, not a pass/fail criterion (run with -v; numbers
// under -race are inflated).
func TestCacheHitLatencyVsUpstream(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	for _, m := range cacheModes {
		t.Run(m.name, func(t *testing.T) {
			s := setup{Config: cacheConfig, Upstream: jsonUpstream}
			if m.redis {
				s.CacheRedis = testenv.StartRedis(t, nil)
			}
			measureHits(t, newEnv(t, s))
		})
	}
}

func measureHits(t *testing.T, e *env) {
	tok := token(t, "acme", "alice")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	t.Cleanup(client.CloseIdleConnections)
	body := callBody(1, "search", map[string]any{"query": "bench"})
	send := func(url, tok string) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", url, resp.StatusCode, b.Bytes())
		}
	}
	const n = 400
	measure := func(url, tok string) (median, mean time.Duration) {
		for range 20 {
			send(url, tok) // warm connections (and the cache)
		}
		ds := make([]time.Duration, n)
		for i := range ds {
			start := time.Now()
			send(url, tok)
			ds[i] = time.Since(start)
		}
		var sum time.Duration
		for _, d := range ds {
			sum += d
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[n/2], sum / n
	}
	hitMed, hitMean := measure(e.mcpURL(0), tok)
	upMed, upMean := measure(e.upURL, "")
	if cacheSrc(e.callRaw(0, tok, 1, "search", map[string]any{"query": "bench"})) != "hit" {
		t.Fatal("the gateway calls were not hits")
	}
	if got := e.up.Calls("search"); got != n+20+1 {
		t.Fatalf("upstream saw %d search calls, want %d (the direct ones and one load)", got, n+20+1)
	}
	t.Logf("cache hit through the gateway: median %v, mean %v; direct upstream call: median %v, mean %v; ratio (hit/direct) median %.2f, mean %.2f (n=%d sequential calls each)",
		hitMed, hitMean, upMed, upMean, float64(hitMed)/float64(upMed), float64(hitMean)/float64(upMean), n)
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
