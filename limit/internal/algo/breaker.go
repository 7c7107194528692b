package algo

import (
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// Loop breakers (limit.BreakerSpec). The memory store runs the functions
// below on its state directly; the Redis store keeps the same numbers in a
// hash, and its script (breaker.lua) is a port of them.
//
// A breaker is closed, open or half-open:
//
//   - closed: calls are evaluated. A denial (by the checks or the quota)
//     adds one to Denials, and the Denials-th in a row opens the breaker;
//     an admission sets Denials back to 0 and counts the call's fingerprint,
//     and the admission that brings it to the Identical threshold opens the
//     breaker (the call itself goes through). A failed outcome adds one to
//     Failures, and the Failures-th in a row opens it; a success sets
//     Failures back to 0.
//   - open until Until: every call is denied, nothing else is evaluated or
//     counted. At Until the next call becomes the probe: the breaker is
//     half-open and the probe holds it until ProbeUntil (its lease).
//   - half-open: while the probe's lease runs every other call is denied;
//     once it has run out, the next call becomes the probe. A probe denied
//     by the checks or the quota frees the lease at once. A probe's success
//     closes the breaker (Cooldown back to the spec's, Denials 0); its
//     failure reopens it for twice the cooldown, at most MaxCooldown.
//
// Outcomes reported while the breaker is open or half-open (other than the
// probe's) only update the counters: another instance opened the breaker
// meanwhile, and its state wins.

// Phase is the state of a breaker. The values are the ones the Redis script
// stores.
type Phase int8

// The phases of a breaker.
const (
	Closed   Phase = 0
	Open     Phase = 1
	HalfOpen Phase = 2
)

// Breaker is a breaker's state. The zero Breaker is a closed breaker with no
// counts, the state of a breaker the store does not hold.
type Breaker struct {
	Phase Phase
	// Until is when an open breaker lets a probe go; ProbeUntil is when the
	// lease of a half-open breaker's probe ends.
	Until, ProbeUntil int64
	// Cooldown is the current cooldown of an open or half-open breaker
	// (doubled by each failed probe); 0 when closed.
	Cooldown          int64
	Denials, Failures int64
	// Reason says why an open or half-open breaker opened; "" when closed.
	Reason string
	// Tenant, Subject and ID are the spec's, stored for listing.
	Tenant, Subject, ID string
	// CallKey is the identical-calls counter that opened the breaker, and
	// Calls its count then (cleared by a reset, reported by listings).
	CallKey string
	Calls   int64
	// ExpiresAt is when the state may be dropped (BreakerExpiry).
	ExpiresAt int64
}

// CallCounter counts the admitted calls of one fingerprint in a window that
// starts at the first of them and lasts IdenticalWithin: it is not a
// sliding window, so up to twice the threshold minus 2 identical calls may
// go through across the edge of two windows, never the threshold within
// one.
type CallCounter struct {
	N, ExpiresAt int64
}

// BreakerParams are a limit.BreakerSpec's numbers, durations in µs.
type BreakerParams struct {
	Denials, Failures, Identical                       int64 // thresholds; 0 disables (Identical: no IdenticalKey)
	IdenticalWithin, Cooldown, MaxCooldown, ProbeLease int64
}

// Params returns the numbers of b (which passed limit.ValidateBreaker).
func Params(b limit.BreakerSpec) BreakerParams {
	p := BreakerParams{
		Denials:     b.ConsecutiveDenials,
		Failures:    b.ConsecutiveFailures,
		Cooldown:    us(b.Cooldown),
		MaxCooldown: us(b.MaxCooldown),
		ProbeLease:  us(b.ProbeLease),
	}
	if b.IdenticalKey != "" {
		p.Identical, p.IdenticalWithin = b.IdenticalCount, us(b.IdenticalWithin)
	}
	return p
}

// Verdict is what the checks and the meter made of a call that passed the
// breaker's gate.
type Verdict int8

// The verdicts of BreakerAfter.
const (
	Admitted Verdict = iota
	Denied           // by an enforced check or the quota
	// Unjudged: the meter needs a Seed (or the call failed): neither a
	// denial nor an admission.
	Unjudged
)

// BreakerGate decides whether a call at now may be evaluated. deny: the
// breaker is open, or half-open with a probe in flight; retry is the time
// left (µs) and b is unchanged. Otherwise the call goes on, and probe says
// it is the half-open probe: b is then half-open with the probe's lease
// taken (write it back with the call).
func BreakerGate(b *Breaker, p BreakerParams, now int64) (deny bool, retry int64, probe bool) {
	switch b.Phase {
	case Open:
		if now < b.Until {
			return true, b.Until - now, false
		}
		b.Phase = HalfOpen
	case HalfOpen:
		if now < b.ProbeUntil {
			return true, b.ProbeUntil - now, false
		}
	default:
		return false, 0, false
	}
	b.ProbeUntil = now + p.ProbeLease
	return false, 0, true
}

// BreakerAfter applies the verdict of a call that passed the gate (probe as
// BreakerGate returned) and reports whether it opened the breaker, and
// whether it counted the call in calls, the call's fingerprint counter
// (which it does when a closed breaker with an identical-calls trigger
// admits the call: the caller then stores calls). callKey is the counter's
// key, recorded when it opens the breaker.
func BreakerAfter(b *Breaker, p BreakerParams, now int64, v Verdict, probe bool, calls *CallCounter, callKey string) (opened, counted bool) {
	if probe && v != Admitted {
		b.ProbeUntil = now // the probe did not go: another call may try at once
	}
	if b.Phase != Closed {
		return false, false
	}
	switch v {
	case Denied:
		b.Denials++
		if p.Denials > 0 && b.Denials >= p.Denials {
			breakerOpen(b, p, now, limit.ReasonDenials)
			return true, false
		}
	case Admitted:
		b.Denials = 0
		if p.Identical > 0 {
			if calls.ExpiresAt <= now {
				*calls = CallCounter{ExpiresAt: now + p.IdenticalWithin}
			}
			calls.N++
			if calls.N >= p.Identical {
				breakerOpen(b, p, now, limit.ReasonIdentical)
				b.CallKey, b.Calls = callKey, calls.N
				return true, true
			}
			return false, true
		}
	}
	return false, false
}

// BreakerReport applies the outcome of an admitted call (probe: the call
// was the half-open probe) and reports whether it opened the breaker.
func BreakerReport(b *Breaker, p BreakerParams, now int64, failed, probe bool) (opened bool) {
	if !failed {
		b.Failures = 0
		if probe && b.Phase == HalfOpen {
			*b = Breaker{Tenant: b.Tenant, Subject: b.Subject, ID: b.ID}
		}
		return false
	}
	b.Failures++
	switch {
	case probe && b.Phase == HalfOpen:
		cd := min(max(b.Cooldown, p.Cooldown)*2, p.MaxCooldown)
		b.Phase, b.Cooldown, b.Until, b.ProbeUntil, b.Reason = Open, cd, now+cd, 0, limit.ReasonProbeFailed
		return true
	case b.Phase == Closed && p.Failures > 0 && b.Failures >= p.Failures:
		breakerOpen(b, p, now, limit.ReasonFailures)
		return true
	}
	return false
}

// BreakerAddDenials counts n denials answered without the store and
// reports whether they opened the breaker (only a closed one opens).
func BreakerAddDenials(b *Breaker, p BreakerParams, now, n int64) (opened bool) {
	b.Denials += n
	if b.Phase == Closed && p.Denials > 0 && b.Denials >= p.Denials {
		breakerOpen(b, p, now, limit.ReasonDenials)
		return true
	}
	return false
}

// breakerOpen opens a closed breaker for the spec's cooldown.
func breakerOpen(b *Breaker, p BreakerParams, now int64, reason string) {
	b.Phase, b.Cooldown, b.Until, b.ProbeUntil, b.Reason = Open, p.Cooldown, now+p.Cooldown, 0, reason
	b.CallKey, b.Calls = "", 0
}

// BreakerExpiry is when b may be dropped, or 0 when it holds nothing (a
// closed breaker with no counts: the store deletes it). An open breaker
// lives MaxCooldown past the time a probe may go (and a half-open one past
// its probe's lease), so that a failed probe still finds the cooldown it
// doubles; a closed one with counts lives MaxCooldown past its last change:
// an agent quiet that long starts afresh.
func BreakerExpiry(b *Breaker, p BreakerParams, now int64) int64 {
	switch b.Phase {
	case Open:
		return b.Until + p.MaxCooldown
	case HalfOpen:
		return max(b.Until, b.ProbeUntil) + p.MaxCooldown
	}
	if b.Denials == 0 && b.Failures == 0 {
		return 0
	}
	return now + p.MaxCooldown
}

// BreakerBlocking reports whether b denies a call made at now (open, or
// half-open with a probe in flight) and for how long (µs).
func BreakerBlocking(b *Breaker, now int64) (bool, int64) {
	switch {
	case b.Phase == Open && now < b.Until:
		return true, b.Until - now
	case b.Phase == HalfOpen && now < b.ProbeUntil:
		return true, b.ProbeUntil - now
	}
	return false, 0
}

// BreakerBlocked sets st's Open, RetryAfter and HalfOpen to what b makes of
// a call at now (BreakerBlocking): HalfOpen when a probe in flight is what
// denies it, RetryAfter then being the rest of the probe's lease, an upper
// bound (the probe's outcome usually comes much sooner).
func BreakerBlocked(st *limit.BreakerState, b *Breaker, now int64) {
	blocked, retry := BreakerBlocking(b, now)
	st.Open, st.RetryAfter = blocked, dur(retry)
	st.HalfOpen = blocked && b.Phase == HalfOpen
}

// BreakerReleaseProbe frees the lease of the probe in flight of a
// half-open breaker at now, so that the next call becomes the probe; it
// reports whether there was one. The caller knows its probe neither went
// to the upstream nor will report an outcome (a later stage denied it, its
// client went away). Any other breaker is left as it is.
func BreakerReleaseProbe(b *Breaker, now int64) bool {
	if b.Phase != HalfOpen || now >= b.ProbeUntil {
		return false
	}
	b.ProbeUntil = now
	return true
}

// BreakerView is the limit.BreakerState of b after an operation at now
// that opened it (opened) or not; the caller sets Open and RetryAfter for
// a call the gate denied, Probe, and Identical.
func BreakerView(b *Breaker, p BreakerParams, now int64, opened bool) limit.BreakerState {
	st := limit.BreakerState{
		Opened:    opened,
		Reason:    b.Reason,
		Denials:   b.Denials,
		Failures:  b.Failures,
		Identical: b.Calls,
		Cooldown:  dur(p.Cooldown),
	}
	if b.Phase != Closed {
		st.Cooldown = dur(b.Cooldown)
	}
	if opened {
		st.RetryAfter = dur(b.Until - now)
	}
	return st
}

// BreakerInfo is b (held under key) as a listing reports it; ok is false
// for a closed breaker. toTime converts the store's µs to a time.
func BreakerInfo(key string, b *Breaker, toTime func(int64) time.Time) (limit.BreakerInfo, bool) {
	if b.Phase == Closed {
		return limit.BreakerInfo{}, false
	}
	until := b.Until
	if b.Phase == HalfOpen {
		until = b.ProbeUntil
	}
	return limit.BreakerInfo{
		Key: key, Tenant: b.Tenant, Subject: b.Subject, ID: b.ID, Reason: b.Reason,
		HalfOpen: b.Phase == HalfOpen,
		Until:    toTime(until),
		Cooldown: dur(b.Cooldown),
		Denials:  b.Denials, Failures: b.Failures, Identical: b.Calls,
	}, true
}

// GuardedDecision is the Decision of a limit.Request, as every store
// builds it from the checks' results, the lease (when a concurrency slot
// was taken) and whether the meter admitted the call: limit.CombineMetered
// with a meter, limit.Combine without one, and admitted with empty Results
// when the request has neither checks nor meter (a breaker alone). When
// the breaker's gate denied the call (gated), nothing was evaluated: the
// decision is denied with the zero Rule, and Results holds one zero Result
// per check.
func GuardedDecision(req limit.Request, results []limit.Result, lease string, meterOK, gated bool) limit.Decision {
	switch {
	case gated:
		return limit.Decision{Results: results}
	case req.Meter != nil:
		return limit.CombineMetered(req.Checks, results, lease, meterOK)
	case len(req.Checks) == 0:
		return limit.Decision{Allowed: true, Results: results}
	}
	return limit.Combine(req.Checks, results, lease)
}

// RequestDecisions is limit.CombineRequest, except when the breaker's gate
// denied the call (gated): nothing was evaluated, so the decision is denied
// with the zero Rule and one zero Result per tenant check, and the global
// decision (when the request has global checks) is denied likewise with
// one zero Result per global check. results has one entry per tenant check
// followed by one per global check.
func RequestDecisions(req limit.Request, results []limit.Result, lease string, meterOK, gated bool) (d, g limit.Decision, globalDecides bool) {
	if !gated {
		return limit.CombineRequest(req, results, lease, meterOK)
	}
	n := len(req.Checks)
	d = limit.Decision{Results: results[:n:n]}
	if len(req.Global) > 0 {
		g = limit.Decision{Results: results[n:]}
	}
	return d, g, false
}
