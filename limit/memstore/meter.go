package memstore

import (
	"context"
	"fmt"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/internal/algo"
)

// Usage meters (limit.MeteredStore) live in the shards next to the
// counters: a meter is in its key's shard, and a metered call locks the
// shards of its checks and of its meter together, in the one ascending
// order every call uses. A meter is dropped once its Meter.ExpireAt has
// passed on the store's clock (when next touched, and by Sweep); until then
// it is kept whatever it holds. Meters are lost with the process: the caller
// re-creates them from the durable total (Meter.Seed) after a restart.

// expireUS is t on the store's clock: microseconds since Epoch, rounded up
// so that a counter never goes before the time asked for.
func expireUS(t time.Time) int64 {
	d := t.Sub(Epoch)
	us := int64(d / time.Microsecond)
	if d%time.Microsecond > 0 {
		us++
	}
	return us
}

// meter returns key's meter, or nil when the shard holds none; one past its
// expiry is dropped. Call with sh.mu held.
func (sh *shard) meter(key string, now int64) *algo.Meter {
	mt := sh.meters[key]
	if mt != nil && mt.ExpiresAt <= now {
		delete(sh.meters, key)
		return nil
	}
	return mt
}

// putMeter stores a meter created from its Seed.
func (sh *shard) putMeter(key string, mt *algo.Meter) {
	if sh.meters == nil {
		sh.meters = make(map[string]*algo.Meter)
	}
	sh.meters[key] = mt
}

// meterErr turns the statuses that are errors into them.
func meterErr(st algo.MeterStatus) error {
	switch st {
	case algo.MeterExpired:
		return limit.ErrMeterExpired
	case algo.MeterOverflow:
		return limit.ErrUsageOverflow
	}
	return nil
}

// TakeMetered is Take with the usage meter m, atomically: the checks (there
// may be none) and m's quota are evaluated together and, if every enforced
// check allows and Quota is 0 or Used()+mc <= Quota (mc is
// m.CostFor(cost): m.Cost when set, else cost), the checks are charged as
// Take charges them (cost units) and the meter by mc units and one call;
// otherwise nothing is charged. The decision is limit.CombineMetered's: when
// the quota alone denies, Decision.Rule is the zero Rule.
//
// A meter the store does not hold (new period, restarted process, expired)
// is first created from m.Seed when m.Seeded, with the Seed as both its live
// and its flushed usage, whatever the call decides then; when not Seeded,
// nothing is charged, MeterResult.NeedSeed is set and the decision is
// denied: call again with the durable total as Seed.
//
// Errors (nothing charged): ctx.Err() when ctx is done before any work, the
// validation errors of limit.ValidateMetered, limit.ErrMeterExpired when
// m.ExpireAt is not after the store's clock, limit.ErrUsageOverflow.
func (s *Store) TakeMetered(ctx context.Context, checks []limit.Check, m limit.Meter, cost int64) (limit.Decision, limit.MeterResult, error) {
	if err := ctx.Err(); err != nil {
		return limit.Decision{}, limit.MeterResult{}, err
	}
	if err := limit.ValidateMetered(checks, m, cost); err != nil {
		return limit.Decision{}, limit.MeterResult{}, err
	}
	results := make([]limit.Result, len(checks))
	lease, mr, _, _, err := s.c.guarded(checks, &m, nil, cost, results)
	if err != nil {
		return limit.Decision{}, limit.MeterResult{}, err
	}
	return limit.CombineMetered(checks, results, lease, mr.Allowed), mr, nil
}

// insertShard inserts i into the sorted, duplicate-free locks.
func insertShard(locks []int, i int) []int {
	j := len(locks)
	for j > 0 && locks[j-1] > i {
		j--
	}
	if j > 0 && locks[j-1] == i {
		return locks
	}
	locks = append(locks, 0)
	copy(locks[j+1:], locks[j:])
	locks[j] = i
	return locks
}

// Adjust adds delta to the meter m.Key, atomically, with no quota check (a
// corrected cost is owed whatever the quota), and refreshes its expiry to
// m.ExpireAt. A meter the store does not hold is created from m.Seed first
// when m.Seeded; when not, nothing changes and the result has NeedSeed.
// MeterResult.Allowed reports that delta was applied; Usage is the counter
// after it.
//
// Errors (nothing changed): ctx.Err(), limit.ErrInvalidMeter (a field of
// delta negative or above limit.MaxUsage, or an invalid m),
// limit.ErrMeterExpired, limit.ErrUsageOverflow.
func (s *Store) Adjust(ctx context.Context, m limit.Meter, delta limit.Usage) (limit.MeterResult, error) {
	if err := ctx.Err(); err != nil {
		return limit.MeterResult{}, err
	}
	if err := validateAdjust(m, delta); err != nil {
		return limit.MeterResult{}, err
	}
	c := s.c
	sh := &c.shards[c.shardOf(m.Key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := sh.at(c.now())
	opKey := ""
	if m.Op != "" {
		opKey = m.Key + " " + m.Op
		if o := sh.op(opKey, now); o != nil {
			return o.mr, nil
		}
	}
	exp := expireUS(m.ExpireAt)
	mt, created, st := algo.MeterOpen(sh.meter(m.Key, now), m, now, exp)
	covered := st == algo.MeterOK && algo.MeterReplayed(mt, m.Replay, delta)
	if st == algo.MeterOK && !covered {
		st = algo.MeterAdjust(mt, delta, exp)
	}
	if err := meterErr(st); err != nil {
		return limit.MeterResult{}, err
	}
	if created {
		sh.putMeter(m.Key, mt)
	}
	if st == algo.MeterNeedSeed {
		return limit.MeterResult{NeedSeed: true}, nil
	}
	mr := limit.MeterResult{Allowed: !covered, Covered: covered, Usage: mt.Live, Gen: mt.Gen}
	if opKey != "" {
		sh.putOp(opKey, &opMarker{exp: now + limit.OpTTL.Microseconds(), mr: mr})
	}
	return mr, nil
}

// opMarker is the record of an applied op (limit.Meter.Op): what the call
// answered, kept until exp (µs on the store's clock).
type opMarker struct {
	exp     int64
	results []limit.Result
	lease   string
	mr      limit.MeterResult
	bs      limit.BreakerState
}

// op returns the live marker of key, or nil. Call with sh.mu held.
func (sh *shard) op(key string, now int64) *opMarker {
	o := sh.ops[key]
	if o != nil && o.exp <= now {
		delete(sh.ops, key)
		return nil
	}
	return o
}

// maxOpsPerShard bounds the op markers one shard keeps (with the default
// 64 shards, about 65,000 markers, some 25 MB). An op is recorded for
// every metered call, and a busy store would otherwise keep each for
// limit.OpTTL (5 minutes: gigabytes at 10,000 calls/s). In process no
// answer is ever lost, so the engine never repeats an op to this store; an
// op evicted early and then repeated by another caller applies again.
const maxOpsPerShard = 1024

// putOp records the marker of key, evicting some markers (expired or not)
// when the shard holds maxOpsPerShard. Call with sh.mu held.
func (sh *shard) putOp(key string, o *opMarker) {
	if sh.ops == nil {
		sh.ops = make(map[string]*opMarker)
	}
	if len(sh.ops) >= maxOpsPerShard {
		n := 0
		for k := range sh.ops { // map order: an arbitrary eighth goes
			delete(sh.ops, k)
			if n++; n >= maxOpsPerShard/8 {
				break
			}
		}
	}
	sh.ops[key] = o
}

// validateAdjust checks the arguments of Adjust (a meter as for a call of
// cost 1, and a delta of valid fields).
func validateAdjust(m limit.Meter, delta limit.Usage) error {
	if err := limit.ValidateMeter(m, 1); err != nil {
		return err
	}
	if err := limit.ValidateUsage(delta); err != nil {
		return fmt.Errorf("delta: %w", err)
	}
	return limit.ValidateOp(m, delta)
}

// ReadMeter returns the meter key's live usage and the part marked flushed;
// ok is false when the store holds no such meter (never created, or
// expired). The error is ctx.Err() or nil.
func (s *Store) ReadMeter(ctx context.Context, key string) (limit.MeterState, bool, error) {
	if err := ctx.Err(); err != nil {
		return limit.MeterState{}, false, err
	}
	c := s.c
	sh := &c.shards[c.shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	mt := sh.meter(key, sh.at(c.now()))
	if mt == nil {
		return limit.MeterState{}, false, nil
	}
	return state(key, mt), true, nil
}

func state(key string, mt *algo.Meter) limit.MeterState {
	return limit.MeterState{Key: key, Tenant: mt.Tenant, Period: mt.Period, Live: mt.Live, Flushed: mt.Flushed, Gen: mt.Gen}
}

// MarkFlushed records that the durable store holds at least u, read from
// generation gen, for the meter key: the flushed part becomes its
// field-by-field maximum with u, so a late or repeated call never lowers
// it. It neither creates a meter the store does not hold nor changes its
// expiry. Errors: ctx.Err(), limit.ErrInvalidMeter (empty key, or a field
// of u out of range), limit.ErrMeterReplaced (the counter is of another
// generation: nothing recorded), limit.ErrMeterMissing (no counter: it
// expired, or the store was restarted since it was read).
func (s *Store) MarkFlushed(ctx context.Context, key, gen string, u limit.Usage) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validateFlushed(key, u); err != nil {
		return err
	}
	c := s.c
	sh := &c.shards[c.shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	mt := sh.meter(key, sh.at(c.now()))
	if mt == nil {
		return fmt.Errorf("memstore: mark %q flushed: %w", key, limit.ErrMeterMissing)
	}
	if !algo.MeterMarkFlushed(mt, gen, u) {
		return fmt.Errorf("memstore: mark %q flushed: %w", key, limit.ErrMeterReplaced)
	}
	return nil
}

func validateFlushed(key string, u limit.Usage) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", limit.ErrInvalidMeter)
	}
	if err := limit.ValidateUsage(u); err != nil {
		return fmt.Errorf("flushed usage of %q: %w", key, err)
	}
	return nil
}

// ScanMeters calls fn with every meter whose live usage is not covered by
// its flushed part, in no particular order. Each shard is read under its
// lock and fn is called after the lock is released, so fn may call the
// store (MarkFlushed, typically). A meter changed or created while the scan
// runs may be reported as it was or not at all. The scan stops at the first
// error of fn, or when ctx is done, and returns that error.
func (s *Store) ScanMeters(ctx context.Context, fn func(limit.MeterState) error) error {
	c := s.c
	var batch []limit.MeterState
	for i := range c.shards {
		if err := ctx.Err(); err != nil {
			return err
		}
		sh := &c.shards[i]
		batch = batch[:0]
		sh.mu.Lock()
		now := sh.at(c.now())
		for k, mt := range sh.meters {
			if mt.ExpiresAt > now && !mt.Flushed.Covers(mt.Live) {
				batch = append(batch, state(k, mt))
			}
		}
		sh.mu.Unlock()
		for _, ms := range batch {
			if err := fn(ms); err != nil {
				return err
			}
		}
	}
	return nil
}
