//go:build unix

package cache

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
)

// These tests pin down the cause of the soak's stalled calls
// (docs/benchmarks.md, section H): a lock taken for a load that then never
// releases it. Waiters in other instances then wait for the lock's TTL
// (LockTTL, 10s by default: a client's whole timeout). Each test has one
// instance end up in that state through a store operation that did not
// complete as far as it could see, then checks that a second instance
// loads the key under the lock, instead of waiting until WaitTimeout and
// loading without storing (Stats.Uncached). The waiter's WaitTimeout is
// shorter than the lock's TTL only so that the failure shows within the
// test: it is not a bound on how fast the lock must go.

// orphanWaiter returns a cache on its own client whose waits end long
// before a lock left behind would expire.
func orphanWaiter(t *testing.T, r *testenv.Redis) *Cache {
	return newCache(t, mustRedisStore(t, r.Client(t)), &Options{WaitTimeout: 3 * time.Second})
}

// checkLoadsUnderLock runs a Get of k on c and checks that it took the
// lock, loaded and stored (no wait for a lock left behind), and that the
// value is then served.
func checkLoadsUnderLock(t *testing.T, c *Cache, k Key) {
	t.Helper()
	var l loads
	e, src, err := c.Get(context.Background(), k, l.fixed("b's", 0), minute)
	if err != nil || string(e.Value) != "b's" || src != Miss {
		t.Fatalf("waiter: %q %v %v, want its own load", e.Value, src, err)
	}
	if st := c.Stats(); st.Uncached != 0 || e.TTL <= 0 {
		t.Fatalf("the waiter loaded without storing (ttl %v, %+v): it waited out WaitTimeout "+
			"for a lock no one would release", e.TTL, st)
	}
	if v, src := get(t, c, k, l.fixed("again", 0), minute); v != "b's" || src != Hit {
		t.Fatalf("after the waiter's load: %q %v, want its stored value", v, src)
	}
}

// An acquire that times out on the caller's side can still run on the
// server afterwards (the command was sent) and take the lock for the
// caller's token. The caller has moved on (it loaded without the store),
// so that lock must be released when its reply comes, not left to expire.
// CLIENT PAUSE WRITE holds the acquire script on the server past the
// caller's timeout while reads go on.
func TestTimedOutAcquireDoesNotLeaveTheLock(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	admin := r.Client(t)
	aClient := r.Client(t)
	a := newCache(t, mustRedisStore(t, aClient), &Options{Timeout: 300 * time.Millisecond})
	b := orphanWaiter(t, r)
	k := mustKey(t, scope(t), "search", `{}`)
	ctx := context.Background()
	// rueidis sends a lone command with a deadline on its own and drops
	// the connection when the deadline passes (a paused script then never
	// runs); under load, as in the soak, commands are pipelined by a
	// background writer, and one that timed out still runs. A command with
	// a cancellable context and no deadline switches a's connection to
	// pipelining, as load does.
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := aClient.Do(pctx, aClient.B().Ping().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// The scripts are loaded (EVALSHA does not answer NOSCRIPT), as in a
	// gateway that has served a while.
	var la loads
	get(t, a, mustKey(t, scope(t), "search", `{"warm":1}`), la.fixed("warm", 0), minute)

	if err := admin.Do(ctx, admin.B().ClientPause().Timeout(2000).Write().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	e, src, err := a.Get(ctx, k, la.fixed("a's", 0), minute)
	if err != nil || string(e.Value) != "a's" || src != Miss || !errors.Is(e.StoreErr, context.DeadlineExceeded) {
		t.Fatalf("Get during the pause: %q %v %v (store error %v), want a load after the lock timed out",
			e.Value, src, err, e.StoreErr)
	}
	// A write on a's connection runs after a's acquire script (one
	// connection, in order): once it returns, the script has run and
	// taken the lock.
	if err := aClient.Do(ctx, aClient.B().Set().Key(t.Name()+":barrier").Value("1").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	checkLoadsUnderLock(t, b, k)
}

// A load that holds the lock while its instance's breaker opens cannot
// send its commit (the breaker skips it): the lock must still be
// released, without making the caller wait for a store that is down.
func TestCommitSkippedByTheBreakerReleasesTheLock(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	// The breaker stays open for the rest of the test.
	a := newCache(t, mustRedisStore(t, r.Client(t)), &Options{Timeout: 100 * time.Millisecond, ProbeInterval: time.Hour})
	b := orphanWaiter(t, r)
	sc := scope(t)
	k := mustKey(t, sc, "search", `{}`)
	started, finish, release := gate(t)
	loading := goGet(context.Background(), a, k, gated("a's", started, finish), minute)
	<-started // a holds the lock

	thaw := r.Freeze(t)
	openBreaker(t, a, sc)
	thaw()
	release()
	if res := <-loading; res.err != nil || res.v != "a's" || res.src != Miss {
		t.Fatalf("the lock holder's Get: %+v", res)
	}
	checkLoadsUnderLock(t, b, k)
	if a.StoreAvailable() {
		t.Fatal("a's breaker closed during the test")
	}
}

// A release skipped by the breaker (a load that failed while the breaker
// was open) must not leave the lock either.
func TestReleaseSkippedByTheBreakerReleasesTheLock(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	a := newCache(t, mustRedisStore(t, r.Client(t)), &Options{Timeout: 100 * time.Millisecond, ProbeInterval: time.Hour})
	b := orphanWaiter(t, r)
	sc := scope(t)
	k := mustKey(t, sc, "search", `{}`)
	started, finish, release := gate(t)
	boom := errors.New("upstream failed")
	loading := goGet(context.Background(), a, k, gatedErr(boom, started, finish), minute)
	<-started

	thaw := r.Freeze(t)
	openBreaker(t, a, sc)
	thaw()
	release()
	if res := <-loading; !errors.Is(res.err, boom) {
		t.Fatalf("the lock holder's Get: %+v, want the loader's error", res)
	}
	checkLoadsUnderLock(t, b, k)
}
