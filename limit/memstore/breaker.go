package memstore

import (
	"context"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/internal/algo"
)

// Loop breakers (limit.GuardedStore). A breaker's state and its
// identical-calls counters live in the shards next to the counters, each in
// its key's shard; a guarded call locks the shards of its checks, meter,
// breaker and identical-calls counter together, in the one ascending order
// every call uses, and runs limit/internal/algo's breaker functions on
// them. State is dropped at its algo.BreakerExpiry (a closed breaker with
// no counts is not kept at all), a counter at the end of its window; both
// are lost with the process, like the counters.

var _ limit.GuardedStore = (*Store)(nil)

// breakerMaps holds a shard's breakers and identical-calls counters; made
// on first use, so that a store without breakers pays one nil pointer per
// shard.
type breakerMaps struct {
	states map[string]*algo.Breaker
	calls  map[string]*algo.CallCounter
}

func (sh *shard) breakers() *breakerMaps {
	if sh.br == nil {
		sh.br = &breakerMaps{states: map[string]*algo.Breaker{}, calls: map[string]*algo.CallCounter{}}
	}
	return sh.br
}

// breaker returns a copy of key's live state (the zero Breaker when the
// shard holds none) and whether it held one; an expired one is dropped.
// Call with sh.mu held.
func (sh *shard) breaker(key string, now int64) (algo.Breaker, bool) {
	if sh.br == nil {
		return algo.Breaker{}, false
	}
	b := sh.br.states[key]
	if b == nil {
		return algo.Breaker{}, false
	}
	if b.ExpiresAt <= now {
		delete(sh.br.states, key)
		return algo.Breaker{}, false
	}
	return *b, true
}

// putBreaker stores b as key's state with its expiry, or deletes the state
// when b holds nothing. The spec's names are stored with it, for listing.
func (sh *shard) putBreaker(key string, b algo.Breaker, spec *limit.BreakerSpec, p algo.BreakerParams, now int64, held bool) {
	exp := algo.BreakerExpiry(&b, p, now)
	if exp == 0 {
		if held {
			delete(sh.br.states, key)
		}
		return
	}
	b.ExpiresAt, b.Tenant, b.Subject, b.ID = exp, spec.Tenant, spec.Subject, spec.ID
	m := sh.breakers().states
	if cur := m[key]; cur != nil {
		*cur = b
	} else {
		m[key] = &b
	}
}

// calls returns a copy of key's live identical-calls counter (zero when
// none). Call with sh.mu held.
func (sh *shard) calls(key string, now int64) algo.CallCounter {
	if sh.br == nil {
		return algo.CallCounter{}
	}
	if n := sh.br.calls[key]; n != nil && n.ExpiresAt > now {
		return *n
	}
	return algo.CallCounter{}
}

func (sh *shard) putCalls(key string, n algo.CallCounter) {
	m := sh.breakers().calls
	if cur := m[key]; cur != nil {
		*cur = n
	} else {
		m[key] = &n
	}
}

// Evaluate is Take (no meter) or TakeMetered (a meter) with an optional loop
// breaker, in one atomic step. Without a breaker it is exactly those calls.
// With one:
//
//   - an open breaker (or a half-open one whose probe is in flight) denies
//     the call before anything else is read: nothing is charged or counted,
//     Outcome.Breaker.Open is set with RetryAfter, and the Decision is
//     denied with the zero Rule and one zero Result per check (MeterResult
//     is zero too: check Breaker.Open first);
//   - otherwise the call is evaluated as TakeMetered or Take would (with no
//     checks and no meter, it is admitted), and then counted by the breaker
//     as limit/internal/algo documents: a denial by the checks or the quota
//     toward ConsecutiveDenials, an admission as an identical call; either
//     may open the breaker (Outcome.Breaker.Opened, RetryAfter then the
//     cooldown). A call the meter could not judge (NeedSeed) is not counted.
//   - Outcome.Breaker.Probe marks the admitted half-open probe, whose
//     outcome the caller reports with ReportOutcome(..., probe = true).
//     Identical is the call's fingerprint count when the call was counted
//     (else the count that opened the breaker, if identical calls did).
//
// With global checks (Request.Global) every counter of the request, tenant
// and global, is locked at once: one critical section decides and charges
// them all-or-nothing, with the meter and the breaker (a denial by a global
// rule counts toward ConsecutiveDenials like any other); the decisions are
// limit.CombineRequest's.
//
// Errors (nothing charged, nothing counted): ctx.Err(), those of
// limit.ValidateRequest, and the meter's errors of TakeMetered.
func (s *Store) Evaluate(ctx context.Context, req limit.Request) (limit.Outcome, error) {
	if req.Breaker == nil && len(req.Global) == 0 {
		if req.Meter == nil {
			d, err := s.Take(ctx, req.Checks, req.Cost)
			return limit.Outcome{Decision: d}, err
		}
		d, mr, err := s.TakeMetered(ctx, req.Checks, *req.Meter, req.Cost)
		return limit.Outcome{Decision: d, Meter: mr}, err
	}
	if err := ctx.Err(); err != nil {
		return limit.Outcome{}, err
	}
	if err := limit.ValidateRequest(req); err != nil {
		return limit.Outcome{}, err
	}
	checks := req.Checks
	if len(req.Global) > 0 {
		// One critical section over every counter: the global checks are
		// evaluated with the tenant's, all-or-nothing.
		checks = make([]limit.Check, 0, len(req.Checks)+len(req.Global))
		checks = append(append(checks, req.Checks...), req.Global...)
	}
	results := make([]limit.Result, len(checks))
	lease, mr, bs, gated, err := s.c.guarded(checks, req.Meter, req.Breaker, req.Cost, results)
	if err != nil {
		return limit.Outcome{}, err
	}
	d, g, byGlobal := algo.RequestDecisions(req, results, lease, mr.Allowed, gated)
	return limit.Outcome{Decision: d, Global: g, GlobalDecides: byGlobal, Meter: mr, Breaker: bs}, nil
}

// guarded evaluates checks, the meter m and the breaker spec (either may
// be nil) atomically: it fills results and returns the lease (when a
// concurrency slot was taken), the meter's and the breaker's results, and
// whether the breaker's gate denied the call. Every shard the call reads
// or writes is locked before its first read and unlocked after its last
// write: the op's replay, the gate and settle run in one critical section.
func (c *core) guarded(checks []limit.Check, m *limit.Meter, spec *limit.BreakerSpec, cost int64, results []limit.Result) (lease string, mr limit.MeterResult, bs limit.BreakerState, gated bool, err error) {
	var ib, lb [batchSize]int
	pl := c.plan(checks, m, spec, ib[:0], lb[:0])
	for _, i := range pl.locks {
		c.shards[i].mu.Lock()
	}
	defer c.unlock(pl.locks)
	now := c.at(c.now(), pl.locks)

	// A repeated op applies nothing and answers what it did.
	var opKey string
	if m != nil && m.Op != "" {
		opKey = m.Key + " " + m.Op
		if o := c.shards[pl.ms].op(opKey, now); o != nil {
			copy(results, o.results)
			return o.lease, o.mr, o.bs, false, nil
		}
	}

	// The breaker's gate: an open breaker denies before anything is read.
	var br breakerRead
	if spec != nil {
		var deny bool
		if br, deny, bs = c.gate(spec, pl.p, pl.bsi, now); deny {
			return "", mr, bs, true, nil
		}
	}
	lease, mr, bs, err = c.settle(checks, m, spec, cost, results, &pl, br, now, opKey)
	return lease, mr, bs, false, err
}

// guardPlan says where a guarded call's state lives: the shard of each
// check (idx), of the meter (ms), of the breaker (bsi) and of its
// identical-calls counter (csi), and locks, each of those shards once, in
// the ascending order every call locks in. p is the breaker's params,
// whose Identical says whether csi is among the locks. A shard unused (no
// meter, no breaker, no identical-calls trigger) is 0 and not locked for
// it.
type guardPlan struct {
	idx, locks   []int
	ms, bsi, csi int
	p            algo.BreakerParams
}

// plan finds the shards of a guarded call of checks, the meter m and the
// breaker spec (either may be nil). The shard indexes are appended to idx
// and locks, which the caller provides (on its stack) so that a batch of
// up to batchSize shards costs no allocation.
func (c *core) plan(checks []limit.Check, m *limit.Meter, spec *limit.BreakerSpec, idx, locks []int) guardPlan {
	for _, ch := range checks {
		i := c.shardOf(ch.Key)
		idx = append(idx, i)
		locks = insertShard(locks, i)
	}
	var ms, bsi, csi int
	if m != nil {
		ms = c.shardOf(m.Key)
		locks = insertShard(locks, ms)
	}
	var p algo.BreakerParams
	if spec != nil {
		p = algo.Params(*spec)
		bsi = c.shardOf(spec.Key)
		locks = insertShard(locks, bsi)
		if p.Identical > 0 {
			csi = c.shardOf(spec.IdenticalKey)
			locks = insertShard(locks, csi)
		}
	}
	return guardPlan{idx: idx, locks: locks, ms: ms, bsi: bsi, csi: csi, p: p}
}

// breakerRead is a breaker as a call's gate read it and let the call
// through: its state b, whether the shard held it, and whether the call is
// the half-open breaker's probe.
type breakerRead struct {
	b     algo.Breaker
	held  bool
	probe bool
}

// settle is the part of a guarded call its gate let through, under the
// locks of pl (at time now): the checks are tried without charging, the
// meter m is judged, and the checks and the meter are charged only if
// both admit; then the breaker of spec read as br (nil spec: none) counts
// the verdict, and an admitted op (opKey, "" for none) is recorded for its
// repeats. The counters the dry run read are handed back to their shards
// (releaseAll) last, after every other write. On an error nothing is
// charged or counted.
func (c *core) settle(checks []limit.Check, m *limit.Meter, spec *limit.BreakerSpec, cost int64, results []limit.Result, pl *guardPlan, br breakerRead, now int64, opKey string) (lease string, mr limit.MeterResult, bs limit.BreakerState, err error) {
	var sb [batchSize]*counter
	states, admit := c.dryRun(checks, pl.idx, sb[:0], results, now, cost)
	defer c.releaseAll(checks, pl.idx, states)

	if lease, mr, admit, err = c.charge(checks, m, states, results, pl, now, cost, admit); err != nil {
		return "", limit.MeterResult{}, limit.BreakerState{}, err
	}
	if spec != nil {
		bs = c.breakerAfter(spec, pl.p, br.b, verdict(mr, admit), br.held, br.probe, now, pl.bsi, pl.csi)
	}
	if opKey != "" && admit {
		c.shards[pl.ms].putOp(opKey, &opMarker{exp: now + limit.OpTTL.Microseconds(),
			results: append([]limit.Result(nil), results...), lease: lease, mr: mr, bs: bs})
	}
	return lease, mr, bs, nil
}

// charge judges the meter m (nil: none) and, when it and the dry run
// (admit, with the checks' states and results) both admit, charges the
// checks and the meter. It returns the lease (when a concurrency slot was
// taken), the meter's result with its usage after the call, and whether
// the call was admitted. On an error (the meter's) nothing is charged.
func (c *core) charge(checks []limit.Check, m *limit.Meter, states []*counter, results []limit.Result, pl *guardPlan, now, cost int64, admit bool) (lease string, mr limit.MeterResult, admitted bool, err error) {
	var mt *algo.Meter
	var exp, mcost int64
	if m != nil {
		if mt, exp, mcost, mr, err = c.meterEval(m, pl.ms, now, cost); err != nil {
			return "", limit.MeterResult{}, false, err
		}
		admit = admit && mr.Allowed
	}
	if admit {
		lease = c.commit(checks, results, states, pl.idx, now, cost)
		if mt != nil {
			algo.MeterCharge(mt, mcost, exp)
		}
	}
	if mt != nil {
		mr.Usage, mr.Gen = mt.Live, mt.Gen
	}
	return lease, mr, admit, nil
}

// verdict is what the breaker counts of a call: nothing when the meter
// could not judge it (NeedSeed), else its denial or admission.
func verdict(mr limit.MeterResult, admit bool) algo.Verdict {
	switch {
	case mr.NeedSeed:
		return algo.Unjudged
	case !admit:
		return algo.Denied
	}
	return algo.Admitted
}

// releaseAll hands each check's state (states[i], in shard idx[i]; nil
// for none) back to its shard, which drops a counter that holds nothing
// (see shard.release). The shards must be locked.
func (c *core) releaseAll(checks []limit.Check, idx []int, states []*counter) {
	for i, st := range states {
		c.shards[idx[i]].release(checks[i].Key, st)
	}
}

// gate passes a call through the breaker of spec in shard bsi. It returns
// the breaker as read (br), whether the gate refused the call (deny) and,
// when it did, what the breaker says (bs).
func (c *core) gate(spec *limit.BreakerSpec, p algo.BreakerParams, bsi int, now int64) (br breakerRead, deny bool, bs limit.BreakerState) {
	br.b, br.held = c.shards[bsi].breaker(spec.Key, now)
	deny, _, br.probe = algo.BreakerGate(&br.b, p, now)
	if deny {
		// b is unchanged: BreakerBlocked says what the gate did
		bs = algo.BreakerView(&br.b, p, now, false)
		algo.BreakerBlocked(&bs, &br.b, now)
	}
	return br, deny, bs
}

// meterEval opens the meter m (creating it from its seed, which is no
// charge) in shard ms and evaluates a call of cost against its quota.
func (c *core) meterEval(m *limit.Meter, ms int, now, cost int64) (mt *algo.Meter, exp, mcost int64, mr limit.MeterResult, err error) {
	mcost = m.CostFor(cost)
	msh := &c.shards[ms]
	exp = expireUS(m.ExpireAt)
	mt, created, mst := algo.MeterOpen(msh.meter(m.Key, now), *m, now, exp)
	if mst == algo.MeterOK {
		mst = algo.MeterEval(mt, m.Quota, mcost)
	}
	if err := meterErr(mst); err != nil {
		return nil, 0, 0, limit.MeterResult{}, err
	}
	if created { // whatever the call decides: the Seed is no charge
		msh.putMeter(m.Key, mt)
	}
	return mt, exp, mcost, limit.MeterResult{Allowed: mst == algo.MeterOK, NeedSeed: mst == algo.MeterNeedSeed}, nil
}

// breakerAfter records the verdict v of a call on the breaker b of spec
// (held: b was in shard bsi before), counting its fingerprint in shard csi,
// and returns the breaker's state.
func (c *core) breakerAfter(spec *limit.BreakerSpec, p algo.BreakerParams, b algo.Breaker, v algo.Verdict, held, probe bool, now int64, bsi, csi int) limit.BreakerState {
	var calls algo.CallCounter
	if p.Identical > 0 {
		calls = c.shards[csi].calls(spec.IdenticalKey, now)
	}
	opened, counted := algo.BreakerAfter(&b, p, now, v, probe, &calls, spec.IdenticalKey)
	c.shards[bsi].putBreaker(spec.Key, b, spec, p, now, held)
	bs := algo.BreakerView(&b, p, now, opened)
	bs.Probe = probe && v == algo.Admitted
	if counted {
		c.shards[csi].putCalls(spec.IdenticalKey, calls)
		bs.Identical = calls.N
	}
	return bs
}

// ReportOutcome records the outcome of a call the breaker b admitted:
// failed counts toward ConsecutiveFailures (the threshold opens a closed
// breaker) or, with probe on a half-open breaker, reopens it for twice its
// cooldown (at most MaxCooldown); a success resets the count and, with
// probe on a half-open breaker, closes it. On a breaker another call opened
// meanwhile it only updates the counts. The result's Open and RetryAfter
// say whether a call made now would be denied, and for how long; Opened
// that this report opened the breaker. Errors: ctx.Err(),
// limit.ErrInvalidBreaker.
func (s *Store) ReportOutcome(ctx context.Context, b limit.BreakerSpec, failed, probe bool) (limit.BreakerState, error) {
	return s.c.updateBreaker(ctx, b, func(st *algo.Breaker, p algo.BreakerParams, now int64) bool {
		return algo.BreakerReport(st, p, now, failed, probe)
	})
}

// AddDenials counts n denials answered without the store (1 <= n <=
// limit.MaxBreakerCount) toward ConsecutiveDenials: reaching the threshold
// opens a closed breaker. The result is as ReportOutcome's. Errors:
// ctx.Err(), limit.ErrInvalidBreaker.
func (s *Store) AddDenials(ctx context.Context, b limit.BreakerSpec, n int64) (limit.BreakerState, error) {
	if err := limit.ValidateDenials(n); err != nil {
		return limit.BreakerState{}, err
	}
	return s.c.updateBreaker(ctx, b, func(st *algo.Breaker, p algo.BreakerParams, now int64) bool {
		return algo.BreakerAddDenials(st, p, now, n)
	})
}

// updateBreaker applies f to the breaker of spec under its shard's lock.
func (c *core) updateBreaker(ctx context.Context, spec limit.BreakerSpec, f func(*algo.Breaker, algo.BreakerParams, int64) bool) (limit.BreakerState, error) {
	if err := ctx.Err(); err != nil {
		return limit.BreakerState{}, err
	}
	if err := limit.ValidateBreaker(spec); err != nil {
		return limit.BreakerState{}, err
	}
	p := algo.Params(spec)
	sh := &c.shards[c.shardOf(spec.Key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := sh.at(c.now())
	b, held := sh.breaker(spec.Key, now)
	opened := f(&b, p, now)
	sh.putBreaker(spec.Key, b, &spec, p, now, held)
	st := algo.BreakerView(&b, p, now, opened)
	algo.BreakerBlocked(&st, &b, now)
	return st, nil
}

// ReleaseProbe frees the lease of the probe in flight of the half-open
// breaker b (its lease ends now), so that the next call becomes the probe;
// any other breaker, or one the store does not hold, is left as it is.
// Errors: ctx.Err(), limit.ErrInvalidBreaker.
func (s *Store) ReleaseProbe(ctx context.Context, b limit.BreakerSpec) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := limit.ValidateBreaker(b); err != nil {
		return err
	}
	c := s.c
	sh := &c.shards[c.shardOf(b.Key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := sh.at(c.now())
	if st, held := sh.breaker(b.Key, now); held && algo.BreakerReleaseProbe(&st, now) {
		sh.putBreaker(b.Key, st, &b, algo.Params(b), now, held)
	}
	return nil
}

// ListBreakers calls fn with every open or half-open breaker, in no
// particular order. Each shard is read under its lock and fn is called
// after the lock is released, so fn may call the store. A breaker changed
// while the listing runs may be reported as it was, or not at all. It stops
// at the first error of fn, or when ctx is done, and returns that error.
func (s *Store) ListBreakers(ctx context.Context, fn func(limit.BreakerInfo) error) error {
	c := s.c
	var batch []limit.BreakerInfo
	for i := range c.shards {
		if err := ctx.Err(); err != nil {
			return err
		}
		sh := &c.shards[i]
		batch = batch[:0]
		sh.mu.Lock()
		if sh.br != nil {
			now := sh.at(c.now())
			for k, b := range sh.br.states {
				if b.ExpiresAt <= now {
					continue
				}
				if info, ok := algo.BreakerInfo(k, b, toTime); ok {
					batch = append(batch, info)
				}
			}
		}
		sh.mu.Unlock()
		for _, info := range batch {
			if err := fn(info); err != nil {
				return err
			}
		}
	}
	return nil
}

// toTime converts the store's µs to a time.
func toTime(us int64) time.Time { return Epoch.Add(time.Duration(us) * time.Microsecond) }

// ResetBreaker closes the breaker key: its state is deleted (counts,
// cooldown), and so is the identical-calls counter that opened it, if one
// did (other fingerprints' counters run out with their windows). It
// reports whether the store held the breaker. Errors: ctx.Err(),
// limit.ErrInvalidBreaker (empty key).
func (s *Store) ResetBreaker(ctx context.Context, key string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if key == "" {
		return false, limit.ErrInvalidBreaker
	}
	c := s.c
	sh := &c.shards[c.shardOf(key)]
	sh.mu.Lock()
	b, held := sh.breaker(key, sh.at(c.now()))
	if held {
		delete(sh.br.states, key)
	}
	sh.mu.Unlock()
	if b.CallKey != "" {
		csh := &c.shards[c.shardOf(b.CallKey)]
		csh.mu.Lock()
		if csh.br != nil {
			delete(csh.br.calls, b.CallKey)
		}
		csh.mu.Unlock()
	}
	return held, nil
}
