package algo

import (
	"strconv"

	"github.com/mcpgate/mcpgate/limit"
)

// Meter is one usage counter (limit.Meter's state). The memory store keeps
// it as is; the Redis store keeps the same numbers in a hash, and its script
// is a port of the functions below.
type Meter struct {
	Live, Flushed  limit.Usage
	Tenant, Period string
	// ExpiresAt is when the counter is dropped (limit.Meter.ExpireAt, in µs
	// on the store's clock).
	ExpiresAt int64
	// Gen is the counter's generation: when it was created (GenID) and
	// the Seed.
	Gen limit.Generation
}

// MeterStatus is the meter's side of a metered call.
type MeterStatus int

// The outcomes of MeterEval and MeterAdjust. The values are the ones the
// Redis script returns.
const (
	MeterDenied   MeterStatus = 0 // the quota denies the cost
	MeterOK       MeterStatus = 1 // the quota admits the cost (or Adjust applies)
	MeterNeedSeed MeterStatus = 2 // no counter, and no Seed to create it from
	MeterExpired  MeterStatus = 3 // ExpireAt is not after now
	MeterOverflow MeterStatus = 4 // a field would pass limit.MaxUsage
	MeterCovered  MeterStatus = 5 // a replay already counted (limit.Replay): nothing applied
)

// MeterOpen returns the counter a metered call at now works on: mt when the
// store holds it (nil otherwise), else one created from m.Seed when
// m.Seeded, with the Seed as its flushed part too (the Seed is the durable
// total, so it is already flushed). created reports the latter; the caller
// stores the new counter whatever the rest of the call decides, unless the
// call fails (MeterExpired, MeterOverflow). expireAt is m.ExpireAt on the
// store's clock.
func MeterOpen(mt *Meter, m limit.Meter, now, expireAt int64) (out *Meter, created bool, st MeterStatus) {
	if expireAt <= now {
		return nil, false, MeterExpired
	}
	if mt != nil {
		return mt, false, MeterOK
	}
	if !m.Seeded {
		return nil, false, MeterNeedSeed
	}
	return &Meter{Live: m.Seed, Flushed: m.Seed, Tenant: m.Tenant, Period: m.Period, ExpiresAt: expireAt,
		Gen: limit.Generation{ID: GenID(now), Seed: m.Seed}}, true, MeterOK
}

// GenID names the generation of a counter created at now: "t" and the
// time in µs. Never the creating op's id: an op placed again after its
// store lost the counter (and the op's marker with it) creates the counter
// anew, and that new life must not take the lost one's name, or what was
// charged in the lost one would be judged still counted (MeterReplayed).
func GenID(now int64) string { return "t" + strconv.FormatInt(now, 10) }

// MeterEval decides whether mt admits cost under quota (0: no quota); cost
// is the meter's charge (limit.Meter.CostFor), not the checks':
// MeterOverflow when Charged or Calls would pass limit.MaxUsage, else
// MeterOK when Used()+cost <= quota, else MeterDenied. It changes nothing.
func MeterEval(mt *Meter, quota, cost int64) MeterStatus {
	u := mt.Live
	switch {
	case u.Charged+cost > limit.MaxUsage || u.Calls+1 > limit.MaxUsage:
		return MeterOverflow
	case quota == 0 || u.Used()+cost <= quota:
		return MeterOK
	}
	return MeterDenied
}

// MeterCharge charges an admitted call: cost units and one call, and moves
// the expiry to expireAt (every write refreshes it).
func MeterCharge(mt *Meter, cost, expireAt int64) {
	mt.Live.Charged += cost
	mt.Live.Calls++
	mt.ExpiresAt = expireAt
}

// MeterAdjust adds delta (fields >= 0) to mt and refreshes its expiry, or
// returns MeterOverflow and changes nothing.
func MeterAdjust(mt *Meter, delta limit.Usage, expireAt int64) MeterStatus {
	u := mt.Live
	u.Charged += delta.Charged
	u.Refunded += delta.Refunded
	u.Calls += delta.Calls
	u.RefundedCalls += delta.RefundedCalls
	if u.Charged > limit.MaxUsage || u.Refunded > limit.MaxUsage || u.Calls > limit.MaxUsage || u.RefundedCalls > limit.MaxUsage {
		return MeterOverflow
	}
	mt.Live = u
	mt.ExpiresAt = expireAt
	return MeterOK
}

// MeterReplayed reports whether a replay (limit.Replay) of delta is
// already counted by mt: mt is the generation the op was applied in, or
// its seed holds the op.
func MeterReplayed(mt *Meter, r *limit.Replay, delta limit.Usage) bool {
	return r != nil && (mt.Gen.ID == r.Gen || limit.Holds(mt.Gen.Seed, r.After, delta))
}

// MeterMarkFlushed raises the flushed part of mt to at least u, field by
// field, when mt is generation gen; it never lowers it and leaves the
// expiry alone. It reports false, changing nothing, when mt is of another
// generation (limit.ErrMeterReplaced).
func MeterMarkFlushed(mt *Meter, gen string, u limit.Usage) bool {
	if mt.Gen.ID != gen {
		return false
	}
	mt.Flushed = mt.Flushed.Max(u)
	return true
}
