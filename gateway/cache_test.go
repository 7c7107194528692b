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
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
		t.Fatalf("upstream saw %d search calls, want exactly 1 (cache stats: %+v, %+v)", got, e.gws[0].Engine().Cache().Stats(), e.gws[1].Engine().Cache().Stats())
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

			// Arguments spelling a member twice: the upstream would run the
			// update with one of the twins, the gateway could not name the
			// entries it makes stale. Refused before anything runs.
			twin := `{"jsonrpc":"2.0","id":900,"method":"tools/call","params":{"name":"update_product","arguments":{"id":"42","id":"42"}}}`
			if r := post(t, e.mcpURL(0), acme, twin, nil); r.Status != http.StatusBadRequest || r.Msg.Error == nil {
				t.Fatalf("update_product with a member twice: %d %s, want 400", r.Status, r.Body)
			}
			expectResult(t, "acme 42 after a refused update", call(1, acme, "search", q("42")), "hit")
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

// An upstream protected by mcpgate (a chained gateway, or the gosdk
// middleware) with deny_as: result answers a rate-limited call with HTTP
// 200, Retry-After and an isError result carrying _meta
// "io.mcpgate/denial"; another upstream may answer its own refusal as an
// isError result with Retry-After. Either is a transient refusal of the
// caller, not the tool's answer: it must not become a negative entry,
// served to every tenant of a shared tool (here) and past its Retry-After.
func TestUpstreamDenialResultIsNotCached(t *testing.T) {
	for name, denial := range map[string]string{
		"mcpgate denial": `{"content":[{"type":"text","text":"rate limit per_tenant exceeded for tenant acme; retry in 30s"}],"isError":true,` +
			`"_meta":{"io.mcpgate/denial":{"rule":"per_tenant","retryAfter":30}}}`,
		"isError with Retry-After": `{"content":[{"type":"text","text":"rate limit exceeded for tenant acme; retry in 30s"}],"isError":true}`,
	} {
		t.Run(name, func(t *testing.T) {
			var deny atomic.Bool
			deny.Store(true)
			var inner atomic.Pointer[http.Handler]
			front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				method, id := peekRPC(r)
				if method == "tools/call" && deny.CompareAndSwap(true, false) {
					w.Header().Set("Retry-After", "30")
					writeRPC(w, http.StatusOK, id, "result", json.RawMessage(denial))
					return
				}
				(*inner.Load()).ServeHTTP(w, r)
			}))
			t.Cleanup(front.Close)
			e := newEnv(t, setup{Config: "tools:\n  echo:\n    cache: {ttl: 10m, negative_ttl: 10m, shared: true}\n",
				Upstream: jsonUpstream, UpstreamURL: front.URL + "/mcp"})
			h := e.up.Handler()
			inner.Store(&h)
			args := map[string]any{"text": "hello"}
			r1 := e.callRaw(0, token(t, "acme", "alice"), 1, "echo", args)
			r2 := e.callRaw(0, token(t, "globex", "bob"), 2, "echo", args)
			if r2.Msg.Result == nil || strings.Contains(string(r2.Body), "rate limit") {
				t.Fatalf("globex got acme's upstream rate-limit denial from the cache (X-Mcp-Cache %q): %s", cacheSrc(r2), r2.Body)
			}
			// The denied caller gets the upstream's answer as it came.
			if !strings.Contains(string(r1.Body), "rate limit") || r1.Header.Get("Retry-After") != "30" {
				t.Fatalf("acme: %d %v %s, want the upstream's denial with its Retry-After", r1.Status, r1.Header, r1.Body)
			}
		})
	}
}
