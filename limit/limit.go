// Package limit holds mcpgate's rate-limit engine: the rules, the decisions and
// the Store interface that the in-process store (limit/memstore) and the Redis
// store (limit/redisstore) implement with identical semantics.
//
// A Rule says "at most Limit units per Period" with one of six algorithms. A
// Check applies a Rule to one counter (a key built by package keyspace). A
// Store evaluates a batch of checks for one request atomically: if any
// enforced check denies, nothing is consumed ("all-or-nothing"). Semantics
// shared by every algorithm and store:
//
//   - A request has a cost N >= 1; it is admitted only if all N units fit.
//   - A denied request is never charged.
//   - A cost larger than the rule's capacity (Burst for token_bucket and gcra,
//     Limit otherwise) can never fit: it is denied with RetryAfter == Never.
//   - Time is measured in whole microseconds. The Redis store reads it from the
//     Redis server (TIME), never from the gateway; the memory store reads a
//     monotonic clock.
//   - Every counter expires by itself once it no longer holds information (a
//     missing counter means "full capacity"), so idle keys cost no memory.
//   - A Shadow rule is evaluated and reported but never enforced.
//
// The concurrency algorithm counts calls in flight rather than units: each
// admitted call holds one slot (whatever its cost) until Release, or until
// its lease (the rule's Period) expires because the holder died.
package limit

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Algorithm names a rate-limit algorithm. The string values are the ones used
// in configuration files.
type Algorithm string

// The algorithms every Store implements.
const (
	// FixedWindow counts units in windows of Period aligned to a fixed epoch.
	FixedWindow Algorithm = "fixed_window"
	// SlidingWindow keeps one timestamp per unit over the last Period (exact;
	// memory grows with Limit, not with traffic, since denied units are not logged).
	SlidingWindow Algorithm = "sliding_window"
	// SlidingWindowCounter weights the previous fixed window's count by the part
	// of it still inside the sliding window (two counters, approximate).
	SlidingWindowCounter Algorithm = "sliding_window_counter"
	// TokenBucket holds up to Burst tokens, refilled at Limit per Period.
	TokenBucket Algorithm = "token_bucket"
	// GCRA is the generic cell rate algorithm: a token bucket stored as a single
	// "theoretical arrival time".
	GCRA Algorithm = "gcra"
	// Concurrency admits at most Limit calls in flight; Period is the lease after
	// which a slot held by a dead caller frees itself.
	Concurrency Algorithm = "concurrency"
)

// Algorithms lists every algorithm, in documentation order.
var Algorithms = []Algorithm{FixedWindow, SlidingWindow, SlidingWindowCounter, TokenBucket, GCRA, Concurrency}

// Valid reports whether a is one of the known algorithms.
func (a Algorithm) Valid() bool {
	for _, k := range Algorithms {
		if a == k {
			return true
		}
	}
	return false
}

// Never is the RetryAfter of a request that can never be admitted, because
// its cost exceeds the rule's capacity.
const Never time.Duration = -1

// ConcurrencyRetryHint is the RetryAfter suggested when a concurrency rule
// denies: slots free when calls end, which no store can foresee, so callers
// are told to come back soon (or when the oldest lease expires, if sooner).
const ConcurrencyRetryHint = time.Second

// Bounds of a rule, chosen so that every store computes in exact integers
// (microseconds times units stays below 2^53, the largest integer a Redis
// Lua number holds exactly).
const (
	MaxPeriod = 400 * 24 * time.Hour // a little over a year
	MinPeriod = time.Millisecond
	// MaxCapacityTimesPeriod bounds capacity (Burst or Limit) times Period in
	// microseconds, and Limit times Period in microseconds.
	MaxCapacityTimesPeriod = 1 << 53
	// MaxSlidingWindowLimit bounds the Limit of a SlidingWindow rule, which
	// keeps one entry per unit: larger limits belong to SlidingWindowCounter.
	// A take writes one entry per unit of its cost too: on Redis a cost in
	// the thousands holds the server for milliseconds (10 000 units, about
	// 50 ms), past redisstore.DefaultTimeout, so the caller sees a timeout for
	// a take that may have landed. Large costs belong to the counter too.
	MaxSlidingWindowLimit = 100_000
)

// Rule is one rate limit: at most Limit units per Period.
//
// The zero value is not valid; use Validate. Rules are plain values and safe
// to share between goroutines.
type Rule struct {
	// Name identifies the rule in decisions, headers and logs.
	Name string
	// Algorithm is one of Algorithms.
	Algorithm Algorithm
	// Limit is the number of units per Period (the sustained rate for
	// TokenBucket and GCRA, the number of slots for Concurrency). At least 1.
	Limit int64
	// Period is the window, or the refill period, or the lease (Concurrency).
	Period time.Duration
	// Burst is the capacity of TokenBucket and GCRA; 0 means Limit. Other
	// algorithms ignore it.
	Burst int64
	// Shadow rules are evaluated and reported but never deny a request.
	Shadow bool
}

// Capacity is the largest cost a single request may have under r: Burst for
// TokenBucket and GCRA (Limit when Burst is 0), Limit otherwise.
func (r Rule) Capacity() int64 {
	if (r.Algorithm == TokenBucket || r.Algorithm == GCRA) && r.Burst > 0 {
		return r.Burst
	}
	return r.Limit
}

// ErrInvalidRule means a Rule failed Validate.
var ErrInvalidRule = errors.New("limit: invalid rule")

// ErrStoreRefused means the store answered the call, but with an error of
// its own about the call's keys or commands (a key of the wrong type, a
// permission its user lacks, a script error) or with a reply the store
// cannot read: it is up, and the call cannot be decided. Unlike a store
// that does not answer (or answers that it cannot serve now: out of
// memory, loading, a cluster failover), this is not the store's health,
// and no failure policy that admits the call applies.
var ErrStoreRefused = errors.New("limit: the store refused the call")

// Validate reports whether r can be evaluated exactly by every store. Errors
// wrap ErrInvalidRule.
func (r Rule) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %q: %s", ErrInvalidRule, r.Name, fmt.Sprintf(format, args...))
	}
	switch {
	case r.Name == "":
		return bad("name is empty")
	case !r.Algorithm.Valid():
		return bad("unknown algorithm %q", r.Algorithm)
	case r.Limit < 1:
		return bad("limit must be at least 1, got %d", r.Limit)
	case r.Burst < 0:
		return bad("burst must not be negative, got %d", r.Burst)
	case r.Period < MinPeriod || r.Period > MaxPeriod:
		return bad("period must be between %v and %v, got %v", MinPeriod, MaxPeriod, r.Period)
	case r.Period%time.Microsecond != 0:
		return bad("period must be a whole number of microseconds, got %v", r.Period)
	}
	if r.Algorithm == SlidingWindow && r.Limit > MaxSlidingWindowLimit {
		return bad("sliding_window keeps one entry per unit: limit must be at most %d (use sliding_window_counter for more)", MaxSlidingWindowLimit)
	}
	us := r.Period.Microseconds()
	if r.Capacity() > MaxCapacityTimesPeriod/us || r.Limit > MaxCapacityTimesPeriod/us {
		return bad("limit or burst times period is too large to count exactly")
	}
	return nil
}

// Check applies a Rule to one counter.
type Check struct {
	Rule Rule
	// Key names the counter; build it with package keyspace. Checks evaluated
	// together by the Redis store must share one hash tag (one Cluster slot).
	Key string
}

// Result is the outcome of one Check.
type Result struct {
	// Allowed reports whether this check alone would admit the request.
	Allowed bool
	// Remaining is the number of units still available: after this request
	// when this check allowed it (even if another check denied the batch and
	// so nothing was charged), before it when this check denied it.
	Remaining int64
	// ResetAfter is the time until the counter is back to full capacity (or,
	// for window algorithms, until the current window stops counting).
	ResetAfter time.Duration
	// RetryAfter is 0 when allowed, Never when the cost can never fit, and
	// otherwise the time after which the same request would be admitted if
	// nothing else consumed the counter.
	RetryAfter time.Duration
}

// Decision is the outcome of one request against a batch of checks.
type Decision struct {
	// Allowed is false when any enforced (non-shadow) check denied.
	Allowed bool
	// Rule is the rule that decided: the enforced denying rule with the longest
	// RetryAfter when denied, else the enforced rule with the least Remaining
	// (the most restrictive). Limit, Remaining, ResetAfter and RetryAfter below
	// are its numbers; they fill X-RateLimit-*, RateLimit, RateLimit-Policy
	// and Retry-After.
	Rule       Rule
	Limit      int64
	Remaining  int64
	ResetAfter time.Duration
	RetryAfter time.Duration
	// Lease identifies the slots taken by Concurrency checks of an admitted
	// request; pass it to Store.Release when the call ends. Empty otherwise.
	Lease string
	// Results has one entry per Check, in the order given (shadow ones too).
	Results []Result
}

// Store evaluates checks atomically. Implementations are safe for concurrent
// use by many goroutines (and, for shared stores, many processes).
type Store interface {
	// Take evaluates checks for one request of the given cost: if every
	// enforced check allows, all checks that allow are charged (and a
	// Concurrency check takes a slot under the returned lease); otherwise
	// nothing is charged. An error means no decision (see the store's docs
	// for whether the request may have been charged, e.g. on a timeout).
	Take(ctx context.Context, checks []Check, cost int64) (Decision, error)
	// Refund gives back what an admitted request charged (cost units, and the
	// Concurrency slots of lease). Used when a later stage denies the request.
	Refund(ctx context.Context, checks []Check, cost int64, lease string) error
	// Release frees the Concurrency slots held under lease (other algorithms
	// are unaffected). Releasing twice, or an expired lease, is harmless.
	Release(ctx context.Context, checks []Check, lease string) error
}

// Renewer is a Store whose Concurrency leases can be extended, so that a
// slot held longer than one Period (an MCP session in use) keeps its lease
// instead of taking a new one. Both stores of this module implement it.
type Renewer interface {
	// Renew makes the Concurrency slots held under lease by checks last at
	// least a full Period from now (a lease is never shortened, so a check
	// with a short Period asks whether the lease is held without extending
	// it); other algorithms are unaffected. held is false when
	// the lease is empty or any of those slots is no longer held (released
	// or expired): such a slot is not taken again. A batch without a
	// Concurrency check is held.
	Renew(ctx context.Context, checks []Check, lease string) (held bool, err error)
}

// Errors shared by the stores.
var (
	// ErrInvalidCost means a cost below 1 was passed to Take or Refund.
	ErrInvalidCost = errors.New("limit: cost must be at least 1")
	// ErrNoChecks means Take was called with no checks.
	ErrNoChecks = errors.New("limit: no checks")
	// ErrDuplicateKey means two checks of one batch named the same key.
	ErrDuplicateKey = errors.New("limit: the same key is in two checks")
)

// Validate checks a batch before a store evaluates it: at least one check,
// cost >= 1, valid rules, and distinct non-empty keys (one counter holds one
// rule's state, so a key twice in a batch is a mistake).
func Validate(checks []Check, cost int64) error {
	if len(checks) == 0 {
		return ErrNoChecks
	}
	if cost < 1 {
		return ErrInvalidCost
	}
	for i, c := range checks {
		if err := c.Rule.Validate(); err != nil {
			return err
		}
		if c.Key == "" {
			return fmt.Errorf("%w %q: empty key", ErrInvalidRule, c.Rule.Name)
		}
		for _, prev := range checks[:i] {
			if prev.Key == c.Key {
				return fmt.Errorf("%w %q: %w: %q", ErrInvalidRule, c.Rule.Name, ErrDuplicateKey, c.Key)
			}
		}
	}
	return nil
}

// Combine builds the Decision of a batch from the per-check results, as every
// store must: denied if any enforced check denied, the deciding rule chosen as
// documented on Decision, the lease kept only when a Concurrency check took a
// slot under it. results must have one entry per check.
func Combine(checks []Check, results []Result, lease string) Decision {
	d, _ := combine(checks, results, lease)
	return d
}

// combine is Combine, also returning the index of the deciding check.
func combine(checks []Check, results []Result, lease string) (Decision, int) {
	d := Decision{Allowed: true, Results: results}
	best := -1
	for i, r := range results {
		if checks[i].Rule.Shadow {
			continue
		}
		if !r.Allowed {
			if d.Allowed || longer(r.RetryAfter, results[best].RetryAfter) {
				best = i
			}
			d.Allowed = false
			continue
		}
		if d.Allowed && (best < 0 || r.Remaining < results[best].Remaining) {
			best = i
		}
	}
	if best < 0 { // only shadow checks: report the most restrictive of them
		for i, r := range results {
			if best < 0 || r.Remaining < results[best].Remaining {
				best = i
			}
		}
	}
	r := results[best]
	d.Rule = checks[best].Rule
	d.Limit = checks[best].Rule.Limit
	if checks[best].Rule.Algorithm == TokenBucket || checks[best].Rule.Algorithm == GCRA {
		d.Limit = checks[best].Rule.Capacity()
	}
	d.Remaining = r.Remaining
	d.ResetAfter = r.ResetAfter
	d.RetryAfter = r.RetryAfter
	if d.Allowed {
		d.RetryAfter = 0
		// The lease names slots; it is returned only if a slot was taken (a
		// denying shadow concurrency rule takes none).
		for i, c := range checks {
			if c.Rule.Algorithm == Concurrency && results[i].Allowed {
				d.Lease = lease
				break
			}
		}
	}
	return d, best
}

// longer orders retry times with Never as the longest.
func longer(a, b time.Duration) bool {
	if b == Never {
		return false
	}
	return a == Never || a > b
}

// ErrNotCounter means a key passed to Resetter.Reset is not a rate-limit
// counter key (keyspace.IsCounter): usage meters, breakers and cache keys
// are never dropped by Reset.
var ErrNotCounter = errors.New("limit: not a rate-limit counter key")

// Resetter is a Store whose counters can be dropped, for operators (the
// admin API's limit reset). Both stores of this module implement it.
type Resetter interface {
	// Reset deletes the counters named by keys, each built with package
	// keyspace (keyspace.Counter): a dropped counter is back to full
	// capacity, and the Concurrency slots it held are forgotten (their
	// holders' Release is then harmless). Keys that hold nothing are
	// skipped. It returns how many of keys held a counter. A key that is
	// not a counter's fails the whole call with ErrNotCounter before
	// anything is deleted. Each key is deleted atomically, the batch is not.
	Reset(ctx context.Context, keys []string) (int, error)
}

// CounterLister is a Store that can find the counters it holds under a
// key prefix, for operators: the admin API shows and resets a tenant's
// per-tool counters (keyspace.ToolCounters) for tools no configuration
// lists, which only the store knows. Both stores of this module implement
// it.
type CounterLister interface {
	// HeldCounters returns the keys of the live counters whose key starts
	// with prefix, in no particular order. prefix must name a tenant's
	// counters (keyspace.IsCounter, with the tenant's hash tag closed),
	// else ErrNotCounter. It reads the store's key space, not the hot
	// path's state: on Redis it is a SCAN of every master, whose cost grows
	// with the number of keys held.
	HeldCounters(ctx context.Context, prefix string) ([]string, error)
}
