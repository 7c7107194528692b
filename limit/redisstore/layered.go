package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// Global rules (limit.Request.Global). Their counters live in their own
// slot (keyspace's PerGlobal keys share one hash tag), apart from the
// tenant's. Evaluate decides them with the rest of the request,
// all-or-nothing:
//
//   - in one call of the library where one call can hold every key: on a
//     standalone server (or Sentinel: one master), and on a Cluster when
//     the global keys hash to the tenant's slot. The call evaluates the
//     tenant checks, the global checks and the meter without writing, and
//     charges them all only if all admit; the breaker counts a denial by a
//     global rule like any other. Atomic: no other caller ever sees part of
//     the request charged.
//   - on a Cluster with the global keys in another slot (the usual case),
//     in two calls sent together in one pipeline (rueidis DoMulti: one
//     round trip to each of the two nodes, at the same time): the tenant's
//     (checks, meter, breaker) and the global checks'. Each is
//     all-or-nothing on its own. When one admits and the other denies (or
//     fails), the half that admitted is given back at once, in one more
//     pipeline to its node: the tenant half's counters are refunded
//     (Refund), its meter charge too (Refunded and RefundedCalls; with
//     the meter's op, by an undo that applies once, see undoMeter), the
//     half-open probe it took is released (ReleaseProbe), and the breaker
//     counts the denial (AddDenials, with the count the tenant call reset
//     restored first); the global half's
//     counters are refunded. A refund carries its half's take time (the
//     clock of the first call), and gives back the units that take
//     charged whatever other callers took meanwhile: a sliding window's
//     units of that time, not its newest; a sliding window counter's
//     count of the take's window, the previous one once the window turned
//     (refundAt, algo.RefundAt). Between the first call's execution and the
//     refund's (about one round trip, at most the store's Timeout) another
//     caller can see that half charged, and be denied by it; the refunded
//     request itself is never admitted. One difference remains with the
//     one-call path: an identical-calls count the tenant call added is
//     kept. A refund that fails is logged (Options.Logger) and leaves the
//     counters charged by one request, as a Refund call would; but the
//     concurrency slots it would have freed are released in the
//     background, as a failed call's are (releaseLost), not held for the
//     lease's period, and a meter undo that applies once (the meter has an
//     op) is sent again in the background until it gets an answer or the
//     op's marker expires (undoLost), so the refused request is not
//     billed. When one half denies and the other fails (its node down or
//     past the deadline), the request is denied, not failed: a node's
//     denial is known whatever became of the other half, and an error
//     would have the caller apply its failure policy, which admits the
//     call when open (a tenant over its limit admitted whenever the global
//     rules' master is down). The failed half may have run: its
//     concurrency slots are released in the background (releaseLost), a
//     tenant half's meter charge with the meter's op is undone in the
//     background (undoLost, which gives nothing back when the take never
//     ran), and its counters keep what it may have charged (a refund of a
//     take that never ran would give back other callers' units); see
//     deniedByGlobal for the outcome then. Only when no half denied is
//     the request answered with an error.

// layered is Evaluate for a request with global checks.
func (s *Store) layered(ctx context.Context, req limit.Request) (limit.Outcome, error) {
	same, err := validateLayered(req)
	if err != nil {
		return limit.Outcome{}, fmt.Errorf("redisstore: evaluate: %w", err)
	}
	tenantless := len(req.Checks) == 0 && req.Meter == nil && req.Breaker == nil
	if !s.cluster || same || tenantless {
		o, _, err := s.evaluate(ctx, req)
		return o, err
	}
	return s.split(ctx, req)
}

// validateLayered is limit.ValidateRequest plus: the tenant's keys
// (checks, meter, breaker) in one slot, the global keys in one slot. same
// reports that the two are one slot.
func validateLayered(req limit.Request) (same bool, err error) {
	if err := limit.ValidateRequest(req); err != nil {
		return false, err
	}
	var tenant []string
	for _, c := range req.Checks {
		tenant = append(tenant, c.Key)
	}
	if req.Meter != nil {
		tenant = append(tenant, req.Meter.Key)
	}
	if req.Breaker != nil {
		tenant = append(tenant, req.Breaker.Key)
		if req.Breaker.IdenticalKey != "" {
			tenant = append(tenant, req.Breaker.IdenticalKey)
		}
	}
	gslot := keyspace.Slot(req.Global[0].Key)
	for _, c := range req.Global[1:] {
		if keyspace.Slot(c.Key) != gslot {
			return false, fmt.Errorf("%w: global checks %q and %q", ErrCrossSlot, req.Global[0].Key, c.Key)
		}
	}
	if len(tenant) == 0 {
		return true, nil
	}
	slot := keyspace.Slot(tenant[0])
	for _, k := range tenant[1:] {
		if keyspace.Slot(k) != slot {
			return false, fmt.Errorf("%w: %q and %q", ErrCrossSlot, tenant[0], k)
		}
	}
	return slot == gslot, nil
}

// split is Evaluate for a request whose global keys are in another Cluster
// slot than the tenant's: the two calls go out together, and the half that
// admitted is given back when the other did not.
func (s *Store) split(ctx context.Context, req limit.Request) (limit.Outcome, error) {
	wrap := func(err error) error { return fmt.Errorf("redisstore: evaluate: %w", err) }
	var lease string
	if hasConcurrency(req.Checks) || hasConcurrency(req.Global) {
		lease = newLease() // one lease for both halves: Release takes either set
	}
	tenant := req
	tenant.Global = nil
	tb, gb := batches.Get().(*batch), batches.Get().(*batch)
	defer tb.release()
	defer gb.release()
	s.request(tb, tenant, req.Checks, lease)
	gb.build(opTake, s.offset.Load(), req.Global, req.Cost, lease)
	arrs, errs := s.execMulti(ctx, tb, gb)

	// tnow and gnow are the halves' take times: their refunds give back
	// the units those takes charged (refundAt)
	var t limit.Outcome
	var tnow, before int64
	terr := errs[0]
	if terr == nil {
		t, tnow, before, terr = parseReply(tenant, len(req.Checks), lease, arrs[0])
	}
	var gres []limit.Result
	var gnow int64
	gerr := errs[1]
	if gerr == nil {
		if len(arrs[1]) != 1+4*len(req.Global) {
			gerr = fmt.Errorf("%w: %d values for %d checks", errReply, len(arrs[1]), len(req.Global))
		} else {
			gnow, gres, gerr = parseResults(arrs[1], len(req.Global))
		}
	}
	if terr != nil {
		s.releaseLost(lease, req.Checks)
	}
	if gerr != nil {
		s.releaseLost(lease, req.Global)
	}
	tAdmit := terr == nil && t.Decision.Allowed
	gAdmit := gerr == nil && limit.Combine(req.Global, gres, lease).Allowed
	bg := context.WithoutCancel(ctx) // a refund is owed even if the caller gave up
	if tAdmit && !gAdmit {
		s.undoTenant(bg, req, &t, lease, tnow, before)
	}
	if gAdmit && !tAdmit {
		s.refundCharged(bg, req.Global, gres, req.Cost, lease, gnow)
	}
	switch {
	case terr != nil && gerr == nil && !gAdmit:
		return s.deniedByGlobal(req, gres, terr), nil
	case gerr != nil && terr == nil && !tAdmit:
		s.log.Warn("split request denied by its tenant half; its global half failed: its global counters may keep this request", "err", gerr)
		return limit.Outcome{Decision: t.Decision, Meter: t.Meter, Breaker: t.Breaker}, nil
	case terr != nil:
		return limit.Outcome{}, wrap(terr)
	case gerr != nil:
		return limit.Outcome{}, wrap(gerr)
	}
	n := len(req.Checks)
	results := make([]limit.Result, n+len(req.Global))
	gated := req.Breaker != nil && t.Breaker.Open
	if !gated {
		copy(results, t.Decision.Results)
		copy(results[n:], gres)
	}
	d, g, byGlobal := limit.Decision{}, limit.Decision{}, false
	if gated {
		d, g, byGlobal = limit.Decision{Results: results[:n:n]}, limit.Decision{Results: results[n:]}, false
	} else {
		d, g, byGlobal = limit.CombineRequest(req, results, lease, t.Meter.Allowed)
	}
	return limit.Outcome{Decision: d, Global: g, GlobalDecides: byGlobal, Meter: t.Meter, Breaker: t.Breaker}, nil
}

// deniedByGlobal is the outcome of split request req whose global half
// denied (its results gres) while its tenant half failed (terr): a denial
// a node gave, which stands whatever became of the other half; answered
// with terr, the request would be decided by the caller's failure policy,
// which admits it when open. Nothing is known of the tenant half: the
// outcome's Decision is the global checks' with no tenant Results, and its
// Meter and Breaker are zero. What the tenant half may have taken is given
// back where that can be done safely: its concurrency slots are released
// (split did, releaseLost), and its meter charge, with the meter's op, is
// undone in the background (undoLost: the undo applies once, and nothing
// when the take never ran). Its counters keep what it may have charged: a
// refund of a take that never ran would give back other callers' units.
func (s *Store) deniedByGlobal(req limit.Request, gres []limit.Result, terr error) limit.Outcome {
	g := limit.Combine(req.Global, gres, "")
	d := g
	d.Results = nil
	if m := req.Meter; m != nil && m.Op != "" {
		s.log.Warn("split request denied by its global half; its tenant half failed: its meter charge, if it landed, is undone in the background", "tenant", m.Tenant, "op", m.Op, "err", terr)
		s.undoLost(*m, req.Cost)
	} else {
		s.log.Warn("split request denied by its global half; its tenant half failed: its tenant counters (and meter) may keep this request", "err", terr)
	}
	return limit.Outcome{Decision: d, Global: g, GlobalDecides: true}
}

// refundCharged gives back what an admitted half, taken at taken (its
// take's clock), charged: the checks whose result allowed (a denying
// shadow check charged nothing), of the units that take charged.
func (s *Store) refundCharged(ctx context.Context, checks []limit.Check, results []limit.Result, cost int64, lease string, taken int64) {
	charged := make([]limit.Check, 0, len(checks))
	for i, c := range checks {
		if results[i].Allowed {
			charged = append(charged, c)
		}
	}
	if len(charged) == 0 {
		return
	}
	if _, err := s.refundAt(ctx, charged, cost, lease, taken); err != nil {
		s.log.Warn("refund of an admitted half failed: its counters keep this request", "err", err)
		s.releaseLost(lease, charged) // a slot would stay taken for the lease's period
	}
}

// undoTenant gives back what the admitted tenant half t of req, taken at
// taken (its take's clock), charged, in one pipeline to the tenant's node:
// its counters (the units that take charged), its meter charge,
// the half-open probe it took; and it has the breaker count the denial,
// with the denials count the call reset (before) restored. It updates t's
// meter usage and breaker state to what the undo left. A step that fails
// is logged and leaves what it would have given back charged, but for the
// steps that can be sent again: releasing a lease is idempotent, so the
// concurrency slots the request took are released in the background
// (releaseLost) rather than held for the lease's period, and the meter's
// undo with an op applies once, so it is sent again (undoLost).
func (s *Store) undoTenant(ctx context.Context, req limit.Request, t *limit.Outcome, lease string, taken, before int64) {
	bs, at := s.undoBatches(req, t, lease, taken, before)
	defer releaseBatches(bs)
	if len(bs) == 0 {
		return
	}
	arrs, errs := s.execMulti(ctx, bs...)
	for i, err := range errs {
		if err != nil {
			switch {
			case i == at.refund:
				s.releaseLost(lease, req.Checks)
			case i == at.adjust && req.Meter.Op != "":
				s.log.Warn("undoing the meter charge of an admitted tenant half failed: it is sent again", "tenant", req.Meter.Tenant, "op", req.Meter.Op, "err", err)
				s.undoLost(*req.Meter, req.Cost)
				continue
			}
			s.log.Warn("undoing an admitted tenant half failed: it keeps this request", "err", err)
			continue
		}
		switch i {
		case at.adjust:
			if mr, ok := undoneMeter(arrs[i]); ok {
				t.Meter.Usage = mr.Usage
			}
		case at.denials:
			if st, ok := undoneBreaker(arrs[i], t.Breaker.Opened); ok {
				t.Breaker = st
			}
		}
	}
}

// undoSteps says where, in the undo pipeline of a tenant half, are the
// counters' refund (whose failure leaves slots to release), and the steps
// whose replies update the outcome: the meter's adjustment and the
// breaker's denial; -1 for a step not sent.
type undoSteps struct{ refund, adjust, denials int }

// undoBatches builds undoTenant's pipeline, in the order it is sent: the
// refund of the checks of req that t charged (those whose result allowed),
// of the units its take at taken charged, the meter's charge given back
// (Refunded, RefundedCalls), the release of the probe t took, and the
// breaker's denial, counted over before (the denials count the call reset).
// A part of req that has nothing to give back sends nothing. The caller
// releases the batches.
func (s *Store) undoBatches(req limit.Request, t *limit.Outcome, lease string, taken, before int64) ([]*batch, undoSteps) {
	var bs []*batch
	add := func() *batch {
		b := batches.Get().(*batch)
		bs = append(bs, b)
		return b
	}
	var charged []limit.Check
	for i, c := range req.Checks {
		if t.Decision.Results[i].Allowed {
			charged = append(charged, c)
		}
	}
	at := undoSteps{refund: -1, adjust: -1, denials: -1}
	if len(charged) > 0 {
		at.refund = len(bs)
		add().refund(s.offset.Load(), charged, req.Cost, lease, taken)
	}
	if m := req.Meter; m != nil {
		at.adjust = len(bs)
		s.undoMeter(add(), m, req.Cost)
	}
	if sp := req.Breaker; sp != nil {
		if t.Breaker.Probe {
			b := add()
			b.build(opReleaseProbe, s.offset.Load(), nil, 0, "")
			b.keys = append(b.keys, sp.Key)
			b.breaker(sp)
		}
		at.denials = len(bs)
		b := add()
		b.build(opAddDenials, s.offset.Load(), nil, 0, "")
		b.keys = append(b.keys, sp.Key)
		b.breaker(sp)
		b.nums(min(before+1, limit.MaxBreakerCount))
	}
	return bs, at
}

// releaseBatches returns bs to their pool.
func releaseBatches(bs []*batch) {
	for _, b := range bs {
		b.release()
	}
}

// undoMeter builds into b the give-back of the meter charge a take of m
// charged for cost (Refunded, RefundedCalls). With m's op, it is the
// script's undo (limit.lua, 'U'): it gives the charge back only while the
// op's marker is the take's, and deletes the marker with it, so it applies
// once however often it is sent, and placing the op again (the engine
// does, when the global half failed rather than denied) charges it
// afresh rather than finding it done; placed before the undo ran, the op
// keeps the take's charge and the undo gives nothing back.
func (s *Store) undoMeter(b *batch, m *limit.Meter, cost int64) {
	if m.Op == "" {
		b.build(opAdjust, s.offset.Load(), nil, 0, "")
	} else {
		b.build(opUndoMetered, s.offset.Load(), nil, 0, "")
	}
	b.meter(m, 0)
	b.nums(0, m.CostFor(cost), 0, 1) // the delta: Refunded, RefundedCalls
	bare := *m
	bare.Replay = nil // no replay guard: the marker decides
	b.opTail(&bare)
}

// undoLost sends, in the background, the undo of the take of m for cost
// by a denied split request: the take landed and its undo's send failed
// or its reply was lost, or the take's own reply was lost (it may have
// landed). The undo applies once, and nothing where the take left no
// marker, so the denied request is not billed. It tries until the op's
// marker has expired (limit.OpTTL), after which there is nothing left to
// undo, waiting twice as long after each failure, and stops when the store
// closes. The caller logs why.
func (s *Store) undoLost(m limit.Meter, cost int64) {
	horizon := time.Now().Add(limit.OpTTL)
	s.retryLost(s.timeout, func(wait time.Duration, err error) (time.Duration, bool) {
		if err == nil {
			return 0, false
		}
		if time.Now().Add(2 * wait).After(horizon) {
			s.log.Warn("undoing the meter charge of a denied split request failed again: a charge it made stays billed", "tenant", m.Tenant, "op", m.Op, "err", err)
			return 0, false
		}
		return 2 * wait, true
	}, func(ctx context.Context) error {
		b := batches.Get().(*batch)
		s.undoMeter(b, &m, cost)
		_, err := s.exec(ctx, b)
		b.release()
		return err
	})
}

// undoneMeter parses the reply of the undo's meter adjustment; ok is false
// when the reply is not a meter's.
func undoneMeter(arr []rueidis.RedisMessage) (mr limit.MeterResult, ok bool) {
	if len(arr) != 1+meterLen {
		return limit.MeterResult{}, false
	}
	mr, err := meterResult(arr[1:])
	return mr, err == nil
}

// undoneBreaker parses the reply of the undo's AddDenials into the breaker
// state the undone request reports (ok is false when the reply is not a
// breaker's): its gate did not deny it and its probe, if any, was
// released, so Open, HalfOpen and Probe are false; Opened says whether
// the request's call (opened) or the denial counted opened the breaker,
// and RetryAfter is kept only then.
func undoneBreaker(arr []rueidis.RedisMessage, opened bool) (st limit.BreakerState, ok bool) {
	if len(arr) != 1+blockLen {
		return limit.BreakerState{}, false
	}
	st, err := parseBlock(arr[1:])
	if err != nil {
		return limit.BreakerState{}, false
	}
	opened = opened || st.Opened
	st.Open, st.HalfOpen, st.Probe, st.Opened = false, false, false, opened
	if !opened {
		st.RetryAfter = 0
	}
	return st, true
}
