package cache

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/internal/testenv"
)

// TestRedisDown checks that a Redis outage degrades to calling the loader:
// Gets still succeed, nothing is stored, errors are counted.
func TestRedisDown(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	opt := r.ClientOption()
	opt.DisableRetry = true
	client, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	c := newCache(t, mustRedisStore(t, client), &Options{Timeout: 200 * time.Millisecond})
	k := mustKey(t, scope(t), "search", `{}`)
	var l loads
	if _, src := get(t, c, k, l.fixed("v", 0), minute); src != Miss {
		t.Fatalf("first Get: %v", src)
	}
	r.Kill()
	for range 3 {
		if v, src := get(t, c, k, l.fixed("v2", 0), minute); v != "v2" || src != Miss {
			t.Fatalf("Get with Redis down: %q %v, want the loader's value", v, src)
		}
	}
	if st := c.Stats(); st.StoreErrors < 3 || st.Uncached != 3 || l.count() != 4 {
		t.Fatalf("stats with Redis down: %+v, %d loads", st, l.count())
	}
}

// TestRedisPollFallback checks waiters on a server without sharded pub/sub
// (forced here): they poll every PollInterval instead of being woken.
func TestRedisPollFallback(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	a := newCache(t, mustRedisStore(t, r.Client(t)), nil)
	bs := mustRedisStore(t, r.Client(t)).(*RedisStore)
	bs.pollOnly.Store(true)
	b := newCache(t, bs, &Options{PollInterval: 50 * time.Millisecond})
	k := mustKey(t, scope(t), "search", `{}`)
	started, finish := make(chan struct{}), make(chan struct{})
	slow := goGet(context.Background(), a, k, gated("v", started, finish), minute)
	<-started
	var lb loads
	waiter := goGet(context.Background(), b, k, lb.fixed("b's", 0), minute)
	time.Sleep(200 * time.Millisecond)
	landed := time.Now()
	close(finish)
	res := <-waiter
	if res.err != nil || res.v != "v" || res.src != Coalesced || lb.count() != 0 {
		t.Fatalf("polling waiter: %+v", res)
	}
	if d := res.at.Sub(landed); d > time.Second {
		t.Fatalf("polling waiter returned %v after the value landed", d)
	}
	if st := b.Stats(); st.StoreErrors != 0 {
		t.Fatalf("polling counted as store errors: %+v", st)
	}
	<-slow
}

func TestCheckEviction(t *testing.T) {
	ctx := context.Background()
	servers := []struct {
		name         string
		args         []string
		policy       string
		store, cache string // substrings of the warnings; "" means none
	}{
		{"default", nil, "noeviction", "", ""},
		{"lru with limit", []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"}, "allkeys-lru", "can evict rate-limit", ""},
		{"volatile with limit", []string{"--maxmemory", "100mb", "--maxmemory-policy", "volatile-lfu"}, "volatile-lfu", "can evict rate-limit", ""},
		{"noeviction with limit", []string{"--maxmemory", "100mb", "--maxmemory-policy", "noeviction"}, "noeviction", "", "cache writes fail"},
		{"lfu without limit", []string{"--maxmemory-policy", "allkeys-lfu"}, "allkeys-lfu", "", ""},
		{"config refused", []string{"--rename-command", "CONFIG", ""}, "", "CONFIG GET refused", "CONFIG GET refused"},
	}
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			client := testenv.StartRedis(t, &testenv.RedisOptions{Args: s.args}).Client(t)
			for role, want := range map[Role]string{RoleStore: s.store, RoleCache: s.cache} {
				policy, warning, err := CheckEviction(ctx, client, role)
				if err != nil || policy != s.policy {
					t.Fatalf("%s: policy %q, err %v; want %q", role, policy, err, s.policy)
				}
				if (want == "") != (warning == "") || !strings.Contains(warning, want) {
					t.Fatalf("%s: warning %q, want one containing %q", role, warning, want)
				}
			}
		})
	}
	client := testenv.StartRedis(t, nil).Client(t)
	if _, _, err := CheckEviction(ctx, client, "both"); err == nil {
		t.Fatal("unknown role accepted")
	}
}

// TestRedisCallerLeavingDuringReadIsNoStoreError: a caller whose context
// ends before its read is answered (a client hanging up) gets its context's
// error and changes nothing for others: no store error counted, no load
// started. Its read's failure used to be taken for the store's, starting a
// flight that loaded without the store for nobody: the callers joining it
// got a value it did not keep (Degraded), and the next Get missed again.
func TestRedisCallerLeavingDuringReadIsNoStoreError(t *testing.T) {
	for _, tc := range []struct {
		name string
		// leave makes the Get's context end; back runs once it returned.
		leave func(t *testing.T, r *testenv.Redis, cancel context.CancelFunc) (back func())
	}{
		{"ended before the read", func(_ *testing.T, _ *testenv.Redis, cancel context.CancelFunc) func() {
			cancel()
			return func() {}
		}},
		{"ends during the read", func(t *testing.T, r *testenv.Redis, cancel context.CancelFunc) func() {
			thaw := r.Freeze(t)
			go func() {
				time.Sleep(50 * time.Millisecond) // the read is sent, unanswered
				cancel()
			}()
			return thaw
		}},
		// The caller's own deadline, shorter than the store's timeout,
		// passing during the read: the store may be slow for nobody else.
		// Counted as a store failure, callers with short deadlines could
		// open the breaker (every tenant's cached tools uncached).
		{"deadline passes during the read", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testenv.StartRedis(t, nil)
			// rueidis waits for a command it sent until the read's own
			// deadline (Timeout), whatever the caller's context does.
			c := newCache(t, mustRedisStore(t, r.Client(t)), &Options{Timeout: time.Second, BreakerFailures: 1})
			k := mustKey(t, scope(t), "search", `{}`)
			var l loads
			ctx, cancel := context.WithCancel(context.Background())
			var back func()
			want := context.Canceled
			if tc.leave != nil {
				back = tc.leave(t, r, cancel)
			} else {
				back, want = r.Freeze(t), context.DeadlineExceeded
				ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
			}
			defer cancel()
			_, _, err := c.Get(ctx, k, l.fixed("left's", 0), minute)
			back()
			if !errors.Is(err, want) {
				t.Fatalf("Get of a caller that left: %v, want %v", err, want)
			}
			if !c.StoreAvailable() {
				t.Fatal("the store is skipped after a caller left: its leaving counted as a store failure")
			}
			if v, src := get(t, c, k, l.fixed("v", 0), minute); v != "v" || src != Miss {
				t.Fatalf("next Get: %q %v, want the loader's value, a miss", v, src)
			}
			if v, src := get(t, c, k, l.fixed("v2", 0), minute); v != "v" || src != Hit {
				t.Fatalf("third Get: %q %v, want the stored value, a hit", v, src)
			}
			if st := c.Stats(); st.StoreErrors != 0 || st.Degraded != 0 || st.Uncached != 0 || l.count() != 1 {
				t.Fatalf("stats %+v, %d loads: the caller that left counted a store error or started a load", st, l.count())
			}
		})
	}
}

// TestRedisMaxValueBytes: a value over RedisOptions.MaxValueBytes (2 MiB by
// default, as the memory store's) is served to its load's callers but not
// kept, whichever load made it (a miss, an early refresh, Warm), and the
// older value of the entry goes with it, as in the memory store. RedisStore
// used to keep values of any size: one too large to read back within
// Options.Timeout (a 16 MiB answer against cache.timeout's 25ms) timed out
// on every Get, the breaker counted the timeouts as the store down and,
// open, served every tenant's cached tools uncached, while the loads those
// Gets fell back to stored the value again.
func TestRedisMaxValueBytes(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	raw := r.Client(t)
	held := func(t *testing.T, k Key) int {
		t.Helper()
		n, err := raw.Do(context.Background(), raw.B().Strlen().Key(k.entry).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return int(n) // 0: no value
	}
	short := Policy{TTL: time.Millisecond} // the stale copy stays a minute
	for _, tc := range []struct {
		name string
		opts *RedisOptions
		size int
		kept bool
	}{
		{"at the default bound", nil, DefaultRedisMaxValueBytes, true},
		{"over the default bound", nil, DefaultRedisMaxValueBytes + 1, false},
		{"a 16 MiB answer", nil, 16 << 20, false},
		{"at a bound set", &RedisOptions{MaxValueBytes: 1 << 10}, 1 << 10, true},
		{"over a bound set", &RedisOptions{MaxValueBytes: 1 << 10}, 1<<10 + 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewRedisStore(r.Client(t), tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			value := strings.Repeat("v", tc.size)
			check := func(t *testing.T, c *Cache, k Key) {
				t.Helper()
				n := held(t, k)
				if kept := n > 0; kept != tc.kept || kept && n < tc.size || !kept && n != 0 {
					t.Fatalf("the store holds %d bytes for the entry after a load of a %d-byte value; kept %v, want %v (and no older value)", n, tc.size, kept, tc.kept)
				}
				if st := c.Stats(); st.StoreErrors != 0 || st.Degraded != 0 || !c.StoreAvailable() {
					t.Fatalf("stats %+v, store available %v", st, c.StoreAvailable())
				}
			}
			var l loads
			t.Run("miss", func(t *testing.T) {
				c := newCache(t, s, nil)
				k := mustKey(t, scope(t), "export", `{}`)
				get(t, c, k, l.fixed("old", 0), short)
				time.Sleep(5 * time.Millisecond) // "old" is stale
				if v, src := get(t, c, k, l.fixed(value, 0), minute); src != Miss || len(v) != tc.size {
					t.Fatalf("Get: %d bytes %v, want the loaded value, a miss", len(v), src)
				}
				check(t, c, k)
			})
			t.Run("early refresh", func(t *testing.T) {
				c := newCache(t, s, &Options{Beta: 1e12}) // every hit refreshes
				k := mustKey(t, scope(t), "export", `{}`)
				get(t, c, k, l.fixed("old", 0), minute)
				if v, src := get(t, c, k, l.fixed(value, 0), minute); src != Hit || v != "old" {
					t.Fatalf("Get: %q %v, want the stored value, a hit", v, src)
				}
				c.Close() // waits for the refresh
				if st := c.Stats(); st.Refreshes != 1 {
					t.Fatalf("%d refreshes, want 1", st.Refreshes)
				}
				check(t, c, k)
			})
			t.Run("warm", func(t *testing.T) {
				c := newCache(t, s, nil)
				k := mustKey(t, scope(t), "export", `{}`)
				get(t, c, k, l.fixed("old", 0), short)
				time.Sleep(5 * time.Millisecond) // "old" is stale
				if res, err := c.Warm(context.Background(), []WarmItem{{Key: k, Policy: minute, Load: l.fixed(value, 0)}}); err != nil || res.Loaded != 1 {
					t.Fatalf("Warm: %+v %v", res, err)
				}
				check(t, c, k)
			})
		})
	}
	if _, err := NewRedisStore(raw, &RedisOptions{MaxValueBytes: -1}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("negative MaxValueBytes: %v, want ErrInvalidOptions", err)
	}
}
