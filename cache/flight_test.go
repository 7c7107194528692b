package cache

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
)

// hang bounds the waits of these tests: long enough for -race on a loaded
// 2-core machine, only there to turn a hang into a failure.
const hang = 10 * time.Second

// flightOf returns the flight of k that a Get would join now (nil: none).
func flightOf(c *Cache, k Key) *flight {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flights[k.entry]
}

// waitFor polls cond until it holds or hang passes, and reports which.
func waitFor(cond func() bool) bool {
	for deadline := time.Now().Add(hang); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return false
}

// received returns what ch delivers, failing the test if nothing comes
// within hang.
func received[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(hang):
		t.Fatalf("%s: nothing after %v", what, hang)
	}
	var zero T
	return zero
}

// A Get that begins after Invalidate returned must not be served by a load
// that read the data before the invalidated write: it starts a new flight,
// which later Gets join, while the old flight still answers its own
// caller; the old flight ending must not unregister the new one.
func TestGetAfterInvalidateDoesNotJoinEarlierFlight(t *testing.T) {
	c := newCache(t, mustMemoryStore(t), nil)
	k := mustKey(t, scope(t), "get_product", `{"id":1}`)
	pol := Policy{TTL: time.Minute, Tags: []string{"product:1"}}
	var db atomic.Value
	db.Store("price=10")
	// reads returns a loader that reads db, then waits for finish.
	reads := func(started, finish chan struct{}) Loader {
		return func(context.Context) ([]byte, bool, error) {
			v := db.Load().(string)
			close(started)
			<-finish
			return []byte(v), false, nil
		}
	}
	started1, finish1, release1 := gate(t)
	before := goGet(context.Background(), c, k, reads(started1, finish1), pol)
	received(t, started1, "the first load")
	old := flightOf(c, k)

	// The write, then its invalidation, land while that load runs.
	db.Store("price=20")
	if _, err := c.Invalidate(context.Background(), scope(t), []string{"product:1"}); err != nil {
		t.Fatal(err)
	}
	started2, finish2, release2 := gate(t)
	after := goGet(context.Background(), c, k, reads(started2, finish2), pol)
	if !waitFor(func() bool { return flightOf(c, k) != old }) {
		release1()
		t.Fatalf("the Get begun after the invalidation joined the flight begun before it (got %+v)", <-after)
	}
	fresh := flightOf(c, k)

	release1()
	if r := received(t, before, "the first Get"); r.err != nil || r.v != "price=10" || r.src != Miss {
		t.Fatalf("first Get: %+v, want its own load's value", r)
	}
	// The new flight waited for the old one's lock; its load runs now.
	received(t, started2, "the second load")
	if f := flightOf(c, k); f != fresh {
		t.Fatalf("the first flight's end unregistered the second (flights[key] = %p, want %p)", f, fresh)
	}
	var l loads
	joiner := goGet(context.Background(), c, k, l.fixed("third", 0), pol)
	release2()
	if r := received(t, after, "the second Get"); r.err != nil || r.v != "price=20" || r.src != Miss {
		t.Fatalf("Get after the invalidation: %+v, want price=20 (miss)", r)
	}
	if r := received(t, joiner, "the third Get"); r.err != nil || r.v != "price=20" || l.count() != 0 {
		t.Fatalf("Get joining the second flight: %+v (%d loads), want price=20 without a load", r, l.count())
	}
	if v, src := get(t, c, k, l.fixed("fourth", 0), pol); v != "price=20" || src != Hit {
		t.Fatalf("after both flights: %q %v, want the second load's stored value", v, src)
	}
	if f := flightOf(c, k); f != nil {
		t.Fatalf("a flight is left registered: %+v", f)
	}
}

// A Loader that ignores its context must not hold up the callers of its
// flight, the entry's lock or Close past LoadTimeout and a short grace:
// they get ErrLoaderAbandoned (a context.DeadlineExceeded), and the next
// Get loads anew.
func TestLoaderIgnoringContextIsAbandoned(t *testing.T) {
	// A LockTTL far past the test's waits: the next Get can only load if
	// the abandoned flight released the lock.
	c := newCache(t, mustMemoryStore(t), &Options{LoadTimeout: 300 * time.Millisecond, LockTTL: time.Hour})
	k := mustKey(t, scope(t), "t", `{}`)
	block := make(chan struct{})
	defer close(block) // the abandoned Loader ends with the test
	started := make(chan struct{})
	leader := goGet(context.Background(), c, k, func(context.Context) ([]byte, bool, error) {
		close(started)
		<-block // ignores its context
		return []byte("v"), false, nil
	}, minute)
	received(t, started, "the load")
	var l loads
	follower := goGet(context.Background(), c, k, l.fixed("w", 0), minute)

	r := received(t, leader, "the Get whose Loader ignores its context")
	if !errors.Is(r.err, ErrLoaderAbandoned) || !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("leader: %+v, want ErrLoaderAbandoned wrapping context.DeadlineExceeded", r)
	}
	// The follower joined that flight (its error) or, on a slow machine,
	// came after it had failed (its own load).
	if r := received(t, follower, "a Get waiting for that load"); !errors.Is(r.err, context.DeadlineExceeded) && r.v != "w" {
		t.Fatalf("follower: %+v", r)
	}
	if f := flightOf(c, k); f != nil {
		t.Fatalf("the abandoned flight is still registered: %+v", f)
	}
	// Without the lock released, this Get would wait for it (LockTTL).
	next := received(t, goGet(context.Background(), c, k, l.fixed("next", 0), minute), "the Get after the abandoned load")
	if ok := next.err == nil && (next.v == "next" && next.src == Miss || next.v == "w" && next.src == Hit); !ok {
		t.Fatalf("Get after the abandoned load: %+v, want a load under the released lock", next)
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	received(t, closed, "Close with an abandoned Loader still running")
}

func mustMemoryStore(t testing.TB) *MemoryStore {
	t.Helper()
	s, err := NewMemoryStore(nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitSpy is a context that tells (waiting) when Done is first asked for:
// with a MemoryStore, Get asks only once it waits for a flight in join.
type waitSpy struct {
	context.Context
	once    sync.Once
	waiting chan struct{}
}

func newWaitSpy() *waitSpy {
	return &waitSpy{Context: context.Background(), waiting: make(chan struct{})}
}

func (s *waitSpy) Done() <-chan struct{} {
	s.once.Do(func() { close(s.waiting) })
	return s.Context.Done()
}

// An invalidation through another instance (another Cache on the store)
// does not count in this Cache's invalidations: a Get that joined this
// instance's flight loading from before the write, and that may have
// begun after the invalidation returned, must not get that flight's value
// once the fence refused it. It loads anew.
func TestGetAfterRemoteInvalidateIsNotServedTheFencedLoad(t *testing.T) {
	store := mustMemoryStore(t)
	a, b := newCache(t, store, nil), newCache(t, store, nil)
	k := mustKey(t, scope(t), "get_product", `{"id":1}`)
	pol := Policy{TTL: time.Minute, Tags: []string{"product:1"}}
	var db atomic.Value
	db.Store("price=10")
	var l loads
	load := func(started, finish chan struct{}) Loader {
		return func(context.Context) ([]byte, bool, error) {
			l.n.Add(1)
			v := db.Load().(string)
			if started != nil {
				close(started)
				<-finish
			}
			return []byte(v), false, nil
		}
	}
	started, finish, release := gate(t)
	before := goGet(context.Background(), a, k, load(started, finish), pol)
	received(t, started, "the first load")

	db.Store("price=20")
	if _, err := b.Invalidate(context.Background(), scope(t), []string{"product:1"}); err != nil {
		t.Fatal(err)
	}
	spy := newWaitSpy()
	after := goGet(spy, a, k, load(nil, nil), pol)
	received(t, spy.waiting, "the second Get waiting")
	release()
	if r := received(t, before, "the first Get"); r.err != nil || r.v != "price=10" || r.src != Miss {
		t.Fatalf("first Get: %+v, want its own load's value", r)
	}
	if r := received(t, after, "the second Get"); r.err != nil || r.v != "price=20" {
		t.Fatalf("Get after another instance's invalidation: %+v, want price=20", r)
	}
	if v, src := get(t, b, k, load(nil, nil), pol); v != "price=20" || src != Hit {
		t.Fatalf("other instance: %q %v, want the new load's stored value", v, src)
	}
	if n := l.count(); n != 2 {
		t.Fatalf("%d loads, want 2", n)
	}
}

// testCommitFenced checks what join's rejoin relies on: every store tells
// a commit refused by the fence (after an invalidation) from one stored.
func testCommitFenced(t *testing.T, e storeEnv) {
	s := e.store(t)
	c := newCache(t, s, nil)
	k := mustKey(t, scope(t), "search", `{"id":3}`)
	pol := Policy{TTL: time.Minute, Tags: []string{"product:3"}}
	ctx := context.Background()
	lockAndCommit := func(invalidate bool) commitRes {
		t.Helper()
		token := c.token()
		acq := s.acquire(ctx, []acquireReq{c.acquireReq(k, pol, modeMiss, 0, token)})[0]
		if acq.err != nil || acq.status != statusLocked {
			t.Fatalf("acquire: %+v, want the lock", acq)
		}
		if invalidate {
			if _, err := c.Invalidate(ctx, scope(t), pol.Tags); err != nil {
				t.Fatal(err)
			}
		}
		rec := c.newRecord([]byte("v"), false, acq.fence, time.Millisecond, k, pol)
		return c.commit(ctx, []commitReq{{entry: k.entry, token: token, rec: rec}})[0]
	}
	if r := lockAndCommit(true); r.err != nil || r.stored || !r.fenced {
		t.Fatalf("commit after an invalidation: %+v, want refused by the fence", r)
	}
	if r := lockAndCommit(false); r.err != nil || !r.stored || r.fenced {
		t.Fatalf("commit under a current fence: %+v, want stored", r)
	}
}

// A Policy's LoadTimeout bounds its load instead of the Options' (the
// gateway's follows its config, which a reload may change): a load longer
// than Options.LoadTimeout but within the Policy's runs to its end and is
// stored, and the entry's lock lasts as long, so that another instance
// does not take it over meanwhile (its load would then win the fence and
// the first one's result be dropped).
func TestPolicyLoadTimeoutBoundsTheLoad(t *testing.T) {
	store := mustMemoryStore(t)
	o := &Options{LoadTimeout: 100 * time.Millisecond, LockTTL: 100 * time.Millisecond}
	c1, c2 := newCache(t, store, o), newCache(t, store, o)
	k := mustKey(t, scope(t), "t", `{}`)
	pol := Policy{TTL: time.Minute, LoadTimeout: 5 * time.Second}
	started, finish := make(chan struct{}), make(chan struct{})
	leader := goGet(context.Background(), c1, k, func(ctx context.Context) ([]byte, bool, error) {
		close(started)
		select {
		case <-finish:
			return []byte("v"), false, nil
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}, pol)
	received(t, started, "the load")
	time.Sleep(300 * time.Millisecond) // past the Options' bound and lock
	var l loads
	other := goGet(context.Background(), c2, k, l.fixed("w", 0), pol)
	time.Sleep(100 * time.Millisecond)
	close(finish)
	if r := received(t, leader, "the Get of the long load"); r.err != nil || r.v != "v" || r.src != Miss {
		t.Fatalf("a load within the Policy's LoadTimeout: %+v, want v from a miss", r)
	}
	if r := received(t, other, "another instance's Get"); r.err != nil || r.v != "v" || l.count() != 0 {
		t.Fatalf("another instance's Get during the load: %+v after %d loads, want v without a load of its own", r, l.count())
	}
	if _, src, err := c2.Get(context.Background(), k, l.fixed("w", 0), pol); err != nil || src != Hit {
		t.Fatalf("after the load: %v %v, want a hit on the stored value", src, err)
	}
}

// joinSpy is a context that tells (waiting) when join first asks for Done:
// the Get has boarded a flight and waits for it. Unlike waitSpy it works on
// a RedisStore too, whose read asks for Done before join does.
type joinSpy struct {
	context.Context
	once    sync.Once
	waiting chan struct{}
}

func newJoinSpy() *joinSpy {
	return &joinSpy{Context: context.Background(), waiting: make(chan struct{})}
}

func (s *joinSpy) Done() <-chan struct{} {
	pcs := make([]uintptr, 8)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.Function, ".(*Cache).join") {
			s.once.Do(func() { close(s.waiting) })
			break
		}
		if !more {
			break
		}
	}
	return s.Context.Done()
}

// A flight that could not get the lock in time (another instance holds
// it) loads without the store, and that load has no commit for the fence
// to refuse: a Get that begins after another instance's invalidation
// returned must not join it, as the load may have read the data before the
// write. It starts a flight of its own; the callers that boarded before the
// load began still share it.
func TestGetAfterRemoteInvalidateDoesNotJoinUncachedLoad(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	for name, mk := range map[string]func() Store{
		"memory": func() func() Store { s := mustMemoryStore(t); return func() Store { return s } }(),
		"redis":  func() Store { return mustRedisStore(t, r.Client(t)) },
	} {
		t.Run(name, func(t *testing.T) {
			a := newCache(t, mk(), nil)
			b := newCache(t, mk(), &Options{WaitTimeout: 100 * time.Millisecond})
			c := newCache(t, mk(), nil)
			k := mustKey(t, scope(t), "get_product", `{"id":1}`)
			pol := Policy{TTL: time.Minute, Tags: []string{"product:1"}}
			var db atomic.Value
			db.Store("price=10")
			aStarted, aFinish, aRelease := gate(t)
			holder := goGet(context.Background(), a, k, gated("a's", aStarted, aFinish), pol)
			received(t, aStarted, "a's load")

			// b's flight waits for a's lock, gives up and loads
			// without the store.
			bStarted, bFinish, bRelease := gate(t)
			first := goGet(context.Background(), b, k, func(context.Context) ([]byte, bool, error) {
				v := db.Load().(string)
				close(bStarted)
				<-bFinish
				return []byte(v), false, nil
			}, pol)
			received(t, bStarted, "b's uncached load")

			db.Store("price=20")
			if _, err := c.Invalidate(context.Background(), scope(t), []string{"product:1"}); err != nil {
				t.Fatal(err)
			}
			spy := newJoinSpy()
			after := goGet(spy, b, k, func(context.Context) ([]byte, bool, error) {
				return []byte(db.Load().(string)), false, nil
			}, pol)
			received(t, spy.waiting, "b's second Get boarding a flight")
			bRelease()
			if res := received(t, first, "b's first Get"); res.err != nil || res.v != "price=10" {
				t.Fatalf("b's first Get: %+v, want its own load's value", res)
			}
			if res := received(t, after, "b's Get after the invalidation"); res.err != nil || res.v != "price=20" {
				t.Fatalf("Get that began after the invalidation returned: %q %v %v, want price=20", res.v, res.src, res.err)
			}
			aRelease()
			<-holder
		})
	}
}
