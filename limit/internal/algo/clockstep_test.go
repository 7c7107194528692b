package algo

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// After the store's clock steps back 300 ms, the windows and the bucket
// decide on the counter's (later) time, but RetryAfter and ResetAfter are
// waits on the store's clock: they count the gap. Evaluated at now plus
// RetryAfter the same request is admitted, a microsecond earlier it is not;
// at now plus ResetAfter the counter is at full capacity, a microsecond
// earlier it is not, for the first admission after the step as for the
// denial. Before, both came early by the size of the step; a sliding
// window's admission said one period, though the unit taken before the
// step stays in the window 300 ms past it.
func TestWaitsCountClockStepBack(t *testing.T) {
	for _, r := range []limit.Rule{
		rule(limit.SlidingWindow, 5, time.Second, 0),
		rule(limit.FixedWindow, 5, time.Second, 0),
		rule(limit.SlidingWindowCounter, 5, time.Second, 0),
		rule(limit.TokenBucket, 5, time.Second, 0),
		rule(limit.TokenBucket, 3, time.Second, 7),
		rule(limit.GCRA, 5, time.Second, 0),
	} {
		t.Run(string(r.Algorithm), func(t *testing.T) {
			var s State
			now := t0 + ms
			Eval(r, &s, now, 1, "", true)
			now -= 300 * ms          // the clock steps back
			full := r.Capacity() - 1 // Remaining after a take of 1 from a full counter
			checkReset := func(what string, res limit.Result) {
				t.Helper()
				reset := now + us(res.ResetAfter)
				if got := Eval(r, &s, reset-1, 1, "", false); got.Remaining == full {
					t.Errorf("%s: full 1µs before ResetAfter %v: %+v", what, res.ResetAfter, got)
				}
				if got := Eval(r, &s, reset, 1, "", false); got.Remaining != full {
					t.Errorf("%s: ResetAfter %v; that much later %d remain after a take of 1, want %d",
						what, res.ResetAfter, got.Remaining, full)
				}
			}
			if res := Eval(r, &s, now, 1, "", true); !res.Allowed {
				t.Fatalf("want an admission after the step, got %+v", res)
			} else {
				checkReset("admission", res)
			}
			var res limit.Result
			for range 20 {
				if res = Eval(r, &s, now, 1, "", true); !res.Allowed {
					break
				}
			}
			if res.Allowed || res.RetryAfter <= 0 || res.RetryAfter == limit.Never {
				t.Fatalf("want a denial with a retry time, got %+v", res)
			}
			retry := now + us(res.RetryAfter)
			if got := Eval(r, &s, retry-1, 1, "", false); got.Allowed {
				t.Errorf("admitted 1µs before RetryAfter %v: %+v", res.RetryAfter, got)
			}
			if got := Eval(r, &s, retry, 1, "", false); !got.Allowed {
				t.Errorf("denied with RetryAfter %v; retried that much later and denied again (RetryAfter now %v)",
					res.RetryAfter, got.RetryAfter)
			}
			checkReset("denial", res)
		})
	}
}

// After the clock steps back 300 ms, a sliding window logs the new unit
// before the 3 stamped earlier on the clock (later in time), which count
// until their own time plus a period. The counter must not be dropped (the
// memory store's sweep, the Redis key's TTL) before they leave: at
// ExpiresAt it is fresh. Before, ExpiresAt was one period after the
// stepped-back now, and the 3 units were forgotten 300 ms early.
func TestSlidingWindowExpiresAfterLaterUnits(t *testing.T) {
	r := rule(limit.SlidingWindow, 4, time.Second, 0)
	var s State
	Eval(r, &s, t0+500*ms, 3, "", true)
	Eval(r, &s, t0+200*ms, 1, "", true) // the clock stepped back 300 ms
	at := s.ExpiresAt
	if got := Eval(r, &s, at, 1, "", false); got.Remaining != r.Capacity()-1 {
		t.Errorf("ExpiresAt %d µs after t0, but then %d remain after a take of 1, want %d (fresh)",
			at-t0, got.Remaining, r.Capacity()-1)
	}
}

// A refund that leaves a counter fresh (an empty window, a full bucket, a
// TAT not ahead of now) drops it, as the Redis store deletes the key: its
// time no longer matters, as it would not once the counter expired. But a
// bucket refilled to full at its own time, ahead of a clock that stepped
// back, keeps that time until the clock catches up, as the Redis key does
// for the gap: dropped, the bucket would refill the stepped-back interval
// a second time. Before, the counters were all kept with their time while
// the Redis store deleted every one, and the two decided differently once
// the clock went back.
func TestRefundToFreshDropsCounter(t *testing.T) {
	for _, r := range []limit.Rule{
		rule(limit.FixedWindow, 5, time.Second, 0),
		rule(limit.SlidingWindowCounter, 5, time.Second, 0),
		rule(limit.TokenBucket, 5, time.Second, 0),
		rule(limit.GCRA, 5, time.Second, 0),
	} {
		t.Run(string(r.Algorithm), func(t *testing.T) {
			var s State
			mustTake(t, r, &s, t0+ms, 2)
			RefundAt(r, &s, t0+2*ms, t0+ms, 2, "")
			if s.Used {
				t.Errorf("fresh again after the refund, kept: %+v", s)
			}
		})
	}
	r := rule(limit.TokenBucket, 5, time.Second, 0)
	var s State
	mustTake(t, r, &s, t0+500*ms, 2)
	RefundAt(r, &s, t0+200*ms, t0+500*ms, 2, "") // the clock stepped back 300 ms
	if !s.Used || s.B != t0+500*ms || s.ExpiresAt != t0+500*ms {
		t.Errorf("bucket full at its own time 300 ms ahead of the clock: want it kept until then, got %+v", s)
	}
	// 5 are left over the 300 ms the clock went back, not 5 plus its refill
	mustTake(t, r, &s, t0+200*ms, 5)
	if res := Eval(r, &s, t0+400*ms, 1, "", false); res.Allowed {
		t.Errorf("the stepped-back interval refilled twice: %+v", res)
	}
}
