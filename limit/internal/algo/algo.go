// Package algo is the reference implementation of the six rate-limit
// algorithms on an explicit state. The memory store runs it directly; the
// Redis store's Lua script is a line-by-line port of it, and the conformance
// suite holds both to the same decisions.
//
// All times are integer microseconds on the store's clock; all arithmetic is
// on integers that stay below 2^53 for rules that pass limit.Rule.Validate.
package algo

import (
	"sort"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// State is one counter. Which fields matter depends on the algorithm:
//
//	fixed_window            A = window start, B = units in the window
//	sliding_window_counter  A = window start, B = units in it, C = units in the previous window
//	token_bucket            A = tokens scaled by Period (tokens*P), B = time of A
//	gcra                    A = theoretical arrival time (TAT)
//	sliding_window          Log = one timestamp per unit, ascending
//	concurrency             Leases = lease id -> expiry
//
// The zero State (Used == false) is a fresh counter at full capacity.
type State struct {
	Used    bool
	A, B, C int64
	Log     []int64
	Leases  map[string]int64
	// ExpiresAt is when the counter is back to its fresh state and may be
	// dropped (the Redis store turns it into the key's TTL).
	ExpiresAt int64
}

// Assign sets *s to v, which must hold no Log and no Leases: it is *s = v,
// except that pointers of s already nil are not cleared again. Clearing
// them costs write barriers while the garbage collector runs, and the
// counter of a hot key is written on every call.
func (s *State) Assign(v State) {
	if s.Log != nil || s.Leases != nil {
		*s = v
		return
	}
	s.Used, s.A, s.B, s.C, s.ExpiresAt = v.Used, v.A, v.B, v.C, v.ExpiresAt
}

func us(d time.Duration) int64 { return d.Microseconds() }

func dur(us int64) time.Duration {
	if us < 0 {
		return limit.Never
	}
	return time.Duration(us) * time.Microsecond
}

// ceilDiv is ceil(a/b) for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// refillTime is the time a token bucket of r takes to refill from empty,
// ceilDiv(full, r.Limit) with full = r.Capacity()*p: exactly p when the
// capacity is the limit (the usual rule without a Burst), which spares the
// hot path a 64-bit division.
func refillTime(r limit.Rule, full, p int64) int64 {
	if full == r.Limit*p {
		return p
	}
	return ceilDiv(full, r.Limit)
}

// Interval is GCRA's emission interval: Period/Limit rounded up, so the
// enforced rate never exceeds the configured one.
func Interval(r limit.Rule) int64 { return ceilDiv(us(r.Period), r.Limit) }

// Eval evaluates one check at now for cost. With commit it also charges s
// (only when the result allows); without, s is left untouched. r must pass
// limit.Rule.Validate and cost must be at least 1.
// lease is the id under which a concurrency slot is taken.
//
// A commit updates the Log and Leases of s in place (copying them on every
// call would cost each call the size of the counter: a hot concurrency rule
// holds a lease per call in progress), so a copy of a State shares them:
// clone them to keep a State taken earlier (as Refund and Release, which
// also write in place, already required).
func Eval(r limit.Rule, s *State, now, cost int64, lease string, commit bool) limit.Result {
	p := us(r.Period)
	capacity := r.Capacity()
	// A cost above capacity is denied by every branch below; its retry time
	// is Never rather than computed (the formulas assume cost <= capacity).
	never := cost > capacity && r.Algorithm != limit.Concurrency
	if never {
		// Any such cost is denied alike. The cost may come from outside (a
		// tool's reported usage): clamping it keeps n+cost, cost*p and
		// tat+cost*t from overflowing into a negative that would admit it.
		cost = capacity + 1
	}
	var res limit.Result
	switch r.Algorithm {
	case limit.FixedWindow:
		res = fixedWindow(r, s, now, p, cost, commit)
	case limit.SlidingWindowCounter:
		res = slidingWindowCounter(r, s, now, p, cost, never, commit)
	case limit.TokenBucket:
		res = tokenBucket(r, s, now, p, capacity, cost, commit)
	case limit.GCRA:
		res = gcra(r, s, now, capacity, cost, commit)
	case limit.SlidingWindow:
		res = slidingWindow(r, s, now, p, cost, never, commit)
	case limit.Concurrency:
		res = concurrency(r, s, now, p, lease, commit)
	}
	if never {
		res.RetryAfter = limit.Never
	}
	// a rule lowered by a config reload can leave a counter above its limit
	res.Remaining = max(0, res.Remaining)
	return res
}

// fixedWindow is Eval for limit.FixedWindow: units counted per window of
// one period, windows aligned to the epoch.
func fixedWindow(r limit.Rule, s *State, now, p, cost int64, commit bool) (res limit.Result) {
	gap := int64(0)
	if s.Used && s.A > now {
		// the clock went back: the counter's time does not, and the
		// waits below, counted from it, are gap longer on the clock
		gap, now = s.A-now, s.A
	}
	ws := now - now%p
	n := int64(0)
	if s.Used && s.A == ws {
		n = s.B
	}
	res.Allowed = n+cost <= r.Limit
	if res.Allowed {
		n += cost
		if commit {
			s.Assign(State{Used: true, A: ws, B: n, ExpiresAt: ws + p})
		}
	}
	res.Remaining = r.Limit - n
	res.ResetAfter = dur(ws + p - now + gap)
	if !res.Allowed {
		res.RetryAfter = dur(ws + p - now + gap)
	}
	return res
}

// slidingWindowCounter is Eval for limit.SlidingWindowCounter: the
// previous window weighted by the part of it still inside the period.
func slidingWindowCounter(r limit.Rule, s *State, now, p, cost int64, never, commit bool) (res limit.Result) {
	gap := int64(0)
	if s.Used && s.A > now {
		gap, now = s.A-now, s.A // the clock went back: see fixedWindow
	}
	ws := now - now%p
	cur, prev := int64(0), int64(0)
	if s.Used && s.A == ws {
		cur, prev = s.B, s.C
	} else if s.Used && s.A == ws-p {
		prev = s.B
	}
	e := now - ws
	// admitted iff prev*(P-e)/P + cur + cost <= L, in integers
	res.Allowed = prev*(p-e)+(cur+cost)*p <= r.Limit*p
	if res.Allowed {
		cur += cost
		if commit {
			s.Assign(State{Used: true, A: ws, B: cur, C: prev, ExpiresAt: ws + 2*p})
		}
	}
	res.Remaining = max(0, r.Limit-cur-ceilDiv(prev*(p-e), p))
	switch {
	case cur > 0:
		res.ResetAfter = dur(ws + 2*p - now + gap)
	case prev > 0:
		res.ResetAfter = dur(ws + p - now + gap)
	}
	if !res.Allowed && !never {
		if cur+cost > r.Limit {
			// wait for the next window, where cur becomes the weighted prev
			res.RetryAfter = dur(ws + p + p - (r.Limit-cost)*p/cur - now + gap)
		} else {
			res.RetryAfter = dur(ws + p - (r.Limit-cur-cost)*p/prev - now + gap)
		}
	}
	return res
}

// tokenBucket is Eval for limit.TokenBucket: tokens scaled by the period
// (token-microseconds), so refills stay integers.
func tokenBucket(r limit.Rule, s *State, now, p, capacity, cost int64, commit bool) (res limit.Result) {
	gap := int64(0)
	if s.Used && s.B > now {
		gap, now = s.B-now, s.B // the clock went back: see fixedWindow
	}
	full := capacity * p
	tokens := full
	if s.Used {
		elapsed := min(now-s.B, refillTime(r, full, p))
		tokens = min(full, s.A+max(0, elapsed)*r.Limit)
	}
	res.Allowed = tokens >= cost*p
	if res.Allowed {
		tokens -= cost * p
	}
	refill := ceilDiv(full-tokens, r.Limit)
	if res.Allowed && commit {
		s.Assign(State{Used: true, A: tokens, B: now, ExpiresAt: now + refill})
	}
	res.Remaining = tokens / p
	if refill > 0 {
		// a full bucket has nothing to wait for, gap or not
		res.ResetAfter = dur(refill + gap)
	}
	if !res.Allowed {
		res.RetryAfter = dur(ceilDiv(cost*p-tokens, r.Limit) + gap)
	}
	return res
}

// gcra is Eval for limit.GCRA: the theoretical arrival time of the next
// unit.
func gcra(r limit.Rule, s *State, now, capacity, cost int64, commit bool) (res limit.Result) {
	t := Interval(r)
	tau := t * capacity
	tat := now
	if s.Used && s.A > now {
		tat = s.A
	}
	next := tat + cost*t
	res.Allowed = next-now <= tau
	if res.Allowed {
		tat = next
		if commit {
			s.Assign(State{Used: true, A: tat, ExpiresAt: tat})
		}
	}
	res.Remaining = (tau - (tat - now)) / t
	res.ResetAfter = dur(tat - now)
	if !res.Allowed {
		res.RetryAfter = dur(next - tau - now)
	}
	return res
}

// slidingWindow is Eval for limit.SlidingWindow: one log entry per
// admitted unit (exact).
func slidingWindow(r limit.Rule, s *State, now, p, cost int64, never, commit bool) (res limit.Result) {
	log := s.Log
	if !s.Used {
		log = nil
	}
	// units older than a Period no longer count
	i := sort.Search(len(log), func(i int) bool { return log[i] > now-p })
	log = log[i:]
	n := int64(len(log))
	res.Allowed = n+cost <= r.Limit
	if res.Allowed {
		// After the clock stepped back, units logged later than now count
		// until their own time plus a period: the counter is full again,
		// and lives, until the newest of them leaves, or the memory store's
		// sweep and the Redis key's TTL would forget them while they are in
		// the window.
		newest := now
		if n > 0 {
			newest = max(newest, log[n-1])
		}
		if commit {
			// Appended in place after the live units: the expired ones
			// before them stay in the array until append outgrows it,
			// which then copies the live units alone (amortised O(cost)).
			// After the clock stepped back (a Redis failover; the memory
			// store's clock never does), the units go in at their time,
			// before later ones, keeping the log sorted as Redis's is.
			at := len(log)
			if at > 0 && log[at-1] > now {
				at = sort.Search(len(log), func(i int) bool { return log[i] > now })
			}
			for range cost {
				log = append(log, now)
			}
			if at < len(log)-int(cost) {
				copy(log[at+int(cost):], log[at:len(log)-int(cost)])
				for j := at; j < at+int(cost); j++ {
					log[j] = now
				}
			}
			s.Used, s.A, s.B, s.C, s.Log, s.Leases, s.ExpiresAt = true, 0, 0, 0, log, nil, newest+p
		}
		n += cost
		res.ResetAfter = dur(newest + p - now)
	} else if n > 0 {
		res.ResetAfter = dur(log[n-1] + p - now)
	}
	res.Remaining = r.Limit - n
	if !res.Allowed && !never {
		// the oldest n+cost-L units must leave the window
		res.RetryAfter = dur(log[n+cost-r.Limit-1] + p - now)
	}
	return res
}

// concurrency is Eval for limit.Concurrency: one lease per call in
// progress, expiring after the period.
func concurrency(r limit.Rule, s *State, now, p int64, lease string, commit bool) (res limit.Result) {
	var n int64
	earliest, latest := int64(-1), int64(-1)
	if s.Used {
		for _, exp := range s.Leases {
			if exp <= now {
				continue
			}
			n++
			if earliest < 0 || exp < earliest {
				earliest = exp
			}
			latest = max(latest, exp)
		}
	}
	res.Allowed = n+1 <= r.Limit
	if res.Allowed {
		latest = max(latest, now+p)
		if commit {
			leases := s.Leases
			switch {
			case !s.Used || leases == nil:
				leases = make(map[string]int64, 1)
			case int64(len(leases)) > n:
				// expired leases (calls that never released theirs) go
				// now, or they would pile up under a key kept busy
				for id, exp := range leases {
					if exp <= now {
						delete(leases, id)
					}
				}
			}
			leases[lease] = now + p
			s.Used, s.A, s.B, s.C, s.Log, s.Leases, s.ExpiresAt = true, 0, 0, 0, nil, leases, latest
		}
		n++
	}
	res.Remaining = r.Limit - n
	// all slots are free again when the last live lease expires (a
	// denial implies n >= Limit >= 1, so latest is set)
	res.ResetAfter = dur(latest - now)
	if !res.Allowed {
		res.RetryAfter = min(dur(earliest-now), limit.ConcurrencyRetryHint)
	}
	return res
}

// Refund gives back cost units (and the slot of lease) to s at now, for a
// request whose take time is unknown: RefundAt with at = -1.
func Refund(r limit.Rule, s *State, now, cost int64, lease string) {
	RefundAt(r, s, now, -1, cost, lease)
}

// RefundAt gives back cost units (and the slot of lease) to s at now, for
// the request taken at at (the clock of its take; negative: unknown).
//
// With at known, the units given back are the ones that take charged,
// whatever was taken on the counter since: a sliding window removes units
// logged at exactly at (units of one time are interchangeable), not the
// newest; a windowed count gives back from the window at fell in: the
// current window's count, or the previous window's when the refund lands
// in the window after the take's, and nothing when the take's window no
// longer counts (or is not the current one, for a fixed window). With at
// unknown, the take is taken to be the counter's latest: the newest units
// of a sliding window, the current window's count.
//
// A refund that leaves a window empty, a bucket full or a TAT not ahead of
// now drops the counter (Used false), as the Redis store deletes the key
// (idle counters cost nothing): a counter fresh at now is one whose time no
// longer matters, as when it expires. A bucket full at its own time, ahead
// of now after the clock went back, is kept until then instead: dropped,
// it would refill the interval the clock went back a second time.
func RefundAt(r limit.Rule, s *State, now, at, cost int64, lease string) {
	if !s.Used {
		return
	}
	p := us(r.Period)
	// No admitted request was charged more than capacity; the clamp keeps
	// cost*p and cost*Interval from overflowing.
	cost = min(cost, r.Capacity())
	ws := now - now%p
	// tw is the start of the take's window
	tw := ws
	if at >= 0 {
		tw = at - at%p
	}
	switch r.Algorithm {
	case limit.FixedWindow:
		if tw == ws && s.A == ws {
			s.B = max(0, s.B-cost)
			if s.B == 0 {
				s.Assign(State{}) // the window is empty
			}
		}
	case limit.SlidingWindowCounter:
		switch {
		case s.A == tw && (tw == ws || tw == ws-p):
			// the take's window is the counter's own: its count
			s.B = max(0, s.B-cost)
		case s.A == ws && tw == ws-p:
			// the counter moved on to the next window: the previous count
			s.C = max(0, s.C-cost)
		default:
			return
		}
		if s.B == 0 && s.C == 0 {
			s.Assign(State{}) // both windows are empty
		}
	case limit.TokenBucket:
		at := max(now, s.B) // the clock went back: the counter's time does not
		full := r.Capacity() * p
		elapsed := min(at-s.B, refillTime(r, full, p))
		tokens := min(full, s.A+max(0, elapsed)*r.Limit+cost*p)
		if tokens == full && at == now {
			s.Assign(State{}) // full at now
			return
		}
		s.A, s.B = tokens, at
		s.ExpiresAt = at + ceilDiv(full-tokens, r.Limit)
	case limit.GCRA:
		s.A = max(now, s.A-cost*Interval(r))
		s.ExpiresAt = s.A
		if s.A == now {
			s.Assign(State{}) // the TAT is not ahead of now
		}
	case limit.SlidingWindow:
		// units [lo, hi) are removed: the newest ones, or the newest of
		// the ones logged at at
		hi := len(s.Log)
		lo := 0
		if at >= 0 {
			hi = sort.Search(len(s.Log), func(i int) bool { return s.Log[i] > at })
			lo = sort.Search(len(s.Log), func(i int) bool { return s.Log[i] >= at })
		}
		lo = max(lo, hi-int(cost))
		s.Log = append(s.Log[:lo], s.Log[hi:]...)
	case limit.Concurrency:
		delete(s.Leases, lease)
	}
}

// Renew makes the concurrency slot held under lease last at least a full
// period from now (it never shortens a lease) and reports whether it was
// still held at now. Other algorithms: true.
func Renew(r limit.Rule, s *State, now int64, lease string) bool {
	if r.Algorithm != limit.Concurrency {
		return true
	}
	exp, ok := s.Leases[lease]
	if !s.Used || !ok || exp <= now {
		return false
	}
	s.Leases[lease] = max(exp, now+us(r.Period))
	s.ExpiresAt = max(s.ExpiresAt, now+us(r.Period))
	return true
}

// Release frees the concurrency slot held under lease.
func Release(r limit.Rule, s *State, lease string) {
	if r.Algorithm == limit.Concurrency && s.Used {
		delete(s.Leases, lease)
	}
}
