package limit

import (
	"errors"
	"fmt"
	"time"
)

// MaxUsage bounds every number a meter holds or is given: each field of a
// Usage (a counter, a Seed, a delta, a flushed snapshot), a Quota, a
// Meter.Cost and a cost. Twice it stays below 2^53, so a store adds any two of them exactly
// (the Redis store computes in Lua doubles). About 1.1e15 units: a tenant
// charged a million units a second reaches it after 35 years.
const MaxUsage = 1 << 50

// Bounds of Meter.ExpireAt (see ValidateMeter). A time outside them is a
// mistake (the zero time, a Unix-epoch confusion), and within them every
// store converts it to whole microseconds below 2^53 exactly.
var (
	minExpireAt = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	maxExpireAt = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

// Errors of metered calls.
var (
	// ErrInvalidMeter means a Meter, a cost, a delta or a flushed snapshot
	// failed ValidateMeter or ValidateUsage. Nothing was charged.
	ErrInvalidMeter = errors.New("limit: invalid meter")
	// ErrMeterExpired means the Meter's ExpireAt is not after the store's
	// clock: the counter would be dropped as soon as written, and what it
	// counted lost. Nothing was charged. The caller computed the billing
	// period or its grace wrongly (or its clock is far off the store's).
	ErrMeterExpired = errors.New("limit: meter expire time has passed")
	// ErrUsageOverflow means a charge would take a field of the counter
	// above MaxUsage, where it could no longer be counted exactly. Nothing
	// was charged.
	ErrUsageOverflow = errors.New("limit: usage counter would exceed MaxUsage")
	// ErrMeterReplaced means MarkFlushed found the meter's counter of
	// another generation than the snapshot's: the counter was lost and
	// created anew since it was read. Nothing was recorded; read the meter
	// again.
	ErrMeterReplaced = errors.New("limit: meter replaced by a new generation")
)

// ValidateMeter checks a meter and the cost of a call before a store charges
// it: a non-empty Key, 0 <= Quota <= MaxUsage, 0 <= Cost <= MaxUsage (0:
// the call's cost), a Seed that passes
// ValidateUsage (when Seeded), an ExpireAt from 2020-01-01 to 2200-01-01
// UTC, and 1 <= cost <= MaxUsage. A cost below 1 is ErrInvalidCost; every
// other error wraps ErrInvalidMeter.
//
// Whether ExpireAt has already passed is for the store to say, on its own
// clock (ErrMeterExpired).
func ValidateMeter(m Meter, cost int64) error {
	if cost < 1 {
		return ErrInvalidCost
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %q: %s", ErrInvalidMeter, m.Key, fmt.Sprintf(format, args...))
	}
	switch {
	case m.Key == "":
		return bad("empty key")
	case cost > MaxUsage:
		return bad("cost %d is above MaxUsage (%d)", cost, int64(MaxUsage))
	case m.Cost < 0 || m.Cost > MaxUsage:
		return bad("meter cost must be between 0 and %d, got %d", int64(MaxUsage), m.Cost)
	case m.Quota < 0 || m.Quota > MaxUsage:
		return bad("quota must be between 0 and %d, got %d", int64(MaxUsage), m.Quota)
	case m.ExpireAt.Before(minExpireAt) || m.ExpireAt.After(maxExpireAt):
		return bad("expire time %v is not between %v and %v", m.ExpireAt, minExpireAt, maxExpireAt)
	}
	if err := ValidateOp(Meter{Op: m.Op}, Usage{}); err != nil {
		return err
	}
	if m.Seeded {
		if err := ValidateUsage(m.Seed); err != nil {
			return fmt.Errorf("%w %q: seed: %w", ErrInvalidMeter, m.Key, err)
		}
	}
	return nil
}

// ValidateUsage checks that every field of u is between 0 and MaxUsage: a
// Seed, an Adjust delta, or a snapshot passed to MarkFlushed. Errors wrap
// ErrInvalidMeter.
func ValidateUsage(u Usage) error {
	for _, f := range [...]struct {
		name string
		v    int64
	}{{"charged", u.Charged}, {"refunded", u.Refunded}, {"calls", u.Calls}, {"refunded calls", u.RefundedCalls}} {
		if f.v < 0 || f.v > MaxUsage {
			return fmt.Errorf("%w: %s must be between 0 and %d, got %d", ErrInvalidMeter, f.name, int64(MaxUsage), f.v)
		}
	}
	return nil
}

// ValidateMetered checks a metered batch: checks as Validate does when there
// are any (a metered batch may have none: a tool with only a quota), the
// meter and cost as ValidateMeter does, and a meter key distinct from every
// check's key (ErrDuplicateKey, wrapped in ErrInvalidMeter): a key holds
// either a counter or a meter.
func ValidateMetered(checks []Check, m Meter, cost int64) error {
	if len(checks) > 0 {
		if err := Validate(checks, cost); err != nil {
			return err
		}
	}
	if err := ValidateMeter(m, cost); err != nil {
		return err
	}
	for _, c := range checks {
		if c.Key == m.Key {
			return fmt.Errorf("%w %q: %w: check %q uses it", ErrInvalidMeter, m.Key, ErrDuplicateKey, c.Rule.Name)
		}
	}
	return nil
}

// CombineMetered builds the Decision of a metered batch, as every store
// must, from the per-check results and whether the meter admitted the call
// (quota respected, counter present). With checks, it is Combine's decision,
// denied as well when the meter did not admit; then, if no enforced check
// denied, Rule is the zero Rule (Rule.Name == "") and Limit, Remaining,
// ResetAfter and RetryAfter are 0: the quota's numbers are in the
// MeterResult, and its retry time is the end of the billing period, which
// the caller knows and the store does not. A denied decision carries no
// Lease (no slot was taken). With no checks, Results is empty and Rule is
// the zero Rule.
func CombineMetered(checks []Check, results []Result, lease string, meterOK bool) Decision {
	if len(checks) == 0 {
		return Decision{Allowed: meterOK, Results: []Result{}}
	}
	d := Combine(checks, results, lease)
	if meterOK || !d.Allowed {
		return d
	}
	return Decision{Results: results}
}
