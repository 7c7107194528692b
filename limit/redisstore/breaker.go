package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/internal/algo"
)

// Loop breakers (limit.GuardedStore). A breaker is a hash (keyspace.Breaker)
// and each call fingerprint it counts a string (keyspace.BreakerCall), both
// in the tenant's slot; breaker.lua, spliced into the one script, ports
// limit/internal/algo's breaker functions and documents the layout. A call
// with a breaker is still one EVALSHA: the script reads the breaker first
// (an open one denies before anything else is read), evaluates the checks
// and the meter as Take and TakeMetered do, then counts the call. Every key
// written gets its TTL in that script.

// scriptEpoch is the origin of the scripts' clock.
var scriptEpoch = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// blockLen is the length of the breaker's part of a reply.
const blockLen = 9

// opReleaseProbe is the script's op that frees a probe's lease.
const opReleaseProbe = "p"

// Evaluate is Take (no meter) or TakeMetered (a meter) with an optional loop
// breaker, in one script. Without a breaker it is exactly those calls, with
// the same KEYS and ARGV. With one, the breaker's key and its
// identical-calls key (when set) must share the checks' slot (ErrCrossSlot,
// before any I/O), and:
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
// Errors: those of Take and TakeMetered, and limit.ValidateRequest's. As
// with Take, a call that timed out may have been applied, once.
func (s *Store) Evaluate(ctx context.Context, req limit.Request) (limit.Outcome, error) {
	if req.Breaker == nil && len(req.Global) == 0 {
		if req.Meter == nil {
			d, err := s.Take(ctx, req.Checks, req.Cost)
			return limit.Outcome{Decision: d}, err
		}
		d, mr, err := s.TakeMetered(ctx, req.Checks, *req.Meter, req.Cost)
		return limit.Outcome{Decision: d, Meter: mr}, err
	}
	if len(req.Global) > 0 {
		return s.layered(ctx, req)
	}
	o, _, err := s.evaluate(ctx, req)
	return o, err
}

// evaluate is Evaluate in one call, returning the script's clock too (for
// tests): every key of req, global checks included, must be in one slot
// (a standalone server, or a Cluster whose global keys share the tenant's
// slot; the caller checks).
func (s *Store) evaluate(ctx context.Context, req limit.Request) (limit.Outcome, int64, error) {
	wrap := func(err error) error { return fmt.Errorf("redisstore: evaluate: %w", err) }
	if len(req.Global) == 0 {
		if err := validateRequest(req); err != nil {
			return limit.Outcome{}, 0, wrap(err)
		}
	}
	checks := req.Checks
	if len(req.Global) > 0 {
		checks = make([]limit.Check, 0, len(req.Checks)+len(req.Global))
		checks = append(append(checks, req.Checks...), req.Global...)
	}
	var lease string
	if hasConcurrency(checks) {
		lease = newLease()
	}
	b := batches.Get().(*batch)
	defer b.release()
	s.request(b, req, checks, lease)
	arr, err := s.exec(ctx, b)
	if err != nil {
		s.releaseLost(lease, checks)
		return limit.Outcome{}, 0, wrap(err)
	}
	o, now, err := parseOutcome(req, len(checks), lease, arr)
	if err != nil {
		return limit.Outcome{}, 0, wrap(err)
	}
	return o, now, nil
}

// request lays out in b the call of the library that decides req with
// checks (its tenant checks, followed by its global ones when they go in
// the same call), its meter and its breaker.
func (s *Store) request(b *batch, req limit.Request, checks []limit.Check, lease string) {
	op := opTake
	switch {
	case req.Breaker != nil && req.Meter != nil:
		op = opTakeMeteredBreaker
	case req.Breaker != nil:
		op = opTakeBreaker
	case req.Meter != nil:
		op = opTakeMetered
	}
	b.build(withOp(op, req.Meter), s.offset.Load(), checks, req.Cost, lease)
	if req.Meter != nil {
		b.meter(req.Meter, req.Meter.CostFor(req.Cost))
	}
	if req.Breaker != nil {
		b.keys = append(b.keys, req.Breaker.Key)
		if req.Breaker.IdenticalKey != "" {
			b.keys = append(b.keys, req.Breaker.IdenticalKey)
		}
		b.breaker(req.Breaker)
	}
	b.opTail(req.Meter) // last (see opTail)
}

// parseOutcome reads the reply of a call laid out by request, with n
// checks (tenant and global).
func parseOutcome(req limit.Request, n int, lease string, arr []rueidis.RedisMessage) (limit.Outcome, int64, error) {
	o, now, _, err := parseReply(req, n, lease, arr)
	return o, now, err
}

// parseReply is parseOutcome also returning the breaker's denials count
// before the call (0 without a breaker).
func parseReply(req limit.Request, n int, lease string, arr []rueidis.RedisMessage) (limit.Outcome, int64, int64, error) {
	if len(arr) < 1 {
		return limit.Outcome{}, 0, 0, fmt.Errorf("%w: empty reply", errReply)
	}
	now, err := arr[0].AsInt64()
	if err != nil {
		return limit.Outcome{}, 0, 0, fmt.Errorf("%w: %w", errReply, err)
	}
	var bs limit.BreakerState
	var before int64
	tail := 0
	if req.Breaker != nil {
		tail = blockLen + 1
		if len(arr) < 1+tail {
			return limit.Outcome{}, 0, 0, fmt.Errorf("%w: %d values", errReply, len(arr))
		}
		if bs, err = parseBlock(arr[len(arr)-tail : len(arr)-1]); err != nil {
			return limit.Outcome{}, 0, 0, err
		}
		if before, err = arr[len(arr)-1].AsInt64(); err != nil {
			return limit.Outcome{}, 0, 0, fmt.Errorf("%w: %w", errReply, err)
		}
	}
	results := make([]limit.Result, n)
	if req.Breaker != nil && len(arr) == 1+tail && bs.Open {
		// The breaker denied the call; nothing else was read.
		d, g, _ := algo.RequestDecisions(req, results, "", false, true)
		return limit.Outcome{Decision: d, Global: g, Breaker: bs}, now, before, nil
	}
	want := 1 + 4*n + tail
	if req.Meter != nil {
		want += meterLen
	}
	if len(arr) != want {
		return limit.Outcome{}, 0, 0, fmt.Errorf("%w: %d values for %d checks", errReply, len(arr), n)
	}
	if n > 0 {
		if _, results, err = parseResults(arr, n); err != nil {
			return limit.Outcome{}, 0, 0, err
		}
	}
	var mr limit.MeterResult
	if req.Meter != nil {
		if mr, err = meterResult(arr[1+4*n:]); err != nil {
			return limit.Outcome{}, 0, 0, err
		}
	}
	d, g, byGlobal := algo.RequestDecisions(req, results, lease, mr.Allowed, false)
	return limit.Outcome{Decision: d, Global: g, GlobalDecides: byGlobal, Meter: mr, Breaker: bs}, now, before, nil
}

// parseBlock reads the breaker's part of a reply (breaker.lua).
func parseBlock(arr []rueidis.RedisMessage) (limit.BreakerState, error) {
	var v [blockLen]int64
	var reason string
	for i := range v {
		var err error
		if i == 4 {
			reason, err = arr[i].ToString()
		} else {
			v[i], err = arr[i].AsInt64()
		}
		if err != nil {
			return limit.BreakerState{}, fmt.Errorf("%w: breaker value %d: %w", errReply, i, err)
		}
	}
	return limit.BreakerState{
		Open:       v[0] == 1 || v[0] == 2,
		HalfOpen:   v[0] == 2,
		RetryAfter: dur(v[1]),
		Probe:      v[2] == 1,
		Opened:     v[3] == 1,
		Reason:     reason,
		Denials:    v[5],
		Failures:   v[6],
		Identical:  v[7],
		Cooldown:   dur(v[8]),
	}, nil
}

// validateRequest is limit.ValidateRequest plus: every key in one slot.
func validateRequest(req limit.Request) error {
	if err := limit.ValidateRequest(req); err != nil {
		return err
	}
	key := req.Breaker.Key
	slot := keyspace.Slot(key)
	same := func(k string) error {
		if keyspace.Slot(k) != slot {
			return fmt.Errorf("%w: breaker %q and %q", ErrCrossSlot, key, k)
		}
		return nil
	}
	if req.Breaker.IdenticalKey != "" {
		if err := same(req.Breaker.IdenticalKey); err != nil {
			return err
		}
	}
	if req.Meter != nil {
		if err := same(req.Meter.Key); err != nil {
			return err
		}
	}
	for _, c := range req.Checks {
		if err := same(c.Key); err != nil {
			return err
		}
	}
	return nil
}

// breaker appends the breaker block to ARGV (breaker.lua).
func (b *batch) breaker(sp *limit.BreakerSpec) {
	b.args = append(b.args, sp.Tenant, sp.Subject, sp.ID)
	p := algo.Params(*sp)
	b.nums(p.Denials, p.Failures, p.Identical, p.IdenticalWithin, p.Cooldown, p.MaxCooldown, p.ProbeLease)
}

// ReportOutcome records the outcome of a call the breaker b admitted, in
// one script: failed counts toward ConsecutiveFailures (the threshold
// opens a closed breaker) or, with probe on a half-open breaker, reopens it
// for twice its cooldown (at most MaxCooldown); a success resets the count
// and, with probe on a half-open breaker, closes it. On a breaker another
// call opened meanwhile it only updates the counts. The result's Open and
// RetryAfter say whether a call made now would be denied, and for how long;
// Opened that this report opened the breaker. Errors:
// limit.ErrInvalidBreaker, context.DeadlineExceeded or the client's error
// (the report may then have been applied, once).
func (s *Store) ReportOutcome(ctx context.Context, b limit.BreakerSpec, failed, probe bool) (limit.BreakerState, error) {
	return s.update(ctx, "report outcome", opReport, b, boolNum(failed), boolNum(probe))
}

// AddDenials counts n denials answered without the store (1 <= n <=
// limit.MaxBreakerCount) toward ConsecutiveDenials, in one script:
// reaching the threshold opens a closed breaker. The result and errors are
// as ReportOutcome's.
func (s *Store) AddDenials(ctx context.Context, b limit.BreakerSpec, n int64) (limit.BreakerState, error) {
	if err := limit.ValidateDenials(n); err != nil {
		return limit.BreakerState{}, fmt.Errorf("redisstore: add denials: %w", err)
	}
	return s.update(ctx, "add denials", opAddDenials, b, n)
}

// ReleaseProbe frees the lease of the probe in flight of the half-open
// breaker b (its lease ends now), in one script, so that the next call
// becomes the probe; any other breaker, or one Redis does not hold, is left
// as it is. Errors: limit.ErrInvalidBreaker, context.DeadlineExceeded or
// the client's error (the release may then have been applied, once).
func (s *Store) ReleaseProbe(ctx context.Context, b limit.BreakerSpec) error {
	_, err := s.update(ctx, "release probe", opReleaseProbe, b)
	return err
}

func boolNum(v bool) int64 {
	if v {
		return 1
	}
	return 0
}

// update runs op on the breaker of spec with the numbers tail.
func (s *Store) update(ctx context.Context, name, op string, spec limit.BreakerSpec, tail ...int64) (limit.BreakerState, error) {
	wrap := func(err error) error { return fmt.Errorf("redisstore: %s: %w", name, err) }
	if err := limit.ValidateBreaker(spec); err != nil {
		return limit.BreakerState{}, wrap(err)
	}
	b := batches.Get().(*batch)
	defer b.release()
	b.build(op, s.offset.Load(), nil, 0, "")
	b.keys = append(b.keys, spec.Key)
	b.breaker(&spec)
	b.nums(tail...)
	arr, err := s.exec(ctx, b)
	if err == nil && len(arr) != 1+blockLen {
		err = fmt.Errorf("%w: %d values", errReply, len(arr))
	}
	if err != nil {
		return limit.BreakerState{}, wrap(err)
	}
	st, err := parseBlock(arr[1:])
	if err != nil {
		return limit.BreakerState{}, wrap(err)
	}
	return st, nil
}

// ResetBreaker closes the breaker key: one script deletes its state
// (counts, cooldown), then the identical-calls counter that opened it, if
// one did, is deleted too (other fingerprints' counters run out with their
// windows). It reports whether Redis held the breaker. Errors:
// limit.ErrInvalidBreaker (empty key), context.DeadlineExceeded or the
// client's error.
func (s *Store) ResetBreaker(ctx context.Context, key string) (bool, error) {
	wrap := func(err error) error { return fmt.Errorf("redisstore: reset breaker: %w", err) }
	if key == "" {
		return false, wrap(fmt.Errorf("%w: empty key", limit.ErrInvalidBreaker))
	}
	b := batches.Get().(*batch)
	defer b.release()
	b.build(opResetBreaker, s.offset.Load(), nil, 0, "")
	b.keys = append(b.keys, key)
	arr, err := s.exec(ctx, b)
	if err == nil && len(arr) != 3 {
		err = fmt.Errorf("%w: %d values", errReply, len(arr))
	}
	if err != nil {
		return false, wrap(err)
	}
	held, err := arr[1].AsInt64()
	if err != nil {
		return false, wrap(fmt.Errorf("%w: %w", errReply, err))
	}
	if calls, _ := arr[2].ToString(); calls != "" {
		ctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		if err := s.client.Do(ctx, s.client.B().Del().Key(calls).Build()).Error(); err != nil {
			return held == 1, wrap(err)
		}
	}
	return held == 1, nil
}

// ListBreakers calls fn with every open or half-open breaker: it SCANs for
// keyspace.BreakerPattern on every master (skipping the identical-calls
// counters) and reads each breaker found with HGETALL, a page at a time. A
// breaker seen twice (a failover during the scan) is reported once; one
// changed or created during the scan may be reported as it was, or missed.
// The listing is bounded by ctx alone, not Options.Timeout. It stops at
// the first error of fn, of ctx or of Redis, and returns it.
func (s *Store) ListBreakers(ctx context.Context, fn func(limit.BreakerInfo) error) error {
	now, err := s.clock(ctx)
	if err != nil {
		return fmt.Errorf("redisstore: list breakers: %w", err)
	}
	seen := map[string]struct{}{}
	return s.scanMasters(ctx, keyspace.BreakerPattern, scanCount, "list breakers", func(keys []string) error {
		return s.readBreakers(ctx, now, keys, seen, fn)
	})
}

// clock is the scripts' clock: the server's TIME plus the offset.
func (s *Store) clock(ctx context.Context) (int64, error) {
	ctx, cancel := s.deadline(ctx)
	defer cancel()
	arr, err := s.client.Do(ctx, s.client.B().Time().Build()).AsStrSlice()
	if err != nil {
		return 0, err
	}
	if len(arr) != 2 {
		return 0, fmt.Errorf("%w: TIME gave %d values", errReply, len(arr))
	}
	sec, err1 := strconv.ParseInt(arr[0], 10, 64)
	usec, err2 := strconv.ParseInt(arr[1], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("%w: TIME gave %q", errReply, arr)
	}
	return (sec-scriptEpoch.Unix())*1_000_000 + usec + s.offset.Load(), nil
}

// readBreakers reads the breakers among keys not seen yet in one round trip
// and calls fn with the open and half-open ones.
func (s *Store) readBreakers(ctx context.Context, now int64, keys []string, seen map[string]struct{}, fn func(limit.BreakerInfo) error) error {
	// identical-calls counters share the breakers' prefix
	fresh, replies := s.readNew(ctx, keys, seen, func(k string) bool { return strings.Contains(k, ":call:") })
	toTime := func(us int64) time.Time { return scriptEpoch.Add(time.Duration(us) * time.Microsecond) }
	for i, r := range replies {
		h, err := r.AsStrMap()
		if wrongType(err) {
			continue // not a breaker
		}
		if err != nil {
			return fmt.Errorf("redisstore: list breakers: read %q: %w", fresh[i], err)
		}
		b, ok := parseBreaker(h)
		if !ok || b.ExpiresAt <= now {
			continue // gone meanwhile, past its expiry, or not ours
		}
		if info, ok := algo.BreakerInfo(fresh[i], &b, toTime); ok {
			if err := fn(info); err != nil {
				return err
			}
		}
	}
	return nil
}

// parseBreaker reads a breaker hash (breaker.lua); ok is false when it is
// empty or malformed.
func parseBreaker(h map[string]string) (algo.Breaker, bool) {
	if len(h) == 0 {
		return algo.Breaker{}, false
	}
	b := algo.Breaker{Reason: h["r"], Tenant: h["t"], Subject: h["sb"], ID: h["id"], CallKey: h["ik"]}
	var phase int64
	for _, f := range [...]struct {
		name string
		dst  *int64
	}{
		{"s", &phase}, {"u", &b.Until}, {"pu", &b.ProbeUntil}, {"cd", &b.Cooldown},
		{"d", &b.Denials}, {"f", &b.Failures}, {"ic", &b.Calls}, {"x", &b.ExpiresAt},
	} {
		v, err := strconv.ParseInt(h[f.name], 10, 64)
		if err != nil {
			return algo.Breaker{}, false
		}
		*f.dst = v
	}
	b.Phase = algo.Phase(phase)
	return b, true
}
