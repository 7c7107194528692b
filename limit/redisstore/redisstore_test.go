package redisstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
)

func TestNew(t *testing.T) {
	if _, err := New(nil, nil); err == nil {
		t.Error("New(nil client) succeeded")
	}
	r := testenv.StartRedis(t, nil)
	c := r.Client(t)
	if _, err := New(c, &Options{Timeout: -time.Second}); err == nil {
		t.Error("New with a negative timeout succeeded")
	}
	for _, tc := range []struct {
		opts *Options
		want time.Duration
	}{{nil, DefaultTimeout}, {&Options{}, DefaultTimeout}, {&Options{Timeout: time.Second}, time.Second}} {
		s, err := New(c, tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		if s.timeout != tc.want {
			t.Errorf("New(%+v).timeout = %v, want %v", tc.opts, s.timeout, tc.want)
		}
	}
}

func TestInvalidCalls(t *testing.T) {
	_, c, s := startStore(t)
	ctx := ctxT(t)
	good := tenantChecks("t", rule("fw", limit.FixedWindow, 1, time.Second))
	bad := tenantChecks("t", rule("fw", limit.FixedWindow, 0, time.Second))
	before, _ := libCalls(t, c)
	for _, tc := range []struct {
		name string
		err  error
		call func() error
	}{
		{"take no checks", limit.ErrNoChecks, func() error { _, err := s.Take(ctx, nil, 1); return err }},
		{"take cost 0", limit.ErrInvalidCost, func() error { _, err := s.Take(ctx, good, 0); return err }},
		{"take bad rule", limit.ErrInvalidRule, func() error { _, err := s.Take(ctx, bad, 1); return err }},
		{"refund cost 0", limit.ErrInvalidCost, func() error { return s.Refund(ctx, good, 0, "") }},
		{"release no checks", limit.ErrNoChecks, func() error { return s.Release(ctx, nil, "x") }},
	} {
		if err := tc.call(); !errors.Is(err, tc.err) || !strings.HasPrefix(err.Error(), "redisstore: ") {
			t.Errorf("%s: %v, want %v wrapped by redisstore", tc.name, err, tc.err)
		}
	}
	if after, _ := libCalls(t, c); after != before {
		t.Errorf("invalid calls ran %d scripts", after-before)
	}
}

// A batch whose checks are in different slots is refused before any I/O,
// also by a standalone server (see TestCluster for a cluster client).
func TestCrossSlot(t *testing.T) {
	_, c, s := startStore(t)
	ctx := ctxT(t)
	fw := rule("fw", limit.FixedWindow, 5, time.Second)
	cc := rule("cc", limit.Concurrency, 5, time.Second)
	checks := append(tenantChecks("alice", fw), tenantChecks("bob", cc)...)
	before, _ := libCalls(t, c)
	_, err := s.Take(ctx, checks, 1)
	if !errors.Is(err, ErrCrossSlot) {
		t.Errorf("Take: %v, want ErrCrossSlot", err)
	}
	if err := s.Refund(ctx, checks, 1, "x"); !errors.Is(err, ErrCrossSlot) {
		t.Errorf("Refund: %v, want ErrCrossSlot", err)
	}
	if err := s.Release(ctx, checks, "x"); !errors.Is(err, ErrCrossSlot) {
		t.Errorf("Release: %v, want ErrCrossSlot", err)
	}
	if after, _ := libCalls(t, c); after != before {
		t.Errorf("cross-slot calls ran %d scripts", after-before)
	}
	// One tenant's counters, even with awkward names, share a slot.
	same := tenantChecks("a}b{c:d", fw, cc)
	if _, err := s.Take(ctx, same, 1); err != nil {
		t.Errorf("Take in one slot: %v", err)
	}
}

// A denied request writes nothing, whatever the other checks say.
func TestDeniedWritesNothing(t *testing.T) {
	_, c, s := startStore(t)
	ctx := ctxT(t)
	tb := rule("tb", limit.TokenBucket, 2, time.Minute)
	rules := []limit.Rule{
		rule("fw", limit.FixedWindow, 10, time.Minute), rule("swc", limit.SlidingWindowCounter, 10, time.Minute),
		rule("gc", limit.GCRA, 10, time.Minute), rule("sw", limit.SlidingWindow, 10, time.Minute),
		rule("cc", limit.Concurrency, 10, time.Minute), tb,
	}
	checks := tenantChecks("deny", rules...)
	d, err := s.Take(ctx, checks, 3) // above tb's capacity: never
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Rule.Name != "tb" || d.RetryAfter != limit.Never || d.Lease != "" {
		t.Fatalf("Take = %+v, want a denial by tb with RetryAfter Never and no lease", d)
	}
	for i, r := range d.Results[:5] {
		if !r.Allowed {
			t.Errorf("check %s: %+v, want allowed on its own", rules[i].Name, r)
		}
	}
	if n, err := c.Do(ctx, c.B().Dbsize().Build()).AsInt64(); err != nil || n != 0 {
		t.Errorf("DBSIZE after a denial = %d, %v; want 0", n, err)
	}
	// A shadow rule that denies does not stop the others, and is not charged.
	shadow := rule("tb", limit.TokenBucket, 2, time.Minute)
	shadow.Shadow = true
	checks = tenantChecks("deny", rules[0], shadow)
	if d, err = s.Take(ctx, checks, 3); err != nil || !d.Allowed || d.Results[1].Allowed {
		t.Fatalf("Take with a denying shadow = %+v, %v; want allowed, shadow denied", d, err)
	}
	if n, err := c.Do(ctx, c.B().Exists().Key(checks[1].Key).Build()).AsInt64(); err != nil || n != 0 {
		t.Errorf("the denying shadow's key exists (%d, %v)", n, err)
	}
}

func TestLease(t *testing.T) {
	_, _, s := startStore(t)
	ctx := ctxT(t)
	d, err := s.Take(ctx, tenantChecks("l", rule("fw", limit.FixedWindow, 5, time.Second)), 1)
	if err != nil || d.Lease != "" {
		t.Errorf("Take without concurrency: lease %q, %v; want none", d.Lease, err)
	}
	checks := tenantChecks("l", rule("cc", limit.Concurrency, 1, time.Minute))
	d, err = s.Take(ctx, checks, 1)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := hex.DecodeString(d.Lease); err != nil || len(b) != 16 {
		t.Errorf("lease %q: want 16 bytes in hex", d.Lease)
	}
	if d2, _ := s.Take(ctx, checks, 1); d2.Allowed || d2.Lease != "" {
		t.Errorf("second Take on a full concurrency rule = %+v, want denied without lease", d2)
	}
	if err := s.Release(ctx, checks, "someone-else"); err != nil {
		t.Fatal(err)
	}
	if d2, _ := s.Take(ctx, checks, 1); d2.Allowed {
		t.Error("releasing another lease freed the slot")
	}
	for range 2 { // twice is harmless
		if err := s.Release(ctx, checks, d.Lease); err != nil {
			t.Fatal(err)
		}
	}
	if d2, err := s.Take(ctx, checks, 1); err != nil || !d2.Allowed || d2.Lease == d.Lease {
		t.Errorf("Take after Release = %+v, %v; want allowed under a new lease", d2, err)
	}
}

// Release with no lease or no concurrency check does no I/O.
func TestReleaseWithoutLease(t *testing.T) {
	_, c, s := startStore(t)
	ctx := ctxT(t)
	before, _ := libCalls(t, c)
	if err := s.Release(ctx, tenantChecks("r", rule("cc", limit.Concurrency, 1, time.Second)), ""); err != nil {
		t.Error(err)
	}
	if err := s.Release(ctx, tenantChecks("r", rule("fw", limit.FixedWindow, 1, time.Second)), "abc"); err != nil {
		t.Error(err)
	}
	if after, _ := libCalls(t, c); after != before {
		t.Errorf("Release ran %d scripts, want none", after-before)
	}
}

// N concurrent callers against limit L: exactly L admitted, every algorithm.
func TestExactAdmissions(t *testing.T) {
	_, _, s := startStore(t)
	const limitN, callers, each = 25, 40, 3
	for _, a := range limit.Algorithms {
		t.Run(string(a), func(t *testing.T) {
			ctx := ctxT(t)
			// an hour-long period: nothing refills during the test
			checks := tenantChecks("crowd-"+string(a), rule("r", a, limitN, time.Hour))
			var admitted atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, callers*each)
			for range callers {
				wg.Go(func() {
					for range each {
						d, err := s.Take(ctx, checks, 1)
						if err != nil {
							errs <- err
							return
						}
						if d.Allowed {
							admitted.Add(1)
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if got := admitted.Load(); got != limitN {
				t.Errorf("%d admitted of %d calls, want exactly %d", got, callers*each, limitN)
			}
		})
	}
}

// After SCRIPT FLUSH, EVALSHA gets NOSCRIPT and the script is sent once
// with EVAL; after FUNCTION FLUSH, FCALL gets "Function not found", the
// library is loaded once more and the call sent again as FCALL. Either way
// the call succeeds and is applied exactly once.
func TestNoScriptFallback(t *testing.T) {
	for _, tc := range []struct {
		name      string
		functions bool
		flush     func(c rueidis.Client) rueidis.Completed
		resent    string // the command that carries the call again
	}{
		{"script", false, func(c rueidis.Client) rueidis.Completed { return c.B().ScriptFlush().Build() }, "eval"},
		{"function", true, func(c rueidis.Client) rueidis.Completed { return c.B().FunctionFlush().Build() }, "function|load"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testenv.StartRedis(t, nil)
			c := r.Client(t)
			s, err := New(c, &Options{Timeout: testTimeout, NoFunctions: !tc.functions})
			if err != nil {
				t.Fatal(err)
			}
			ctx := ctxT(t)
			checks := tenantChecks("noscript", rule("fw", limit.FixedWindow, 100, time.Hour))
			take := taker(t, ctx, s, checks)
			call := "evalsha"
			if tc.functions {
				call = "fcall"
			}
			take() // loads the library (or the script: NOSCRIPT, then EVAL)
			n0, _ := commandCalls(t, c, call)
			r0, _ := commandCalls(t, c, tc.resent)
			for range 3 {
				take()
			}
			n1, _ := commandCalls(t, c, call)
			r1, _ := commandCalls(t, c, tc.resent)
			if n1-n0 != 3 || r1 != r0 {
				t.Errorf("3 calls with the library loaded: %d %s, %d %s; want 3 and 0", n1-n0, call, r1-r0, tc.resent)
			}
			if err := c.Do(ctx, tc.flush(c)).Error(); err != nil {
				t.Fatal(err)
			}
			d := take()
			if r2, _ := commandCalls(t, c, tc.resent); r2-r1 != 1 {
				t.Errorf("after the flush: %d %s, want 1", r2-r1, tc.resent)
			}
			if d.Remaining != 95 {
				t.Errorf("after 5 calls, %d remaining; want 95 (the call after the flush applied once)", d.Remaining)
			}
			if d = take(); d.Remaining != 94 {
				t.Errorf("next call: %d remaining, want 94", d.Remaining)
			}
		})
	}
}

// A server without Redis Functions (or a user not allowed FUNCTION LOAD)
// gets the script: the store falls back to EVALSHA for good.
func TestFunctionsRefused(t *testing.T) {
	r := testenv.StartRedis(t, &testenv.RedisOptions{Args: []string{"--rename-command", "FUNCTION", ""}})
	c := r.Client(t)
	s := newStore(t, c, testTimeout)
	ctx := ctxT(t)
	checks := tenantChecks("nofn", rule("fw", limit.FixedWindow, 100, time.Hour))
	for i := range 3 {
		d, err := s.Take(ctx, checks, 1)
		if err != nil || d.Remaining != int64(99-i) {
			t.Fatalf("take %d: %+v, %v", i+1, d, err)
		}
	}
	if n, _ := commandCalls(t, c, "fcall"); n != 0 {
		t.Errorf("%d FCALL on a server without FUNCTION", n)
	}
	if s.lib.mode.Load() != modeScripts {
		t.Errorf("library mode %d, want scripts", s.lib.mode.Load())
	}
}

// A call that times out because the server is stalled returns at its
// deadline, and is never replayed: when the server wakes up it may run the
// call once (it was sent), never twice.
func TestTimeoutNotReplayed(t *testing.T) {
	r := testenv.StartRedis(t, &testenv.RedisOptions{Args: []string{"--enable-debug-command", "yes"}})
	c := r.Client(t)
	other := r.Client(t) // reads, and the stall, on their own connection
	const timeout = 100 * time.Millisecond
	s := newStore(t, c, timeout)
	ctx := ctxT(t)
	checks := tenantChecks("slow", rule("fw", limit.FixedWindow, 100, time.Hour))
	warmUp(t, func() error { _, err := s.Take(ctx, checks, 1); return err }) // loads the script
	sha0, _ := libCalls(t, other)
	eval0, _ := commandCalls(t, other, "eval")

	stalled := make(chan error, 1)
	go func() {
		stalled <- other.Do(ctx, other.B().Arbitrary("DEBUG", "SLEEP").Args("1").Build()).Error()
	}()
	time.Sleep(200 * time.Millisecond) // let DEBUG SLEEP start
	began := time.Now()
	_, err := s.Take(ctx, checks, 1)
	elapsed := time.Since(began)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Take on a stalled server: %v, want context.DeadlineExceeded", err)
	}
	if elapsed > timeout+300*time.Millisecond {
		t.Errorf("Take returned after %v, want about %v", elapsed, timeout)
	}
	if err := <-stalled; err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
	time.Sleep(100 * time.Millisecond) // let a replay, if any, arrive

	sha1, _ := libCalls(t, other)
	eval1, _ := commandCalls(t, other, "eval")
	v, err := other.Do(ctx, other.B().Get().Key(checks[0].Key).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	count := v[strings.IndexByte(v, ' ')+1:]
	t.Logf("after the timeout: %d calls ran (%d EVAL); counter state %q", sha1-sha0, eval1-eval0, v)
	if sha1-sha0 > 1 || eval1 != eval0 || (count != "1" && count != "2") {
		t.Errorf("the timed-out call ran %d times (count %s); want at most once", sha1-sha0, count)
	}
	// The client recovers.
	if _, err := s.Take(ctx, checks, 1); err != nil {
		t.Errorf("Take after the stall: %v", err)
	}
}

// A dead server gives an error within the timeout, no hang; the store works
// again once the server is back.
func TestKilledServer(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	const timeout = 200 * time.Millisecond
	s := newStore(t, r.Client(t), timeout)
	ctx := ctxT(t)
	checks := tenantChecks("dead", rule("tb", limit.TokenBucket, 10, time.Second))
	warmUp(t, func() error { _, err := s.Take(ctx, checks, 1); return err })
	r.Kill()
	for i := range 3 {
		began := time.Now()
		_, err := s.Take(ctx, checks, 1)
		if elapsed := time.Since(began); elapsed > timeout+300*time.Millisecond {
			t.Errorf("call %d: Take returned after %v, want within about %v", i, elapsed, timeout)
		}
		if err == nil {
			t.Fatalf("call %d: Take on a dead server succeeded", i)
		}
		if !strings.HasPrefix(err.Error(), "redisstore: take: ") {
			t.Errorf("error %q is not wrapped", err)
		}
	}
	if err := s.Refund(ctx, checks, 1, ""); err == nil {
		t.Error("Refund on a dead server succeeded")
	}
	r.Restart(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := s.Take(ctx, checks, 1)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Take still fails 10s after the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Every key the store writes has a TTL, across all algorithms and all
// operations.
func TestTTLOnEveryKey(t *testing.T) {
	_, c, s := startStore(t)
	ctx := ctxT(t)
	var rules []limit.Rule
	for _, a := range limit.Algorithms {
		rules = append(rules, rule("r-"+string(a), a, 5, 3*time.Second))
	}
	for i := range 20 {
		checks := tenantChecks(fmt.Sprintf("ttl-%d", i%4), rules[i%len(rules):]...)
		d, err := s.Take(ctx, checks, int64(1+i%3))
		if err != nil {
			t.Fatal(err)
		}
		switch i % 4 {
		case 1:
			err = s.Refund(ctx, checks, 1, d.Lease)
		case 2:
			err = s.Release(ctx, checks, d.Lease)
		}
		if err != nil {
			t.Fatal(err)
		}
		s.offset.Add(700_000)
	}
	if n := allKeysExpire(t, c); n < 10 {
		t.Errorf("only %d keys checked", n)
	}
}

// A call whose connection breaks while it waits on the server fails; rueidis
// does not send it again on a new connection, though the context is still
// valid. (CLIENT PAUSE WRITE holds the script; CLIENT KILL breaks the
// connection; a paused command of a killed client never runs.)
func TestConnectionLossNotReplayed(t *testing.T) {
	r := testenv.StartRedis(t, nil)
	c := r.Client(t)
	other := r.Client(t)
	s := newStore(t, c, testTimeout)
	ctx := ctxT(t)
	checks := tenantChecks("lost", rule("fw", limit.FixedWindow, 100, time.Hour))
	if _, err := s.Take(ctx, checks, 1); err != nil {
		t.Fatal(err)
	}
	do := func(args ...string) {
		t.Helper()
		if err := other.Do(ctx, other.B().Arbitrary(args[0]).Args(args[1:]...).Build()).Error(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	do("CLIENT", "PAUSE", "5000", "WRITE")
	t.Cleanup(func() { _ = other.Do(context.Background(), other.B().ClientUnpause().Build()).Error() })
	done := make(chan error, 1)
	go func() {
		_, err := s.Take(ctx, checks, 1)
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // the call is now held by the pause
	do("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
	time.Sleep(200 * time.Millisecond) // a replay, if any, is now queued behind the pause
	do("CLIENT", "UNPAUSE")
	select {
	case err := <-done:
		if err == nil {
			t.Error("Take succeeded although its connection was killed: it was replayed")
		}
	case <-time.After(testTimeout):
		t.Fatal("Take did not return")
	}
	time.Sleep(100 * time.Millisecond)
	v, err := other.Do(ctx, other.B().Get().Key(checks[0].Key).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	if count := v[strings.IndexByte(v, ' ')+1:]; count != "1" {
		t.Errorf("counter %s after the lost call, want 1 (not run, not replayed)", count)
	}
}

// A sliding-window request of many units logs one unique member per unit,
// in chunks (Lua's unpack takes a few thousand values at most), and a refund
// removes exactly that many.
func TestSlidingWindowLargeCost(t *testing.T) {
	_, c, s := startStore(t)
	ctx := ctxT(t)
	checks := tenantChecks("big", rule("sw", limit.SlidingWindow, limit.MaxSlidingWindowLimit, time.Minute))
	card := func() int64 {
		t.Helper()
		n, err := c.Do(ctx, c.B().Zcard().Key(checks[0].Key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, st := range []struct {
		op      string
		cost    int64
		allowed bool
		card    int64
	}{
		{"take", 5000, true, 5000},
		{"refund", 1200, true, 3800},
		{"take", limit.MaxSlidingWindowLimit - 3800 + 1, false, 3800},
		{"take", limit.MaxSlidingWindowLimit - 3800, true, limit.MaxSlidingWindowLimit},
	} {
		if st.op == "refund" {
			if err := s.Refund(ctx, checks, st.cost, ""); err != nil {
				t.Fatal(err)
			}
		} else {
			d, err := s.Take(ctx, checks, st.cost)
			if err != nil || d.Allowed != st.allowed {
				t.Fatalf("Take(%d) = %+v, %v; want allowed %v", st.cost, d, err, st.allowed)
			}
		}
		if n := card(); n != st.card {
			t.Errorf("after %s(%d): %d members, want %d", st.op, st.cost, n, st.card)
		}
	}
}
