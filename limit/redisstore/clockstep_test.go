package redisstore

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// The Redis server's clock steps back 50 ms across a window boundary (an
// NTP step, or a Cluster failover to a replica whose clock lags), simulated
// with the store's clock offset: a counter's time does not go back with
// it. Before, a window the clock had left read as empty again and the next
// window admitted 2L; counting admissions by the window the script's
// clock put them in, none may exceed L.
func TestClockSteppingBackReopensNoWindow(t *testing.T) {
	for _, alg := range []limit.Algorithm{limit.FixedWindow, limit.SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) { clockStepBack(t, alg) })
	}
}

func clockStepBack(t *testing.T, alg limit.Algorithm) {
	_, c, s := startStore(t)
	const L = 5
	p := time.Second
	r := limit.Rule{Name: "w", Algorithm: alg, Limit: L, Period: p}
	checks := tenantChecks("stepback-"+string(alg), r)
	align(t, c, s, p) // 1 ms past a window start
	perWindow := map[int64]int{}
	takeAll := func() {
		for range L {
			res, _, now, err := s.take(t.Context(), checks, 1)
			if err != nil {
				t.Fatal(err)
			}
			if res[0].Allowed {
				perWindow[now/p.Microseconds()]++
			}
		}
	}
	takeAll()
	s.offset.Add(-(50 * time.Millisecond).Microseconds()) // the clock steps back
	takeAll()
	s.offset.Add((50 * time.Millisecond).Microseconds()) // and catches up
	takeAll()
	t.Logf("admitted per window: %v", perWindow)
	for w, n := range perWindow {
		if n > L {
			t.Errorf("window %d: %d admitted, limit %d (all windows: %v)", w, n, L, perWindow)
		}
	}
}

// The same clock step back (500 ms) on a token bucket (1000/s, burst 1000):
// the interval stepped back is not refilled twice. Over the script-clock
// interval [first, last] a bucket admits at most burst + that interval's
// refill (before, 1591 against a bound of about 1090).
func TestClockSteppingBackRefillsNoBucketTwice(t *testing.T) {
	_, c, s := startStore(t)
	r := limit.Rule{Name: "tb", Algorithm: limit.TokenBucket, Limit: 1000, Period: time.Second}
	checks := tenantChecks("stepback-tb", r)
	_ = c
	var first, last int64 = -1, 0
	admitted := int64(0)
	takeN := func(cost int64) {
		res, _, now, err := s.take(t.Context(), checks, cost)
		if err != nil {
			t.Fatal(err)
		}
		if first < 0 {
			first = now
		}
		last = max(last, now)
		if res[0].Allowed {
			admitted += cost
		}
	}
	takeN(999)
	s.offset.Add(-(500 * time.Millisecond).Microseconds()) // the clock steps back
	takeN(1)
	s.offset.Add((500 * time.Millisecond).Microseconds()) // and catches up
	takeN(1000)
	for range 1000 {
		takeN(1)
	}
	bound := r.Limit + (last-first)*r.Limit/r.Period.Microseconds() + 1
	t.Logf("admitted %d over %v of server clock; bound %d", admitted, time.Duration(last-first)*time.Microsecond, bound)
	if admitted > bound {
		t.Errorf("admitted %d > burst + refill = %d", admitted, bound)
	}
}

// After the same clock step back (300 ms), a denial's RetryAfter counts the
// gap between the counter's time and the server's clock: a client that
// waits exactly RetryAfter, with nobody else calling, is admitted. Before,
// the windows and the bucket counted it from the counter's (later) time,
// so the retry came early by the size of the step and was denied again;
// GCRA, which keeps the server's clock, is here as the reference.
func TestClockSteppingBackRetryAfterFits(t *testing.T) {
	const p = time.Second
	for _, alg := range []limit.Algorithm{limit.FixedWindow, limit.SlidingWindowCounter, limit.TokenBucket, limit.GCRA} {
		t.Run(string(alg), func(t *testing.T) {
			_, c, s := startStore(t)
			r := limit.Rule{Name: "w", Algorithm: alg, Limit: 5, Period: p}
			checks := tenantChecks("retry-stepback-"+string(alg), r)
			align(t, c, s, p) // 1 ms past a window start
			ctx := t.Context()
			if _, err := s.Take(ctx, checks, 1); err != nil {
				t.Fatal(err)
			}
			s.offset.Add(-(300 * time.Millisecond).Microseconds()) // the server clock steps back
			var d limit.Decision
			for range 10 {
				var err error
				if d, err = s.Take(ctx, checks, 1); err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					break
				}
			}
			if d.Allowed || d.RetryAfter <= 0 {
				t.Fatalf("want a denial with a retry time, got %+v", d)
			}
			// the client waits what it was told (plus 1 ms for the calls'
			// own time), nobody else calls
			s.offset.Add((d.RetryAfter + time.Millisecond).Microseconds())
			again, err := s.Take(ctx, checks, 1)
			if err != nil {
				t.Fatal(err)
			}
			if !again.Allowed {
				t.Errorf("%s: denied with RetryAfter %v; retried %v later and denied again (RetryAfter now %v)",
					alg, d.RetryAfter, d.RetryAfter+time.Millisecond, again.RetryAfter)
			}
		})
	}
}

// After the server clock steps back 500 ms, a sliding window's units
// stamped before the step (500 ms later than the clock now reads) count
// until their time plus a period on the stepped-back clock: the key must
// live until then, 500 ms longer in real time than one period after the
// take. Before, each take set the TTL to one period from the script's now,
// the key vanished with those units still in the window, and the limit
// admitted them a second time.
func TestClockSteppingBackKeepsSlidingWindowKey(t *testing.T) {
	_, c, s := startStore(t)
	const p = time.Second
	r := limit.Rule{Name: "sw", Algorithm: limit.SlidingWindow, Limit: 4, Period: p}
	checks := tenantChecks("stepback-sw-ttl", r)
	ctx := t.Context()
	res, _, stamp, err := s.take(ctx, checks, 3)
	if err != nil || !res[0].Allowed {
		t.Fatalf("take 3: %+v %v", res, err)
	}
	s.offset.Add(-(500 * time.Millisecond).Microseconds()) // the server clock steps back
	if res, _, _, err = s.take(ctx, checks, 1); err != nil || !res[0].Allowed {
		t.Fatalf("take 1 after the step: %+v %v", res, err)
	}
	// the 3 units leave the window when the script's clock (server time
	// plus the offset) reaches stamp+p: on the server's clock, in ms
	// since 1970
	leave := (stamp+p.Microseconds()-s.offset.Load())/1000 + 1577836800000
	if exp := pexpiretime(t, c, checks[0].Key); exp < leave {
		t.Errorf("key expires %d ms before the 3 units taken before the step leave the window", leave-exp)
	}
}
