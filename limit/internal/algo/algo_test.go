package algo

import (
	"fmt"
	"maps"
	"math"
	"math/big"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// t0 is aligned to every window used below, so offsets read as window times.
const t0 = int64(1_000_000_000_000)

const (
	ms = int64(1000)
	s1 = int64(1_000_000)
)

func rule(a limit.Algorithm, l int64, p time.Duration, burst int64) limit.Rule {
	r := limit.Rule{Name: "r", Algorithm: a, Limit: l, Period: p, Burst: burst}
	if err := r.Validate(); err != nil {
		panic(err)
	}
	return r
}

func d(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

// step is one Eval with commit; at is an offset from t0 in µs.
type step struct {
	at, cost int64
	lease    string
	allowed  bool
	rem      int64
	reset    time.Duration
	retry    time.Duration
}

func TestEvalTables(t *testing.T) {
	never := limit.Never
	tests := []struct {
		name  string
		rule  limit.Rule
		steps []step
	}{
		{"fixed_window", rule(limit.FixedWindow, 3, time.Second, 0), []step{
			{at: 0, cost: 1, allowed: true, rem: 2, reset: time.Second},
			{at: 0, cost: 2, allowed: true, rem: 0, reset: time.Second},
			{at: 100 * ms, cost: 1, rem: 0, reset: d(900 * ms), retry: d(900 * ms)},
			{at: s1 - 1, cost: 1, rem: 0, reset: d(1), retry: d(1)},
			{at: s1, cost: 1, allowed: true, rem: 2, reset: time.Second},
			{at: s1, cost: 4, rem: 2, reset: time.Second, retry: never},
			{at: s1 + 500*ms, cost: 3, rem: 2, reset: d(500 * ms), retry: d(500 * ms)},
			{at: 2 * s1, cost: 3, allowed: true, rem: 0, reset: time.Second},
		}},
		{"sliding_window", rule(limit.SlidingWindow, 3, time.Second, 0), []step{
			{at: 0, cost: 1, allowed: true, rem: 2, reset: time.Second},
			{at: 200 * ms, cost: 1, allowed: true, rem: 1, reset: time.Second},
			{at: 400 * ms, cost: 1, allowed: true, rem: 0, reset: time.Second},
			// the unit logged at 0 leaves at 1s, the one at 200ms at 1.2s
			{at: 500 * ms, cost: 1, rem: 0, reset: d(900 * ms), retry: d(500 * ms)},
			{at: 500 * ms, cost: 2, rem: 0, reset: d(900 * ms), retry: d(700 * ms)},
			{at: s1 - 1, cost: 1, rem: 0, reset: d(400*ms + 1), retry: d(1)},
			{at: s1, cost: 1, allowed: true, rem: 0, reset: time.Second},
			{at: s1, cost: 4, rem: 0, reset: time.Second, retry: never},
			{at: s1 + 200*ms, cost: 1, allowed: true, rem: 0, reset: time.Second},
			{at: 3 * s1, cost: 3, allowed: true, rem: 0, reset: time.Second},
		}},
		{"sliding_window_counter", rule(limit.SlidingWindowCounter, 10, time.Second, 0), []step{
			{at: 0, cost: 6, allowed: true, rem: 4, reset: 2 * time.Second},
			// 6+5 > 10 in this window: wait until 6*(1-e)+5 <= 10 in the next,
			// e >= 1/6 of it: 2s - floor(5e6/6)µs - 0.5s
			{at: 500 * ms, cost: 5, rem: 4, reset: d(1500 * ms), retry: d(666_667)},
			{at: 500 * ms, cost: 4, allowed: true, rem: 0, reset: d(1500 * ms)},
			// next window, half way: 10*0.5 + 1 <= 10
			{at: 1500 * ms, cost: 1, allowed: true, rem: 4, reset: d(1500 * ms)},
			// 10*(1-e) + 1 + 5 <= 10 from e = 0.6
			{at: 1500 * ms, cost: 5, rem: 4, reset: d(1500 * ms), retry: d(100 * ms)},
			{at: 1500 * ms, cost: 11, rem: 4, reset: d(1500 * ms), retry: never},
			{at: 1600 * ms, cost: 5, allowed: true, rem: 0, reset: d(1400 * ms)},
			{at: 4 * s1, cost: 10, allowed: true, rem: 0, reset: 2 * time.Second},
		}},
		{"token_bucket", rule(limit.TokenBucket, 10, time.Second, 5), []step{
			// one token per 100ms, 5 at most
			{at: 0, cost: 5, allowed: true, rem: 0, reset: d(500 * ms)},
			{at: 0, cost: 1, rem: 0, reset: d(500 * ms), retry: d(100 * ms)},
			{at: 50 * ms, cost: 1, rem: 0, reset: d(450 * ms), retry: d(50 * ms)},
			{at: 100 * ms, cost: 1, allowed: true, rem: 0, reset: d(500 * ms)},
			{at: 350 * ms, cost: 3, rem: 2, reset: d(250 * ms), retry: d(50 * ms)},
			{at: 350 * ms, cost: 6, rem: 2, reset: d(250 * ms), retry: never},
			{at: 400 * ms, cost: 3, allowed: true, rem: 0, reset: d(500 * ms)},
			{at: 10 * s1, cost: 1, allowed: true, rem: 4, reset: d(100 * ms)},
		}},
		{"token_bucket_rounding", rule(limit.TokenBucket, 3, time.Second, 1), []step{
			{at: 0, cost: 1, allowed: true, rem: 0, reset: d(333_334)},
			{at: 0, cost: 1, rem: 0, reset: d(333_334), retry: d(333_334)},
			{at: 333_333, cost: 1, rem: 0, reset: d(1), retry: d(1)},
			{at: 333_334, cost: 1, allowed: true, rem: 0, reset: d(333_334)},
		}},
		{"gcra", rule(limit.GCRA, 10, time.Second, 5), []step{
			// interval 100ms, tolerance 500ms
			{at: 0, cost: 1, allowed: true, rem: 4, reset: d(100 * ms)},
			{at: 0, cost: 4, allowed: true, rem: 0, reset: d(500 * ms)},
			{at: 0, cost: 1, rem: 0, reset: d(500 * ms), retry: d(100 * ms)},
			{at: 100 * ms, cost: 1, allowed: true, rem: 0, reset: d(500 * ms)},
			{at: 100 * ms, cost: 6, rem: 0, reset: d(500 * ms), retry: never},
			{at: 250 * ms, cost: 2, rem: 1, reset: d(350 * ms), retry: d(50 * ms)},
			{at: 300 * ms, cost: 2, allowed: true, rem: 0, reset: d(500 * ms)},
			{at: 10 * s1, cost: 5, allowed: true, rem: 0, reset: d(500 * ms)},
		}},
		{"gcra_rounding", rule(limit.GCRA, 3, time.Second, 0), []step{
			// the interval rounds up to 333334µs, so 3 per second at most
			{at: 0, cost: 3, allowed: true, rem: 0, reset: d(1_000_002)},
			{at: 0, cost: 1, rem: 0, reset: d(1_000_002), retry: d(333_334)},
			{at: 333_333, cost: 1, rem: 0, reset: d(666_669), retry: d(1)},
			{at: 333_334, cost: 1, allowed: true, rem: 0, reset: d(1_000_002)},
		}},
		{"concurrency", rule(limit.Concurrency, 2, 10*time.Second, 0), []step{
			{at: 0, cost: 1, lease: "a", allowed: true, rem: 1, reset: 10 * time.Second},
			// cost does not matter: one call, one slot
			{at: s1, cost: 7, lease: "b", allowed: true, rem: 0, reset: 10 * time.Second},
			{at: 2 * s1, cost: 1, lease: "c", rem: 0, reset: 9 * time.Second, retry: time.Second},
			{at: 9500 * ms, cost: 1, lease: "c", rem: 0, reset: d(1500 * ms), retry: d(500 * ms)},
			// a's lease ran out at 10s
			{at: 10 * s1, cost: 1, lease: "c", allowed: true, rem: 0, reset: 10 * time.Second},
			// b's lease runs out at 11s, c's at 20s
			{at: 11*s1 - 1, cost: 1, lease: "d", rem: 0, reset: d(9*s1 + 1), retry: d(1)},
			{at: 11 * s1, cost: 1, lease: "d", allowed: true, rem: 0, reset: 10 * time.Second},
			{at: 21 * s1, cost: 1, lease: "e", allowed: true, rem: 1, reset: 10 * time.Second},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s State
			for i, st := range tt.steps {
				now := t0 + st.at
				checkInvariants(t, tt.rule, &s, now, st.cost, st.lease)
				got := Eval(tt.rule, &s, now, st.cost, st.lease, true)
				want := limit.Result{Allowed: st.allowed, Remaining: st.rem, ResetAfter: st.reset, RetryAfter: st.retry}
				if got != want {
					t.Fatalf("step %d (t=%dµs cost=%d): got %+v, want %+v", i, st.at, st.cost, got, want)
				}
			}
		})
	}
}

// fresh is a new, unused State.
func fresh() *State { return &State{} }

func clone(s State) State {
	s.Log = slices.Clone(s.Log)
	s.Leases = maps.Clone(s.Leases)
	return s
}

// sameAsFresh reports whether s behaves like a new counter at now.
func sameAsFresh(r limit.Rule, s State, now int64) bool {
	for _, c := range []int64{1, r.Capacity()} {
		if Eval(r, &s, now, c, "x", false) != Eval(r, fresh(), now, c, "x", false) {
			return false
		}
	}
	return true
}

// checkInvariants checks, without changing s, what every result of Eval on
// s at now for cost must satisfy.
func checkInvariants(t *testing.T, r limit.Rule, s *State, now, cost int64, lease string) {
	t.Helper()
	before := clone(*s)
	res := Eval(r, s, now, cost, lease, false)
	if !reflect.DeepEqual(*s, before) {
		t.Fatalf("Eval without commit changed the state: %+v -> %+v", before, *s)
	}
	// A commit (on a clone: it writes the Log and Leases in place) must
	// give the same result, and must not charge a denial.
	cp := clone(*s)
	if got := Eval(r, &cp, now, cost, lease, true); got != res {
		t.Fatalf("commit gave %+v, dry run %+v", got, res)
	}
	if !res.Allowed && !reflect.DeepEqual(cp, before) {
		t.Fatalf("a denial charged the state: %+v -> %+v", before, cp)
	}
	capacity := r.Capacity()
	conc := r.Algorithm == limit.Concurrency
	switch {
	case res.Remaining < 0 || res.Remaining > capacity:
		t.Fatalf("remaining %d outside [0, %d]", res.Remaining, capacity)
	case res.Allowed != (res.RetryAfter == 0):
		t.Fatalf("allowed=%v with retry %v", res.Allowed, res.RetryAfter)
	case !conc && (res.RetryAfter == limit.Never) != (cost > capacity):
		t.Fatalf("retry %v for cost %d, capacity %d", res.RetryAfter, cost, capacity)
	case res.ResetAfter < 0:
		t.Fatalf("negative reset %v", res.ResetAfter)
	}

	// Remaining is exact: the largest cost admitted now (one slot for
	// concurrency), less this request's cost when admitted.
	if conc {
		free := Eval(r, s, now, 1, lease, false)
		if !free.Allowed && res.Allowed {
			t.Fatalf("concurrency admits by cost")
		}
	} else {
		m := int64(0)
		for c := int64(1); c <= capacity+1; c++ {
			ok := Eval(r, s, now, c, lease, false).Allowed
			if ok && m != c-1 {
				t.Fatalf("cost %d admitted but %d was not", c, m+1)
			}
			if ok {
				m = c
			}
		}
		want := m
		if res.Allowed {
			want = m - cost
		}
		if res.Allowed != (cost <= m) || res.Remaining != want {
			t.Fatalf("cost %d: %+v, but the largest cost admitted is %d", cost, res, m)
		}
	}

	// RetryAfter is exact: after it the same request fits, 1µs earlier it
	// does not (concurrency's hint of a second is only an upper bound).
	if !res.Allowed && res.RetryAfter != limit.Never {
		at := now + res.RetryAfter.Microseconds()
		c := clone(*s)
		if Eval(r, &c, at-1, cost, lease, false).Allowed {
			t.Fatalf("admitted 1µs before retry %v", res.RetryAfter)
		}
		if (!conc || res.RetryAfter < limit.ConcurrencyRetryHint) && !Eval(r, &c, at, cost, lease, false).Allowed {
			t.Fatalf("denied after waiting retry %v", res.RetryAfter)
		}
	}

	// After ResetAfter the counter is as new; 1µs earlier it is not, unless
	// it already is (a fixed window's ResetAfter is the window's end).
	after := cp // the state this result describes
	at := now + res.ResetAfter.Microseconds()
	if !sameAsFresh(r, after, at) {
		t.Fatalf("not fresh after reset %v: %+v", res.ResetAfter, after)
	}
	if res.ResetAfter > 0 && !sameAsFresh(r, after, now) && sameAsFresh(r, after, at-1) {
		t.Fatalf("already fresh 1µs before reset %v: %+v", res.ResetAfter, after)
	}
	// A counter expires exactly when its result says it resets.
	if res.Allowed && after.ExpiresAt != at {
		t.Fatalf("ExpiresAt %d, reset at %d", after.ExpiresAt, at)
	}
	if after.Used && !sameAsFresh(r, after, after.ExpiresAt) {
		t.Fatalf("not fresh at ExpiresAt: %+v", after)
	}
}

// testRules covers every algorithm with small capacities, periods that do
// not divide evenly, and bursts above and below the limit.
func testRules() []limit.Rule {
	var rs []limit.Rule
	for _, a := range limit.Algorithms {
		rs = append(rs,
			rule(a, 1, time.Millisecond, 0),
			rule(a, 3, 7*time.Millisecond, 0),
			rule(a, 10, time.Second, 0),
			rule(a, 7, 3*time.Millisecond, 0))
		if a == limit.TokenBucket || a == limit.GCRA {
			rs = append(rs, rule(a, 3, 7*time.Millisecond, 5), rule(a, 10, time.Second, 2))
		}
	}
	return rs
}

// TestEvalRandom drives every rule through random requests, refunds and
// releases, checking the invariants before each request.
func TestEvalRandom(t *testing.T) {
	for _, r := range testRules() {
		t.Run(fmt.Sprintf("%s_%d_%v_%d", r.Algorithm, r.Limit, r.Period, r.Burst), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(r.Limit)))
			p := r.Period.Microseconds()
			var s State
			now := t0 + rng.Int64N(p)
			var leases []string
			for i := range 3000 {
				switch x := rng.IntN(10); {
				case x < 4: // same instant
				case x < 8:
					now += rng.Int64N(p/4 + 1)
				default:
					now += rng.Int64N(2 * p)
				}
				cost := 1 + rng.Int64N(r.Capacity()+1)
				lease := fmt.Sprint("l", i)
				checkInvariants(t, r, &s, now, cost, lease)
				res := Eval(r, &s, now, cost, lease, true)
				if res.Allowed {
					leases = append(leases, lease)
				}
				if res.Allowed && rng.IntN(8) == 0 {
					Refund(r, &s, now, 1+rng.Int64N(cost), lease)
				}
				if len(leases) > 0 && rng.IntN(4) == 0 {
					Release(r, &s, leases[rng.IntN(len(leases))])
				}
			}
		})
	}
}

// model is an independent, straightforward statement of an algorithm:
// admit reports whether cost fits at now and, if so, records it.
type model interface {
	admit(now, cost int64, lease string) bool
}

// logModel keeps every admitted unit: fixed window, sliding window and
// sliding window counter are all sums over it.
type logModel struct {
	r     limit.Rule
	times []int64
}

func (m *logModel) admit(now, cost int64, _ string) bool {
	p := m.r.Period.Microseconds()
	ws := now - now%p
	var cur, prev, last int64
	for _, at := range m.times {
		switch {
		case at >= ws:
			cur++
		case at >= ws-p:
			prev++
		}
		if at > now-p {
			last++
		}
	}
	var ok bool
	switch m.r.Algorithm {
	case limit.FixedWindow:
		ok = cur+cost <= m.r.Limit
	case limit.SlidingWindow:
		ok = last+cost <= m.r.Limit
	case limit.SlidingWindowCounter:
		// prev * (1 - elapsed/P) + cur + cost <= L, in rationals
		w := big.NewRat(prev*(p-(now-ws)), p)
		w.Add(w, big.NewRat(cur+cost, 1))
		ok = w.Cmp(big.NewRat(m.r.Limit, 1)) <= 0
	}
	if ok {
		for range cost {
			m.times = append(m.times, now)
		}
	}
	return ok
}

// bucketModel is a token bucket in rationals. GCRA is the same bucket
// counted in time: capacity Burst*T µs, refilled 1 per µs, a unit costs T.
type bucketModel struct {
	size, rate, unit *big.Rat
	tokens           *big.Rat
	last             int64
}

func newBucket(r limit.Rule) *bucketModel {
	if r.Algorithm == limit.GCRA {
		t := Interval(r)
		size := big.NewRat(t*r.Capacity(), 1)
		return &bucketModel{size: size, rate: big.NewRat(1, 1), unit: big.NewRat(t, 1), tokens: size}
	}
	size := big.NewRat(r.Capacity(), 1)
	return &bucketModel{size: size, rate: big.NewRat(r.Limit, r.Period.Microseconds()), unit: big.NewRat(1, 1), tokens: size}
}

func (m *bucketModel) admit(now, cost int64, _ string) bool {
	refill := new(big.Rat).Mul(m.rate, big.NewRat(now-m.last, 1))
	tokens := new(big.Rat).Add(m.tokens, refill)
	if tokens.Cmp(m.size) > 0 {
		tokens.Set(m.size)
	}
	m.tokens, m.last = tokens, now
	need := new(big.Rat).Mul(m.unit, big.NewRat(cost, 1))
	if tokens.Cmp(need) < 0 {
		return false
	}
	m.tokens = new(big.Rat).Sub(tokens, need)
	return true
}

// leaseModel holds each admitted call's lease until Period has passed.
type leaseModel struct {
	r      limit.Rule
	expiry []int64
}

func (m *leaseModel) admit(now, _ int64, _ string) bool {
	m.expiry = slices.DeleteFunc(m.expiry, func(e int64) bool { return e <= now })
	if int64(len(m.expiry)) >= m.r.Limit {
		return false
	}
	m.expiry = append(m.expiry, now+m.r.Period.Microseconds())
	return true
}

// TestEvalMatchesModel compares every admission decision with a model.
func TestEvalMatchesModel(t *testing.T) {
	for _, r := range testRules() {
		t.Run(fmt.Sprintf("%s_%d_%v_%d", r.Algorithm, r.Limit, r.Period, r.Burst), func(t *testing.T) {
			var m model
			switch r.Algorithm {
			case limit.TokenBucket, limit.GCRA:
				m = newBucket(r)
			case limit.Concurrency:
				m = &leaseModel{r: r}
			default:
				m = &logModel{r: r}
			}
			rng := rand.New(rand.NewPCG(2, uint64(r.Limit)))
			p := r.Period.Microseconds()
			var s State
			now := t0 + rng.Int64N(p)
			if b, ok := m.(*bucketModel); ok {
				b.last = now
			}
			admitted := 0
			for i := range 5000 {
				if rng.IntN(3) > 0 {
					now += rng.Int64N(p/3 + 1)
				}
				cost := 1 + rng.Int64N(r.Capacity())
				lease := fmt.Sprint("l", i)
				got := Eval(r, &s, now, cost, lease, true).Allowed
				if want := m.admit(now, cost, lease); got != want {
					t.Fatalf("request %d at %d cost %d: allowed=%v, model says %v", i, now-t0, cost, got, want)
				}
				if got {
					admitted++
				}
			}
			if admitted == 0 || admitted == 5000 {
				t.Fatalf("%d of 5000 admitted: the sequence tests nothing", admitted)
			}
		})
	}
}

func TestRefund(t *testing.T) {
	for _, r := range testRules() {
		if r.Algorithm == limit.Concurrency {
			continue
		}
		t.Run(fmt.Sprintf("%s_%d_%v_%d", r.Algorithm, r.Limit, r.Period, r.Burst), func(t *testing.T) {
			var s State
			now := t0 + 1
			Eval(r, &s, now, 1, "", true)
			want := Eval(r, &s, now, 1, "", false)
			cost := r.Capacity() - 1
			if cost == 0 {
				// all of it: a refund must bring it back to fresh
				cost, want = 1, Eval(r, fresh(), now, 1, "", false)
				s = State{}
			}
			if !Eval(r, &s, now, cost, "", true).Allowed {
				t.Fatal("not admitted")
			}
			Refund(r, &s, now, cost, "")
			if got := Eval(r, &s, now, 1, "", false); got != want {
				t.Fatalf("after refund %+v, want %+v", got, want)
			}
			// An absurd refund neither overflows nor gives more than capacity.
			Refund(r, &s, now, math.MaxInt64, "")
			if !sameAsFresh(r, s, now) && r.Algorithm != limit.SlidingWindowCounter {
				t.Fatalf("huge refund: not fresh: %+v", s)
			}
			if got := Eval(r, &s, now, r.Capacity(), "", false); !got.Allowed {
				t.Fatalf("huge refund: capacity not available: %+v", got)
			}
			if !sameAsFresh(r, s, s.ExpiresAt) {
				t.Fatalf("not fresh at ExpiresAt after refund: %+v", s)
			}
			// A refund on a fresh counter changes nothing.
			f := State{}
			Refund(r, &f, now, 1, "")
			if !reflect.DeepEqual(f, State{}) {
				t.Fatalf("refund on a fresh counter: %+v", f)
			}
		})
	}
}

func TestRefundOtherWindow(t *testing.T) {
	// Units of a past fixed window no longer count: refunding them is a no-op.
	r := rule(limit.FixedWindow, 2, time.Second, 0)
	var s State
	Eval(r, &s, t0, 2, "", true)
	Refund(r, &s, t0+s1, 2, "")
	if s.B != 2 || s.A != t0 {
		t.Fatalf("refund reached into the past window: %+v", s)
	}
}

func TestConcurrencyLeases(t *testing.T) {
	r := rule(limit.Concurrency, 2, 10*time.Second, 0)
	var s State
	for _, l := range []string{"a", "b"} {
		if !Eval(r, &s, t0, 1, l, true).Allowed {
			t.Fatalf("lease %s denied", l)
		}
	}
	if Eval(r, &s, t0, 1, "c", true).Allowed {
		t.Fatal("third call admitted")
	}
	Release(r, &s, "a")
	Release(r, &s, "a") // twice is harmless
	Release(r, &s, "nope")
	if got := Eval(r, &s, t0, 1, "c", true); !got.Allowed || got.Remaining != 0 {
		t.Fatalf("after release: %+v", got)
	}
	Refund(r, &s, t0, 1, "b") // a refund frees the slot too
	if got := Eval(r, &s, t0+1, 1, "d", false); !got.Allowed || got.Remaining != 0 {
		t.Fatalf("after refund: %+v", got)
	}
	// c holds its slot until its lease runs out, then frees itself.
	Eval(r, &s, t0+1, 1, "d", true)
	if Eval(r, &s, t0+10*s1-1, 1, "e", false).Allowed {
		t.Fatal("admitted before any lease expired")
	}
	if got := Eval(r, &s, t0+10*s1, 1, "e", true); !got.Allowed || got.Remaining != 0 {
		t.Fatalf("expired lease not freed: %+v", got)
	}
	if _, ok := s.Leases["c"]; ok {
		t.Fatal("expired lease kept")
	}
	// Release leaves other algorithms alone.
	fw := rule(limit.FixedWindow, 1, time.Second, 0)
	var f State
	Eval(fw, &f, t0, 1, "x", true)
	Release(fw, &f, "x")
	if Eval(fw, &f, t0, 1, "x", false).Allowed {
		t.Fatal("release freed a fixed window")
	}
}

// TestExtremes runs the largest rules Validate accepts and absurd costs:
// nothing may overflow into an admission.
func TestExtremes(t *testing.T) {
	var rules []limit.Rule
	for _, a := range limit.Algorithms {
		if a == limit.SlidingWindow {
			continue // its log holds one entry per unit: huge limits are not testable
		}
		for _, p := range []time.Duration{limit.MinPeriod, time.Second, limit.MaxPeriod} {
			l := limit.MaxCapacityTimesPeriod / p.Microseconds()
			rules = append(rules, rule(a, l, p, 0))
			if a == limit.TokenBucket || a == limit.GCRA {
				rules = append(rules, rule(a, 1, p, l), rule(a, l, p, 1))
			}
		}
	}
	rules = append(rules, rule(limit.SlidingWindow, 3, limit.MaxPeriod, 0))
	now := int64(20 * 365 * 24 * 3600 * s1) // twenty years past the epoch
	for _, r := range rules {
		var s State
		capacity := r.Capacity()
		steps := []int64{1, capacity - 1, math.MaxInt64, math.MaxInt64 / 2, capacity + 1, capacity}
		for _, cost := range steps {
			if cost < 1 {
				continue
			}
			res := Eval(r, &s, now, cost, "l", true)
			if r.Algorithm != limit.Concurrency && cost > capacity {
				if res.Allowed || res.RetryAfter != limit.Never {
					t.Fatalf("%+v cost %d: %+v", r, cost, res)
				}
			}
			if res.Remaining < 0 || res.ResetAfter < 0 || (res.RetryAfter < 0 && res.RetryAfter != limit.Never) {
				t.Fatalf("%+v cost %d: %+v", r, cost, res)
			}
		}
		// the first two steps filled it exactly
		if r.Algorithm != limit.Concurrency && capacity > 1 && Eval(r, &s, now, 1, "", false).Allowed {
			t.Fatalf("%+v: admitted past capacity", r)
		}
		Refund(r, &s, now, math.MaxInt64, "l")
		if r.Algorithm != limit.Concurrency && r.Algorithm != limit.SlidingWindowCounter &&
			!Eval(r, &s, now, capacity, "", false).Allowed {
			t.Fatalf("%+v: huge refund left %+v", r, s)
		}
	}
}

// Assign is plain assignment for states without Log or Leases, whatever s
// held before; a field added to State must be added to Assign.
func TestAssign(t *testing.T) {
	if n := reflect.TypeFor[State]().NumField(); n != 7 {
		t.Fatalf("State has %d fields: update Assign", n)
	}
	v := State{Used: true, A: 1, B: 2, C: 3, ExpiresAt: 4}
	for _, before := range []State{{}, {Used: true, A: 9, B: 9, C: 9, ExpiresAt: 9}, {Log: []int64{1}}, {Leases: map[string]int64{"x": 1}}} {
		s := before
		s.Assign(v)
		if !reflect.DeepEqual(s, v) {
			t.Errorf("Assign over %+v = %+v, want %+v", before, s, v)
		}
	}
}
