package cache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/internal/testenv"
)

// storeEnv gives the stores of one kind: each call of store is a new
// client of the same server (a second gateway instance), or the same
// MemoryStore (a second Cache of one process).
type storeEnv struct {
	name  string
	store func(t testing.TB) Store
}

// TestConformance runs every scenario against the memory store, a real
// redis-server and a real 6-node Redis Cluster: the stores must behave
// alike.
func TestConformance(t *testing.T) {
	mem, err := NewMemoryStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	redis := testenv.StartRedis(t, nil)
	cluster := testenv.StartCluster(t)
	envs := []storeEnv{
		{"memory", func(testing.TB) Store { return mem }},
		{"redis", func(t testing.TB) Store { return mustRedisStore(t, redis.Client(t)) }},
		{"cluster", func(t testing.TB) Store { return mustRedisStore(t, cluster.Client(t)) }},
	}
	scenarios := []struct {
		name string
		run  func(t *testing.T, e storeEnv)
		// redisOnly: the scenario is about what only a Redis store can do
		// (lose a key to eviction apart from the keys that refer to it).
		redisOnly bool
	}{
		{"SingleFlightAcrossInstances", testSingleFlightAcrossInstances, false},
		{"TenantIsolation", testTenantIsolation, false},
		{"CanonicalArguments", testCanonicalArguments, false},
		{"Tags", testTags, false},
		{"InvalidateDuringLoad", testInvalidateDuringLoad, false},
		{"Negative", testNegative, false},
		{"ErrorsNotCached", testErrorsNotCached, false},
		{"Fencing", testFencing, false},
		{"XFetch", testXFetch, false},
		{"StaleOnWaitTimeout", testStaleOnWaitTimeout, false},
		{"LoadOnWaitTimeout", testLoadOnWaitTimeout, false},
		{"WakeUpNotPoll", testWakeUpNotPoll, false},
		{"ReleaseWakesWaiter", testReleaseWakesWaiter, false},
		{"Warm", testWarm, false},
		{"CancelOneWaiter", testCancelOneWaiter, false},
		{"TagIndexBounded", testTagIndexBounded, false},
		{"HolderCrash", testHolderCrash, false},
		{"CommitFenced", testCommitFenced, false},
		{"UnlistedEntryNotServed", testUnlistedEntryNotServed, true /* redisOnly */},
	}
	t.Run("CheckEvictionCluster", func(t *testing.T) {
		// Every node is read: all six have the default noeviction.
		policy, warning, err := CheckEviction(context.Background(), cluster.Client(t), RoleCache)
		if err != nil || policy != "noeviction" || warning != "" {
			t.Fatalf("cluster: %q %q %v", policy, warning, err)
		}
	})
	for _, e := range envs {
		t.Run(e.name, func(t *testing.T) {
			for _, s := range scenarios {
				if s.redisOnly && e.name == "memory" {
					continue // not a skip: the memory store has no such behaviour to check
				}
				t.Run(s.name, func(t *testing.T) { s.run(t, e) })
			}
		})
	}
}

func mustRedisStore(t testing.TB, c rueidis.Client) Store {
	t.Helper()
	s, err := NewRedisStore(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// scope returns a scope no other test uses.
func scope(t testing.TB) Scope { return Tenant(t.Name()) }

// testLog writes a Cache's log lines into the test's log.
type testLog struct{ t testing.TB }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func newCache(t testing.TB, s Store, o *Options) *Cache {
	t.Helper()
	var opts Options
	if o != nil {
		opts = *o
	}
	opts.Logger = slog.New(slog.NewTextHandler(testLog{t}, nil))
	if opts.Timeout == 0 {
		// Store calls are fast, but -race on a shared 2-core machine can
		// stall one past the 100ms default: a timed-out read is a miss,
		// which would make exact source counts flaky.
		opts.Timeout = 2 * time.Second
	}
	c, err := New(s, &opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func mustKey(t testing.TB, sc Scope, tool, args string) Key {
	t.Helper()
	k, err := NewKey(sc, tool, json.RawMessage(args))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// loads counts a loader's calls.
type loads struct{ n atomic.Int64 }

// fixed returns a loader that takes d and returns v.
func (l *loads) fixed(v string, d time.Duration) Loader {
	return func(ctx context.Context) ([]byte, bool, error) {
		l.n.Add(1)
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
		return []byte(v), false, nil
	}
}

func (l *loads) count() int64 { return l.n.Load() }

var minute = Policy{TTL: time.Minute}

func get(t testing.TB, c *Cache, k Key, load Loader, pol Policy) (string, Source) {
	t.Helper()
	e, src, err := c.Get(context.Background(), k, load, pol)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	return string(e.Value), src
}

func testSingleFlightAcrossInstances(t *testing.T, e storeEnv) {
	a := newCache(t, e.store(t), nil)
	b := newCache(t, e.store(t), nil)
	k := mustKey(t, scope(t), "search", `{"q":"pricing"}`)
	var l loads
	load := l.fixed("result", 150*time.Millisecond)
	const n = 100
	var wg sync.WaitGroup
	start := make(chan struct{})
	sources := make([]Source, n)
	errs := make(chan error, n)
	for i := range n {
		c := a
		if i%2 == 1 {
			c = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			e, src, err := c.Get(context.Background(), k, load, minute)
			if err == nil && string(e.Value) != "result" {
				err = fmt.Errorf("value %q", e.Value)
			}
			if err != nil {
				errs <- err
			}
			sources[i] = src
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := l.count(); got != 1 {
		t.Fatalf("loader called %d times for %d concurrent Gets on two instances, want 1", got, n)
	}
	misses := 0
	for _, s := range sources {
		if s == Miss {
			misses++
		}
	}
	if misses != 1 {
		t.Fatalf("%d Gets report Miss, want 1 (sources %v)", misses, sources)
	}
	if _, src := get(t, b, k, load, minute); src != Hit {
		t.Fatalf("Get after the load: %v, want hit", src)
	}
}

func testTenantIsolation(t *testing.T, e storeEnv) {
	c := newCache(t, e.store(t), nil)
	base := t.Name() + "/"
	scopes := []Scope{Tenant(base + "a"), Tenant(base + "b"), Tenant(base + "a}b"), Tenant(base + "a:b"), Shared(), Tenant("~shared")}
	var l loads
	for _, sc := range scopes {
		k := mustKey(t, sc, "search", `{"q":"x"}`)
		want := fmt.Sprintf("%v/%s", sc.Shared(), sc.Tenant())
		if v, src := get(t, c, k, l.fixed(want, 0), minute); v != want || src != Miss {
			t.Fatalf("scope %+v: first Get = %q %v, want its own load", sc, v, src)
		}
	}
	for _, sc := range scopes {
		k := mustKey(t, sc, "search", `{"q":"x"}`)
		want := fmt.Sprintf("%v/%s", sc.Shared(), sc.Tenant())
		if v, src := get(t, c, k, l.fixed("wrong", 0), minute); v != want || src != Hit {
			t.Fatalf("scope %+v sees %q (%v), want its own %q", sc, v, src, want)
		}
	}
	if l.count() != int64(len(scopes)) {
		t.Fatalf("%d loads for %d scopes", l.count(), len(scopes))
	}
}

func testCanonicalArguments(t *testing.T, e storeEnv) {
	c := newCache(t, e.store(t), nil)
	sc := scope(t)
	var l loads
	k1 := mustKey(t, sc, "search", `{"b":1,"a":[1.0,2],"s":"é\u0041"}`)
	k2 := mustKey(t, sc, "search", " { \"s\" : \"\\u00e9A\", \"a\" : [ 1, 2e0 ] ,\n \"b\" : 10e-1 } ")
	if k1 != k2 {
		t.Fatalf("keys differ: %s and %s", k1, k2)
	}
	get(t, c, k1, l.fixed("v", 0), minute)
	if v, src := get(t, c, k2, l.fixed("other", 0), minute); v != "v" || src != Hit {
		t.Fatalf("equivalent arguments: %q %v, want hit", v, src)
	}
	k3 := mustKey(t, sc, "search", `{"b":1,"a":[2,1],"s":"éA"}`)
	if _, src := get(t, c, k3, l.fixed("v3", 0), minute); src != Miss {
		t.Fatalf("different arguments: %v, want miss", src)
	}
	if k4 := mustKey(t, sc, "other_tool", `{"b":1,"a":[1,2],"s":"éA"}`); k4 == k1 {
		t.Fatal("two tools share a key")
	}
	for _, a := range []string{"", "null", "{}", "  "} {
		if k := mustKey(t, sc, "t", a); k != mustKey(t, sc, "t", "{}") {
			t.Fatalf("arguments %q: key differs from {}", a)
		}
	}
	if _, err := NewKey(sc, "t", json.RawMessage(`{"a":1,"a":2}`)); !errors.Is(err, ErrInvalidArguments) {
		t.Fatalf("duplicate member: %v, want ErrInvalidArguments", err)
	}
}

func testTags(t *testing.T, e storeEnv) {
	c := newCache(t, e.store(t), nil)
	ctx := context.Background()
	sc, other := scope(t), Tenant(t.Name()+"/other")
	var l loads
	pol := func(id string) Policy { return Policy{TTL: time.Minute, Tags: []string{"product:" + id, "all"}} }
	k1 := mustKey(t, sc, "search", `{"id":1}`)
	k2 := mustKey(t, sc, "search", `{"id":2}`)
	k1b := mustKey(t, sc, "lookup", `{"id":1}`)
	ko := mustKey(t, other, "search", `{"id":1}`)
	get(t, c, k1, l.fixed("1", 0), pol("1"))
	get(t, c, k2, l.fixed("2", 0), pol("2"))
	get(t, c, k1b, l.fixed("1b", 0), pol("1"))
	get(t, c, ko, l.fixed("o", 0), pol("1"))
	n, err := c.Invalidate(ctx, sc, []string{"product:1"})
	if err != nil || n != 2 {
		t.Fatalf("Invalidate(product:1) = %d, %v; want 2 entries", n, err)
	}
	if _, src := get(t, c, k1, l.fixed("1'", 0), pol("1")); src != Miss {
		t.Fatalf("invalidated entry: %v, want miss", src)
	}
	if _, src := get(t, c, k2, l.fixed("x", 0), pol("2")); src != Hit {
		t.Fatalf("entry of another tag: %v, want hit", src)
	}
	if v, src := get(t, c, ko, l.fixed("x", 0), pol("1")); src != Hit || v != "o" {
		t.Fatalf("other tenant's entry with the same tag: %q %v, want hit", v, src)
	}
	if n, err := c.Invalidate(ctx, sc, []string{"nothing"}); err != nil || n != 0 {
		t.Fatalf("Invalidate(unknown tag) = %d, %v", n, err)
	}
	// Two tags naming one entry count it once; "all" holds k1 (loaded
	// again), k2 and k1b (deleted above).
	if n, err := c.Invalidate(ctx, sc, []string{"all", "product:2"}); err != nil || n != 2 {
		t.Fatalf("Invalidate(all, product:2) = %d, %v; want 2", n, err)
	}
}

func testInvalidateDuringLoad(t *testing.T, e storeEnv) {
	c := newCache(t, e.store(t), nil)
	k := mustKey(t, scope(t), "search", `{"id":7}`)
	pol := Policy{TTL: time.Minute, Tags: []string{"product:7"}}
	started, finish := make(chan struct{}), make(chan struct{})
	done := make(chan string)
	go func() {
		v, _ := get(t, c, k, func(context.Context) ([]byte, bool, error) {
			close(started)
			<-finish
			return []byte("before the update"), false, nil
		}, pol)
		done <- v
	}()
	<-started
	// The update lands while the load (which read the old data) runs.
	if _, err := c.Invalidate(context.Background(), scope(t), []string{"product:7"}); err != nil {
		t.Fatal(err)
	}
	close(finish)
	if v := <-done; v != "before the update" {
		t.Fatalf("loader's caller got %q", v)
	}
	if r := c.Stats().Rejected; r != 1 {
		t.Fatalf("Rejected = %d, want 1: the load that raced an invalidation was stored", r)
	}
	var l loads
	if v, src := get(t, c, k, l.fixed("after the update", 0), pol); src != Miss || v != "after the update" {
		t.Fatalf("after the invalidation: %q %v, want a new load", v, src)
	}
}

func testNegative(t *testing.T, e storeEnv) {
	c := newCache(t, e.store(t), nil)
	sc := scope(t)
	var calls atomic.Int64
	negative := func(context.Context) ([]byte, bool, error) {
		calls.Add(1)
		return []byte(`{"isError":true}`), true, nil
	}
	pol := Policy{TTL: time.Minute, NegativeTTL: 200 * time.Millisecond}
	k := mustKey(t, sc, "search", `{}`)
	e1, src, err := c.Get(context.Background(), k, negative, pol)
	if err != nil || src != Miss || !e1.Negative {
		t.Fatalf("first Get: %+v %v %v", e1, src, err)
	}
	e2, src, err := c.Get(context.Background(), k, negative, pol)
	if err != nil || src != Hit || !e2.Negative || string(e2.Value) != `{"isError":true}` {
		t.Fatalf("second Get: %+v %v %v, want a negative hit", e2, src, err)
	}
	if e2.TTL > pol.NegativeTTL {
		t.Fatalf("negative entry TTL %v > NegativeTTL", e2.TTL)
	}
	time.Sleep(250 * time.Millisecond)
	// Past NegativeTTL, and negative entries keep no stale copy.
	if _, src, _ := c.Get(context.Background(), k, negative, pol); src != Miss || calls.Load() != 2 {
		t.Fatalf("after NegativeTTL: %v, %d calls; want a new load", src, calls.Load())
	}
	// NegativeTTL 0: negative results are not stored.
	k0 := mustKey(t, sc, "search", `{"n":0}`)
	for range 2 {
		if _, src, err := c.Get(context.Background(), k0, negative, minute); err != nil || src != Miss {
			t.Fatalf("NegativeTTL 0: %v %v, want a miss every time", src, err)
		}
	}
	if calls.Load() != 4 {
		t.Fatalf("%d calls, want 4", calls.Load())
	}
}

func testErrorsNotCached(t *testing.T, e storeEnv) {
	c := newCache(t, e.store(t), nil)
	k := mustKey(t, scope(t), "search", `{}`)
	errUpstream := errors.New("upstream 503")
	var calls atomic.Int64
	failing := func(context.Context) ([]byte, bool, error) { calls.Add(1); return nil, false, errUpstream }
	for range 2 {
		if _, _, err := c.Get(context.Background(), k, failing, minute); !errors.Is(err, errUpstream) {
			t.Fatalf("Get: %v, want the loader's error", err)
		}
	}
	if calls.Load() != 2 {
		t.Fatalf("%d loader calls, want 2: an error was cached", calls.Load())
	}
	panicking := func(context.Context) ([]byte, bool, error) { panic("boom") }
	if _, _, err := c.Get(context.Background(), k, panicking, minute); !errors.Is(err, ErrLoaderPanic) {
		t.Fatalf("panicking loader: %v", err)
	}
	var l loads
	if v, src := get(t, c, k, l.fixed("ok", 0), minute); v != "ok" || src != Miss {
		t.Fatalf("after errors: %q %v (the lock was not released?)", v, src)
	}
}
