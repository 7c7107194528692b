package limit

import (
	"context"
	"time"
)

// BreakerSpec identifies one loop breaker (an agent identity: a subject, a
// tenant or a session) and its thresholds. A breaker stops an agent stuck in
// a loop: it opens on whichever comes first of ConsecutiveDenials denials in
// a row, ConsecutiveFailures failed results in a row, or IdenticalCount
// admitted calls with the same fingerprint (tool + canonical arguments)
// within IdenticalWithin. While open every call of the breaker is denied;
// after the cooldown one probe call goes through (half-open): its success
// closes the breaker, its failure reopens it with the cooldown doubled, up
// to MaxCooldown. A zero threshold disables that trigger.
type BreakerSpec struct {
	// Key names the breaker's state (keyspace.Breaker); with the Redis store
	// it shares the hash tag of the batch it is evaluated with.
	Key string
	// Tenant, Subject and ID are stored with the state, for listing.
	Tenant, Subject, ID string

	ConsecutiveDenials  int64
	ConsecutiveFailures int64
	// IdenticalKey counts the calls with this call's fingerprint
	// (keyspace.BreakerCall); "" disables the identical-calls trigger.
	IdenticalKey    string
	IdenticalCount  int64
	IdenticalWithin time.Duration

	Cooldown, MaxCooldown time.Duration
	// ProbeLease is how long a half-open probe holds the breaker: if its
	// outcome is never reported (the gateway died), another probe may go.
	ProbeLease time.Duration
}

// Breaker reasons.
const (
	ReasonDenials     = "consecutive_denials"
	ReasonFailures    = "consecutive_failures"
	ReasonIdentical   = "identical_calls"
	ReasonProbeFailed = "probe_failed"
)

// BreakerState is a breaker as one operation saw or left it.
type BreakerState struct {
	// Open: the breaker is open (or half-open with a probe in flight) and
	// denied this call; RetryAfter is the time left before a probe may go.
	Open       bool
	RetryAfter time.Duration
	// HalfOpen: Open because the breaker is half-open and another call's
	// probe is in flight. RetryAfter is then the rest of that probe's lease,
	// an upper bound: the probe's outcome (which closes or reopens the
	// breaker) usually comes within a second, so a caller should retry
	// sooner than RetryAfter says.
	HalfOpen bool
	// Opened: this operation opened (or reopened) the breaker: alert.
	Opened bool
	// Probe: this call is the half-open probe; report its outcome with
	// probe = true.
	Probe  bool
	Reason string
	// The counters after the operation.
	Denials, Failures, Identical int64
	// Cooldown is the current cooldown (doubled by each failed probe).
	Cooldown time.Duration
}

// BreakerInfo is an open or half-open breaker, as listed.
type BreakerInfo struct {
	Key, Tenant, Subject, ID, Reason string
	HalfOpen                         bool
	// Until is when the open state ends (a probe may go).
	Until                        time.Time
	Cooldown                     time.Duration
	Denials, Failures, Identical int64
}

// Request is everything one call asks of a store in one atomic step.
type Request struct {
	// Checks are the tenant-scoped rules: with the Redis store on a
	// Cluster, their keys share the tenant's hash tag (one slot) with the
	// Meter and the Breaker.
	Checks []Check
	// Global are rules counted outside the tenant's slot (keyspace's
	// PerGlobal keys), decided with everything else all-or-nothing: if a
	// global rule denies, nothing of the request is charged, and if anything
	// else denies, no global counter is. Empty: none. Their keys must differ
	// from every other key of the request. See GuardedStore.Evaluate.
	Global  []Check
	Meter   *Meter       // nil: no usage meter
	Breaker *BreakerSpec // nil: no loop breaker
	Cost    int64
}

// Outcome is the answer to a Request.
type Outcome struct {
	// Decision is the whole request's: Allowed only when the breaker, every
	// enforced check (tenant and global), and the meter admitted it. Its
	// Rule, Limit, Remaining, ResetAfter and RetryAfter are Combine's over
	// the tenant checks followed by the global checks: when denied by a
	// rule, the enforced denying rule with the longest RetryAfter (Never
	// longest; on a tie the tenant rule, the more specific); when admitted,
	// the enforced rule with the least Remaining (on a tie the tenant
	// rule). When only the quota denied, or the breaker's gate did, Rule is
	// the zero Rule (see CombineMetered, GuardedStore.Evaluate). Results
	// has one entry per tenant check (Request.Checks), in order; Lease names
	// the concurrency slots taken by the request, tenant and global alike
	// (pass the same lease to Release with either set of checks).
	Decision Decision
	// Global is the global checks' own decision (Combine over
	// Request.Global): Results has one entry per global check, and Allowed
	// says whether the global rules alone would admit the request (even when
	// something else denied it, so nothing was charged). Zero when
	// Request.Global is empty.
	Global Decision
	// GlobalDecides: Decision's rule and numbers are a global check's
	// (scope global); false when a tenant check, the quota or the breaker
	// decided.
	GlobalDecides bool
	Meter         MeterResult
	Breaker       BreakerState
}

// GuardedStore is a MeteredStore that also keeps loop breakers, evaluated in
// the same atomic step as the checks and the meter, so that watching for
// loops costs no extra round trip, and renews concurrency leases (the
// slots of long-lived MCP sessions). Both stores of this module implement
// it.
type GuardedStore interface {
	MeteredStore
	Renewer
	// Evaluate is TakeMetered (or Take, without a meter) with an optional
	// breaker and optional global rules. An open breaker denies without
	// charging anything (Outcome.Breaker.Open; Decision.Allowed false with a
	// zero Rule). A denial by the checks (tenant or global) or the quota
	// counts toward ConsecutiveDenials; an admission resets that count and
	// counts the call's fingerprint (the admitted call that reaches
	// IdenticalCount opens the breaker for the calls after it).
	//
	// With Request.Global the global checks are decided with the rest,
	// all-or-nothing: if anything denies, no counter (tenant or global),
	// no meter and no concurrency slot is charged. A store decides them in
	// one atomic step where it can (the memory store always; the Redis
	// store on a standalone server, or on a Cluster when every key shares
	// one slot); otherwise (a Redis Cluster, the global keys in their own
	// slot) it sends the two halves together and gives back the half that
	// admitted when the other denied, so a concurrent caller may briefly
	// see that half charged (see the store's documentation).
	Evaluate(ctx context.Context, req Request) (Outcome, error)
	// ReportOutcome records the result of an admitted call: a failure counts
	// toward ConsecutiveFailures (or reopens a half-open breaker, when probe),
	// a success resets them (and closes a half-open breaker, when probe).
	ReportOutcome(ctx context.Context, b BreakerSpec, failed, probe bool) (BreakerState, error)
	// AddDenials counts n denials answered without the store (the local
	// denial cache) toward ConsecutiveDenials.
	AddDenials(ctx context.Context, b BreakerSpec, n int64) (BreakerState, error)
	// ReleaseProbe frees the lease of the probe in flight of a half-open
	// breaker (its lease ends now), so that the next call becomes the
	// probe; on any other breaker it does nothing. Call it when the call
	// Evaluate made the probe (Outcome.Breaker.Probe) will report no
	// outcome: a later stage denied it, or its client went away before a
	// result. Without it the breaker denies every call until the lease
	// runs out.
	ReleaseProbe(ctx context.Context, b BreakerSpec) error
	// ListBreakers calls fn for every open or half-open breaker.
	ListBreakers(ctx context.Context, fn func(BreakerInfo) error) error
	// ResetBreaker closes a breaker and clears its counters; false when the
	// store held no such breaker.
	ResetBreaker(ctx context.Context, key string) (bool, error)
}
