package cache_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/cache"
)

// newCache returns a Cache over an in-process store. Early refresh (XFetch)
// is random by design, so the examples turn it off to print the same
// output on every run; leave Beta at its default in production.
func newCache() *cache.Cache {
	store, err := cache.NewMemoryStore(nil)
	if err != nil {
		panic(err)
	}
	c, err := cache.New(store, &cache.Options{Beta: -1})
	if err != nil {
		panic(err)
	}
	return c
}

// A tool's result is loaded on the first call and served from the cache
// after that. Arguments that differ only in member order or whitespace
// share an entry; another tenant gets its own.
func Example() {
	c := newCache()
	defer c.Close()
	ctx := context.Background()

	loads := 0
	weather := func(ctx context.Context) ([]byte, bool, error) {
		loads++ // the upstream tool call
		return []byte(`{"content":[{"type":"text","text":"sunny"}]}`), false, nil
	}
	pol := cache.Policy{TTL: 5 * time.Minute}

	for _, call := range []struct{ tenant, args string }{
		{"acme", `{"city":"Oslo","units":"metric"}`},
		{"acme", `{ "units": "metric", "city": "Oslo" }`},
		{"globex", `{"city":"Oslo","units":"metric"}`},
	} {
		key, err := cache.NewKey(cache.Tenant(call.tenant), "weather", json.RawMessage(call.args))
		if err != nil {
			panic(err)
		}
		e, src, err := c.Get(ctx, key, weather, pol)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: %s %s\n", call.tenant, src, e.Value)
	}
	fmt.Println("loads:", loads)
	// Output:
	// acme: miss {"content":[{"type":"text","text":"sunny"}]}
	// acme: hit {"content":[{"type":"text","text":"sunny"}]}
	// globex: miss {"content":[{"type":"text","text":"sunny"}]}
	// loads: 2
}

// A tool-level failure (an isError result) is a negative entry, kept for
// Policy.NegativeTTL so that a missing item is not looked up again on every
// call. A Loader error (a timeout, an upstream 5xx) reaches the caller and
// is never stored: the next call tries again.
func ExampleCache_Get_negative() {
	c := newCache()
	defer c.Close()
	ctx := context.Background()
	pol := cache.Policy{TTL: 5 * time.Minute, NegativeTTL: 30 * time.Second}

	lookups := 0
	notFound := func(ctx context.Context) ([]byte, bool, error) {
		lookups++
		return []byte(`{"content":[{"type":"text","text":"no such order"}],"isError":true}`), true, nil
	}
	key, _ := cache.NewKey(cache.Tenant("acme"), "order", json.RawMessage(`{"id":42}`))
	for range 2 {
		e, src, err := c.Get(ctx, key, notFound, pol)
		if err != nil {
			panic(err)
		}
		fmt.Println(src, "negative:", e.Negative)
	}
	fmt.Println("lookups:", lookups)

	errUpstream := errors.New("upstream: 502 Bad Gateway")
	attempts := 0
	flaky := func(ctx context.Context) ([]byte, bool, error) {
		attempts++
		if attempts == 1 {
			return nil, false, errUpstream
		}
		return []byte(`{"content":[{"type":"text","text":"order 43: shipped"}]}`), false, nil
	}
	key, _ = cache.NewKey(cache.Tenant("acme"), "order", json.RawMessage(`{"id":43}`))
	_, _, err := c.Get(ctx, key, flaky, pol)
	fmt.Println(errors.Is(err, errUpstream))
	e, src, err := c.Get(ctx, key, flaky, pol)
	if err != nil {
		panic(err)
	}
	fmt.Println(src, string(e.Value), "attempts:", attempts)
	// Output:
	// miss negative: true
	// hit negative: true
	// lookups: 1
	// true
	// miss {"content":[{"type":"text","text":"order 43: shipped"}]} attempts: 2
}

// Many agents asking for the same uncached result at once make one upstream
// call: concurrent Gets of a key share one load (single flight), and a Get
// that arrives after it has landed is a hit. Which callers coalesce and
// which hit depends on scheduling; that there is one load and one miss does
// not.
func ExampleCache_Get_singleFlight() {
	c := newCache()
	defer c.Close()
	key, _ := cache.NewKey(cache.Shared(), "exchange_rate", json.RawMessage(`{"from":"EUR","to":"NOK"}`))

	var loads atomic.Int64
	release := make(chan struct{})
	slow := func(ctx context.Context) ([]byte, bool, error) {
		loads.Add(1)
		<-release // the upstream is slow: the other callers arrive meanwhile
		return []byte(`{"content":[{"type":"text","text":"11.72"}]}`), false, nil
	}

	const callers = 10
	values := make([]string, callers)
	var started, done sync.WaitGroup
	started.Add(callers)
	done.Add(callers)
	for i := range callers {
		go func() {
			defer done.Done()
			started.Done()
			e, _, err := c.Get(context.Background(), key, slow, cache.Policy{TTL: time.Hour})
			if err != nil {
				panic(err)
			}
			values[i] = string(e.Value)
		}()
	}
	started.Wait()
	close(release)
	done.Wait()

	s := c.Stats()
	fmt.Println("loads:", loads.Load(), "misses:", s.Misses, "hits+coalesced:", s.Hits+s.Coalesced)
	fmt.Println("all got", values[0], values[0] == values[callers-1])
	// Output:
	// loads: 1 misses: 1 hits+coalesced: 9
	// all got {"content":[{"type":"text","text":"11.72"}]} true
}

// Entries carry tags rendered from the call's arguments; a mutating tool
// invalidates by the same template, so the next read loads afresh.
func ExampleCache_Invalidate() {
	c := newCache()
	defer c.Close()
	ctx := context.Background()

	tags, err := cache.CompileTags([]string{"product:{{args.id}}"})
	if err != nil {
		panic(err)
	}
	price := 10
	getPrice := func(ctx context.Context) ([]byte, bool, error) {
		return fmt.Appendf(nil, `{"content":[{"type":"text","text":"%d EUR"}]}`, price), false, nil
	}
	read := func() {
		args := json.RawMessage(`{"id":"sku-1"}`)
		key, _ := cache.NewKey(cache.Tenant("acme"), "get_price", args)
		rendered, _ := tags.Render(args)
		e, src, err := c.Get(ctx, key, getPrice, cache.Policy{TTL: time.Hour, Tags: rendered})
		if err != nil {
			panic(err)
		}
		fmt.Println(src, string(e.Value))
	}
	read()

	// set_price {"id":"sku-1","price":12} succeeded upstream:
	price = 12
	rendered, _ := tags.Render(json.RawMessage(`{"id":"sku-1","price":12}`))
	n, err := c.Invalidate(ctx, cache.Tenant("acme"), rendered)
	if err != nil {
		panic(err)
	}
	fmt.Println("invalidated", rendered, n)
	read()
	read()
	// Output:
	// miss {"content":[{"type":"text","text":"10 EUR"}]}
	// invalidated [product:sku-1] 1
	// miss {"content":[{"type":"text","text":"12 EUR"}]}
	// hit {"content":[{"type":"text","text":"12 EUR"}]}
}
