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
