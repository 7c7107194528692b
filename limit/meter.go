package limit

import (
	"context"
	"errors"
	"time"
)

// ErrMeterMissing means MarkFlushed found no counter for the key: the store
// lost it (data loss, a restart of the memory store) or it expired since
// it was read. Nothing was recorded or created. The durable store holds the
// snapshot, but a counter re-created from a durable total read before that
// write committed does not: whoever charged the lost counter must place its
// writes again (as replays, which a seed holding them finds counted).
var ErrMeterMissing = errors.New("limit: meter missing from the store")

// Usage is a tenant's consumption in one billing period. Every field only
// ever grows (a refund adds to Refunded rather than subtracting from
// Charged), so two snapshots of one counter are always ordered field by
// field: a durable store can keep "the larger snapshot" and a retried or
// duplicated write never double counts.
type Usage struct {
	Charged       int64 // cost units charged on admission, plus positive corrections
	Refunded      int64 // cost units given back (estimate corrections, refunds)
	Calls         int64 // calls admitted
	RefundedCalls int64 // admissions taken back (a later stage denied the call)
}

// Used is the net cost of the period.
func (u Usage) Used() int64 { return u.Charged - u.Refunded }

// NetCalls is the number of calls that stayed admitted.
func (u Usage) NetCalls() int64 { return u.Calls - u.RefundedCalls }

// Covers reports whether u is at least v in every field: v adds nothing to u.
func (u Usage) Covers(v Usage) bool {
	return u.Charged >= v.Charged && u.Refunded >= v.Refunded && u.Calls >= v.Calls && u.RefundedCalls >= v.RefundedCalls
}

// Max is the field-by-field maximum of u and v.
func (u Usage) Max(v Usage) Usage {
	return Usage{max(u.Charged, v.Charged), max(u.Refunded, v.Refunded), max(u.Calls, v.Calls), max(u.RefundedCalls, v.RefundedCalls)}
}

// Meter is a usage counter charged in the same atomic step as a batch of
// checks: one tenant's consumption in one billing period, with an optional
// quota. Because admission and counting are one step, a quota is exact across
// any number of gateway instances.
type Meter struct {
	// Key names the counter (keyspace.Usage). With the Redis store it must
	// share the hash tag of the batch's checks.
	Key string
	// Tenant and Period are stored with the counter so that a flusher can
	// tell whose counter a key is without parsing it.
	Tenant, Period string
	// Quota is the most net cost units (Usage.Used) the period may use; 0
	// means no quota: usage is counted, never denied.
	Quota int64
	// Cost is what the call charges on the meter (Charged += Cost) and what
	// the quota must fit; 0 means the request's cost. It lets rate-limit
	// rules count calls (the checks are charged the request's cost, often 1)
	// while the meter counts units such as estimated tokens. Adjust ignores
	// it (its delta says what to add).
	Cost int64
	// Seed re-creates a counter the store does not hold (a new period, a
	// restart of the memory store, Redis data loss): the durable total of
	// the period. Seeded false means the caller does not know it; a store
	// that lacks the counter then charges nothing and answers NeedSeed.
	Seed   Usage
	Seeded bool
	// ExpireAt is when the store may drop the counter: the end of the period
	// plus enough grace for its last flush.
	ExpireAt time.Time
	// Op, when set, makes the call idempotent (see NewOp, OpTTL): the store
	// records the op with what it applied, and a repeat of the op within
	// OpTTL applies nothing and answers what the first did. At most
	// MaxOpLen bytes of [0-9A-Za-z_-].
	Op string
	// Replay, with Op, marks an Adjust placing again usage applied in a
	// lost generation of the meter (see Replay). TakeMetered ignores it.
	Replay *Replay
}

// CostFor is what a call of the request cost cost charges on m: m.Cost
// when set, else cost.
func (m Meter) CostFor(cost int64) int64 {
	if m.Cost > 0 {
		return m.Cost
	}
	return cost
}

// MeterResult is the usage side of a metered decision.
type MeterResult struct {
	// Allowed is false when the quota denied the call (nothing was charged,
	// neither the meter nor the checks).
	Allowed bool
	// NeedSeed: the counter does not exist and the Meter was not Seeded.
	// Nothing was charged; call again with the durable total as Seed.
	NeedSeed bool
	// Usage is the counter after the call when admitted, else as it stands.
	Usage Usage
	// Covered: an Adjust with a Replay found the op already counted (see
	// Replay) and applied nothing.
	Covered bool
	// Gen is the counter's generation (zero when NeedSeed, or for a
	// counter written before generations existed).
	Gen Generation
}

// MeteredStore is a Store that also keeps usage meters.
type MeteredStore interface {
	Store
	// TakeMetered is Take with a meter: the checks and the meter's quota are
	// evaluated together and, if all admit, the checks (cost units each) and
	// the meter (m.CostFor(cost) units, one call) are charged in one atomic
	// step.
	TakeMetered(ctx context.Context, checks []Check, m Meter, cost int64) (Decision, MeterResult, error)
	// Adjust adds delta to a meter (a cost corrected from the tool's result,
	// or a refund). Fields of delta must not be negative. A missing counter
	// is re-created from m.Seed when m.Seeded; else NeedSeed is set and
	// nothing changes.
	Adjust(ctx context.Context, m Meter, delta Usage) (MeterResult, error)
	// ReadMeter returns a meter's live usage and the part recorded as flushed
	// to the durable store; ok is false when the store holds no such counter.
	ReadMeter(ctx context.Context, key string) (m MeterState, ok bool, err error)
	// MarkFlushed records that the durable store holds at least u for key
	// (field by field; it never lowers what was recorded), u having been
	// read from the meter's generation gen (MeterState.Gen.ID). When the
	// store's counter is of another generation (it was lost and created
	// anew from a durable total that u may not be part of), nothing is
	// recorded and the error is ErrMeterReplaced: marking the new counter
	// with the lost one's usage would hide its own calls from every flush.
	// A missing counter is not created, and the error is ErrMeterMissing:
	// reporting it marked would tell its writers their usage is billed,
	// while the counter re-created in its place may have been seeded from
	// a durable total that predates the snapshot.
	MarkFlushed(ctx context.Context, key, gen string, u Usage) error
	// ScanMeters calls fn for every meter whose live usage is not yet all
	// flushed (the backstop sweep that finds counters of dead instances).
	ScanMeters(ctx context.Context, fn func(MeterState) error) error
}

// MeterState is a meter as the store holds it.
type MeterState struct {
	Key, Tenant, Period string
	Live, Flushed       Usage
	Gen                 Generation
}
