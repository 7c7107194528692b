//go:build unix

package cache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
)

// stopRedis freezes the server behind client with SIGSTOP, as a hung host
// or a stalled VM would: connections stay open, nothing answers. The
// returned func (also run when the test ends) resumes it with SIGCONT.
func stopRedis(t *testing.T, client rueidis.Client) (resume func()) {
	t.Helper()
	info, err := client.Do(context.Background(), client.B().Info().Section("server").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	pid := 0
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			pid, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	proc, err := os.FindProcess(pid)
	if pid <= 0 || err != nil {
		t.Fatalf("no process_id in INFO server (%v):\n%s", err, info)
	}
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			if err := proc.Signal(syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(resume)
	return resume
}

// openBreaker opens c's breaker with Gets of other keys of sc on a store
// that does not answer, failing the test if DefaultBreakerFailures of them
// do not open it.
func openBreaker(t *testing.T, c *Cache, sc Scope) {
	t.Helper()
	var l loads
	for i := 0; c.StoreAvailable(); i++ {
		if i == DefaultBreakerFailures {
			t.Fatalf("breaker still closed after %d failed Gets", i)
		}
		get(t, c, mustKey(t, sc, "search", fmt.Sprintf(`{"i":%d}`, i)), l.fixed("other", 0), minute)
	}
}

// eventually polls cond until it holds, failing the test after a generous
// bound (a hang, not a performance limit).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(15 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// A stalled Redis (SIGSTOP) costs Gets one store timeout each until the
// breaker opens; then Gets are served by the Loader without attempting the
// store at all, and once Redis runs again the probe closes the breaker and
// the stored entries are served again.
func TestBreakerSkipsAStalledRedis(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	client := r.Client(t)
	// The timeout only decides how long each attempt on the stalled server
	// waits; nothing below depends on its value.
	c := newCache(t, mustRedisStore(t, client), &Options{Timeout: 200 * time.Millisecond})
	k := mustKey(t, scope(t), "search", `{}`)
	var l loads
	if v, src := get(t, c, k, l.fixed("stored", 0), minute); v != "stored" || src != Miss {
		t.Fatalf("first Get: %q %v", v, src)
	}
	if v, src := get(t, c, k, l.fixed("unused", 0), minute); v != "stored" || src != Hit {
		t.Fatalf("second Get: %q %v, want a hit", v, src)
	}
	before := c.Stats()

	resume := stopRedis(t, client)
	// Each Get tries the store once (its read times out) and is served by
	// its Loader, until DefaultBreakerFailures of them opened the breaker.
	tries := 0
	for c.StoreAvailable() {
		if tries == DefaultBreakerFailures {
			t.Fatalf("breaker still closed after %d failed Gets: %+v", tries, c.Stats())
		}
		e, src, err := c.Get(context.Background(), k, l.fixed("upstream", 0), minute)
		if err != nil || string(e.Value) != "upstream" || src != Miss || e.StoreErr == nil {
			t.Fatalf("Get %d on a stalled Redis: %q %v %v, StoreErr %v; want the loader's value", tries, e.Value, src, err, e.StoreErr)
		}
		tries++
	}
	open := c.Stats()
	if tries != DefaultBreakerFailures || open.StoreErrors-before.StoreErrors != DefaultBreakerFailures {
		t.Fatalf("breaker opened after %d Gets and %d store errors, want %d of each",
			tries, open.StoreErrors-before.StoreErrors, DefaultBreakerFailures)
	}

	// Open: no store operation is attempted (every attempt on a stopped
	// server is an error, and none is added); each Get skips one.
	const n = 50
	for i := range n {
		e, src, err := c.Get(context.Background(), k, l.fixed("upstream", 0), minute)
		if err != nil || string(e.Value) != "upstream" || src != Miss {
			t.Fatalf("Get %d with the breaker open: %q %v %v", i, e.Value, src, err)
		}
		if !errors.Is(e.StoreErr, ErrStoreSkipped) {
			t.Fatalf("Get %d with the breaker open: StoreErr %v, want ErrStoreSkipped", i, e.StoreErr)
		}
	}
	st := c.Stats()
	switch {
	case st.StoreErrors != open.StoreErrors:
		t.Fatalf("%d store operations attempted with the breaker open", st.StoreErrors-open.StoreErrors)
	case st.StoreSkipped-open.StoreSkipped != n:
		t.Fatalf("%d store operations skipped by %d Gets, want one each", st.StoreSkipped-open.StoreSkipped, n)
	case st.Degraded-before.Degraded != n+DefaultBreakerFailures:
		t.Fatalf("Degraded grew by %d, want %d", st.Degraded-before.Degraded, n+DefaultBreakerFailures)
	case l.count() != 1+DefaultBreakerFailures+n:
		t.Fatalf("loader ran %d times, want %d (each degraded Get calls it)", l.count(), 1+DefaultBreakerFailures+n)
	}

	resume()
	eventually(t, "the probe to close the breaker", c.StoreAvailable)
	// The entry stored before the stall is served again; nothing was
	// stored meanwhile.
	if v, src := get(t, c, k, l.fixed("unused", 0), minute); v != "stored" || src != Hit {
		t.Fatalf("Get after the breaker closed: %q %v, want the stored entry", v, src)
	}
	if got := c.Stats().StoreSkipped; got != st.StoreSkipped {
		t.Fatalf("operations skipped after the breaker closed: %d", got-st.StoreSkipped)
	}
}

// Invalidate honours the timeout per round trip and the breaker too: on a
// stalled server it fails instead of hanging, and that failure opens the
// breaker at once (BreakerFailures is 2: a failed invalidation must be
// replayed before the store is used again, see
// TestInvalidationFailedDuringAnOutageIsReplayedOnRecovery); with the
// breaker open the next one is skipped.
func TestInvalidateOnAStalledRedis(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	client := r.Client(t)
	c := newCache(t, mustRedisStore(t, client), &Options{Timeout: 200 * time.Millisecond, BreakerFailures: 2})
	sc := scope(t)
	ctx := context.Background()
	if _, err := c.Invalidate(ctx, sc, []string{"t"}); err != nil {
		t.Fatal(err)
	}
	stopRedis(t, client)
	if _, err := c.Invalidate(ctx, sc, []string{"t"}); err == nil || errors.Is(err, ErrStoreSkipped) {
		t.Fatalf("Invalidate on a stalled Redis = %v, want a timeout", err)
	}
	if c.StoreAvailable() {
		t.Fatal("a failed invalidation did not open the breaker")
	}
	if _, err := c.Invalidate(ctx, sc, []string{"t"}); !errors.Is(err, ErrStoreSkipped) {
		t.Fatalf("Invalidate with the breaker open = %v, want ErrStoreSkipped", err)
	}
}

// Without a breaker (BreakerFailures < 0) every Get tries the store.
func TestBreakerCanBeTurnedOff(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	client := r.Client(t)
	c := newCache(t, mustRedisStore(t, client), &Options{Timeout: 100 * time.Millisecond, BreakerFailures: -1})
	k := mustKey(t, scope(t), "search", `{}`)
	stopRedis(t, client)
	var l loads
	for range DefaultBreakerFailures + 2 {
		if v, _ := get(t, c, k, l.fixed("upstream", 0), minute); v != "upstream" {
			t.Fatalf("Get = %q", v)
		}
	}
	if st := c.Stats(); !c.StoreAvailable() || st.StoreSkipped != 0 || st.StoreErrors != DefaultBreakerFailures+2 {
		t.Fatalf("without a breaker: available %v, %+v", c.StoreAvailable(), st)
	}
}

// A Get waiting for another instance's load stops waiting when the store's
// breaker opens (the value could only reach it through the store) and is
// served by its own Loader, instead of waiting out WaitTimeout.
func TestWaiterGivesUpWhenTheBreakerOpens(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	admin := r.Client(t)
	// Nothing else ends b's wait within the test: a's lock lives an hour,
	// and b's client does not declare a silent connection dead for an
	// hour (rueidis's default is 10s).
	a := newCache(t, mustRedisStore(t, r.Client(t)), &Options{LockTTL: time.Hour})
	opt := r.ClientOption()
	opt.ConnWriteTimeout = time.Hour
	bc, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bc.Close)
	b := newCache(t, mustRedisStore(t, bc), &Options{Timeout: 200 * time.Millisecond, WaitTimeout: time.Hour})
	sc := scope(t)
	k := mustKey(t, sc, "search", `{}`)
	started, finish, release := gate(t)
	slow := goGet(context.Background(), a, k, gated("a's", started, finish), minute)
	<-started
	var lb loads
	waiter := goGet(context.Background(), b, k, lb.fixed("b's", 0), minute)
	// b waits once it subscribed to the entry's wake-ups.
	ch := keyspace.CacheChannel(k.entry)
	eventually(t, "the waiter to subscribe", func() bool {
		m, err := admin.Do(context.Background(), admin.B().PubsubShardnumsub().Channel(ch).Build()).AsIntMap()
		return err == nil && m[ch] == 1
	})

	resume := stopRedis(t, admin)
	// Other Gets of b fail on the stalled store and open its breaker.
	openBreaker(t, b, sc)
	select {
	case res := <-waiter:
		if res.err != nil || res.v != "b's" || res.src != Miss {
			t.Fatalf("waiter after the breaker opened: %+v, want its own load", res)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter still waits with the breaker open (WaitTimeout is an hour)")
	}
	resume()
	release()
	if res := <-slow; res.err != nil || res.v != "a's" {
		t.Fatalf("the lock holder's Get: %+v", res)
	}
}
