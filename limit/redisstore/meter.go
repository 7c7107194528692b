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

// Usage meters (limit.MeteredStore). A meter is a hash (keyspace.Usage) with
// short fields:
//
//	c, r, n, rn      live usage: charged, refunded, calls, refunded calls
//	fc, fr, fn, frn  the part recorded as flushed to the durable store
//	t, p             tenant and period
//
// TakeMetered, Adjust and MarkFlushed each run the one script (limit.lua)
// once, so each is atomic; TakeMetered charges the checks and the meter in
// the same script, which makes a quota exact across gateways. Every write of
// the live usage sets the key's expiry to Meter.ExpireAt with PEXPIREAT in
// that script. As with Take, a call that fails or times out may have been
// applied, once: it is never sent twice.

// scanCount is the COUNT hint of one SCAN page, and so the most meters read
// in one round trip.
const scanCount = 200

// TakeMetered is Take with the usage meter m, in one script: the checks
// (there may be none) and m's quota are evaluated together and, if every
// enforced check allows and Quota is 0 or Used()+mc <= Quota (mc is
// m.CostFor(cost): m.Cost when set, else cost), the checks are charged as
// Take charges them (cost units) and the meter by mc units and one call;
// otherwise nothing is charged. The decision is
// limit.CombineMetered's: when the quota alone denies, Decision.Rule is the
// zero Rule.
//
// A meter Redis does not hold (new period, data loss, expired) is first
// created from m.Seed when m.Seeded, with the Seed as both its live and its
// flushed usage, whatever the call decides then; when not Seeded, nothing
// is charged, MeterResult.NeedSeed is set and the decision is denied: call
// again with the durable total as Seed.
//
// The meter key must share the checks' hash tag (keyspace.Usage and the
// tenant's counters do): ErrCrossSlot otherwise, before any I/O. Other
// errors: those of Take, limit.ValidateMetered's, limit.ErrMeterExpired (the
// server's clock is at or past m.ExpireAt) and limit.ErrUsageOverflow, both
// with nothing charged. As with Take, a call that timed out may have been
// charged (checks and meter), once.
func (s *Store) TakeMetered(ctx context.Context, checks []limit.Check, m limit.Meter, cost int64) (limit.Decision, limit.MeterResult, error) {
	results, lease, mr, _, err := s.takeMetered(ctx, checks, m, cost)
	if err != nil {
		return limit.Decision{}, limit.MeterResult{}, err
	}
	return limit.CombineMetered(checks, results, lease, mr.Allowed), mr, nil
}

// takeMetered is TakeMetered returning the script's clock too (for tests).
func (s *Store) takeMetered(ctx context.Context, checks []limit.Check, m limit.Meter, cost int64) (results []limit.Result, lease string, mr limit.MeterResult, now int64, err error) {
	wrap := func(err error) error { return fmt.Errorf("redisstore: take metered: %w", err) }
	if err := validateMetered(checks, m, cost); err != nil {
		return nil, "", mr, 0, wrap(err)
	}
	if hasConcurrency(checks) {
		lease = newLease()
	}
	arr, err := s.runMeter(ctx, opTakeMetered, checks, cost, lease, &m, m.CostFor(cost))
	if err != nil {
		s.releaseLost(lease, checks)
		return nil, "", mr, 0, wrap(err)
	}
	n := len(checks)
	if len(arr) != 1+4*n+meterLen {
		return nil, "", mr, 0, wrap(fmt.Errorf("%w: %d values for %d checks and a meter", errReply, len(arr), n))
	}
	if now, results, err = parseResults(arr, n); err != nil {
		return nil, "", mr, 0, wrap(err)
	}
	if mr, err = meterResult(arr[1+4*n:]); err != nil {
		return nil, "", mr, 0, wrap(err)
	}
	return results, lease, mr, now, nil
}

// meterLen is the length of a meter's part of a reply: status, usage (4
// values), generation.
const meterLen = 6

// meterResult reads a meter's status, usage and generation (meterLen
// values) and turns the statuses that are errors into them.
func meterResult(arr []rueidis.RedisMessage) (limit.MeterResult, error) {
	var v [5]int64
	for i := range v {
		var err error
		if v[i], err = arr[i].AsInt64(); err != nil {
			return limit.MeterResult{}, fmt.Errorf("%w: %w", errReply, err)
		}
	}
	g, err := arr[5].ToString()
	if err != nil {
		return limit.MeterResult{}, fmt.Errorf("%w: generation: %w", errReply, err)
	}
	switch st := algo.MeterStatus(v[0]); st {
	case algo.MeterExpired:
		return limit.MeterResult{}, limit.ErrMeterExpired
	case algo.MeterOverflow:
		return limit.MeterResult{}, limit.ErrUsageOverflow
	case algo.MeterOK, algo.MeterDenied, algo.MeterNeedSeed, algo.MeterCovered:
		return limit.MeterResult{
			Allowed:  st == algo.MeterOK,
			NeedSeed: st == algo.MeterNeedSeed,
			Covered:  st == algo.MeterCovered,
			Usage:    limit.Usage{Charged: v[1], Refunded: v[2], Calls: v[3], RefundedCalls: v[4]},
			Gen:      parseGen(g),
		}, nil
	default:
		return limit.MeterResult{}, fmt.Errorf("%w: meter status %d", errReply, v[0])
	}
}

// parseGen reads a meter's generation field, "<id> <seed c> <seed r>
// <seed n> <seed rn>"; "" or a malformed field is the zero Generation.
func parseGen(g string) limit.Generation {
	f := strings.Fields(g)
	if len(f) != 5 {
		return limit.Generation{}
	}
	var v [4]int64
	for i := range v {
		n, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return limit.Generation{}
		}
		v[i] = n
	}
	return limit.Generation{ID: f[0], Seed: limit.Usage{Charged: v[0], Refunded: v[1], Calls: v[2], RefundedCalls: v[3]}}
}

// validateMetered is limit.ValidateMetered plus: every key, the meter's too,
// in one slot.
func validateMetered(checks []limit.Check, m limit.Meter, cost int64) error {
	if err := limit.ValidateMetered(checks, m, cost); err != nil {
		return err
	}
	slot := keyspace.Slot(m.Key)
	for _, c := range checks {
		if keyspace.Slot(c.Key) != slot {
			return fmt.Errorf("%w: meter %q and check %q", ErrCrossSlot, m.Key, c.Key)
		}
	}
	return nil
}

// Adjust adds delta to the meter m.Key, in one script, with no quota check
// (a corrected cost is owed whatever the quota), and sets its expiry to
// m.ExpireAt. A meter Redis does not hold is created from m.Seed first when
// m.Seeded; when not, nothing changes and the result has NeedSeed.
// MeterResult.Allowed reports that delta was applied; Usage is the counter
// after it.
//
// Errors (nothing changed, except after a timeout, as with Take):
// limit.ErrInvalidMeter (a field of delta negative or above
// limit.MaxUsage, or an invalid m), limit.ErrMeterExpired,
// limit.ErrUsageOverflow, context.DeadlineExceeded or the client's error.
func (s *Store) Adjust(ctx context.Context, m limit.Meter, delta limit.Usage) (limit.MeterResult, error) {
	wrap := func(err error) error { return fmt.Errorf("redisstore: adjust: %w", err) }
	if err := limit.ValidateMeter(m, 1); err != nil {
		return limit.MeterResult{}, wrap(err)
	}
	if err := limit.ValidateUsage(delta); err != nil {
		return limit.MeterResult{}, wrap(fmt.Errorf("delta: %w", err))
	}
	if err := limit.ValidateOp(m, delta); err != nil {
		return limit.MeterResult{}, wrap(err)
	}
	arr, err := s.runMeter(ctx, opAdjust, nil, 0, "", &m, 0, delta.Charged, delta.Refunded, delta.Calls, delta.RefundedCalls)
	if err != nil {
		return limit.MeterResult{}, wrap(err)
	}
	if len(arr) != 1+meterLen {
		return limit.MeterResult{}, wrap(fmt.Errorf("%w: %d values", errReply, len(arr)))
	}
	mr, err := meterResult(arr[1:])
	if err != nil {
		return limit.MeterResult{}, wrap(err)
	}
	return mr, nil
}

// ReadMeter returns the meter key's live usage and the part marked flushed,
// with one HGETALL under the store's timeout; ok is false when Redis holds
// no such key.
func (s *Store) ReadMeter(ctx context.Context, key string) (limit.MeterState, bool, error) {
	if key == "" {
		return limit.MeterState{}, false, fmt.Errorf("redisstore: read meter: %w: empty key", limit.ErrInvalidMeter)
	}
	ctx, cancel := s.deadline(ctx)
	defer cancel()
	h, err := s.client.Do(ctx, s.client.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		return limit.MeterState{}, false, fmt.Errorf("redisstore: read meter %q: %w", key, err)
	}
	if len(h) == 0 {
		return limit.MeterState{}, false, nil
	}
	ms, err := parseMeter(key, h)
	if err != nil {
		return limit.MeterState{}, false, fmt.Errorf("redisstore: read meter: %w", err)
	}
	return ms, true, nil
}

// parseMeter reads a meter hash; a missing number field is 0.
func parseMeter(key string, h map[string]string) (limit.MeterState, error) {
	ms := limit.MeterState{Key: key, Tenant: h["t"], Period: h["p"], Gen: parseGen(h["g"])}
	for _, f := range [...]struct {
		name string
		dst  *int64
	}{
		{"c", &ms.Live.Charged}, {"r", &ms.Live.Refunded}, {"n", &ms.Live.Calls}, {"rn", &ms.Live.RefundedCalls},
		{"fc", &ms.Flushed.Charged}, {"fr", &ms.Flushed.Refunded}, {"fn", &ms.Flushed.Calls}, {"frn", &ms.Flushed.RefundedCalls},
	} {
		v, ok := h[f.name]
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return limit.MeterState{}, fmt.Errorf("%w: meter %q field %s: %q", errReply, key, f.name, v)
		}
		*f.dst = n
	}
	return ms, nil
}

// MarkFlushed records that the durable store holds at least u, read from
// generation gen, for the meter key, in one script: the flushed part
// becomes its field-by-field maximum with u, so a late or repeated call
// never lowers it. It neither creates a meter Redis does not hold nor
// changes its expiry. Errors: limit.ErrInvalidMeter (empty key, a field of
// u out of range), limit.ErrMeterReplaced (the counter is of another
// generation: nothing recorded), limit.ErrMeterMissing (no counter: it
// expired, or Redis lost it, since it was read),
// context.DeadlineExceeded or the client's error.
func (s *Store) MarkFlushed(ctx context.Context, key, gen string, u limit.Usage) error {
	wrap := func(err error) error { return fmt.Errorf("redisstore: mark flushed: %w", err) }
	if key == "" {
		return wrap(fmt.Errorf("%w: empty key", limit.ErrInvalidMeter))
	}
	if err := limit.ValidateUsage(u); err != nil {
		return wrap(err)
	}
	b := batches.Get().(*batch)
	defer b.release()
	b.build(opMarkFlushed, s.offset.Load(), nil, 0, "")
	b.keys = append(b.keys, key)
	b.nums(u.Charged, u.Refunded, u.Calls, u.RefundedCalls)
	b.args = append(b.args, gen)
	arr, err := s.exec(ctx, b)
	if err == nil && len(arr) != 2 {
		err = fmt.Errorf("%w: %d values", errReply, len(arr))
	}
	if err != nil {
		return wrap(err)
	}
	n, err := arr[1].AsInt64()
	if err != nil {
		return wrap(fmt.Errorf("%w: mark status: %w", errReply, err))
	}
	switch n {
	case 1:
		return nil
	case 0:
		return wrap(limit.ErrMeterMissing)
	case 2:
		return wrap(limit.ErrMeterReplaced)
	default:
		return wrap(fmt.Errorf("%w: mark status %d", errReply, n))
	}
}

// ScanMeters calls fn with every meter whose live usage is not covered by
// its flushed part: it SCANs for keyspace.UsagePattern on every master (the
// one server when standalone; in a Cluster, every node ROLE does not name a
// replica) and reads each key found with HGETALL, a page at a time. A key
// seen twice (a failover during the scan) is reported once; a key that is
// not a meter hash is skipped. As with any SCAN, a meter created or moved
// during the scan may be missed: the sweep is a backstop run again later.
//
// The scan is bounded by ctx alone, not Options.Timeout (it is a background
// job of many round trips). It stops at the first error of fn, of ctx or
// of Redis, and returns it.
func (s *Store) ScanMeters(ctx context.Context, fn func(limit.MeterState) error) error {
	seen := map[string]struct{}{}
	return s.scanMasters(ctx, keyspace.UsagePattern, scanCount, "scan meters", func(keys []string) error {
		return s.readMeters(ctx, keys, seen, fn)
	})
}

// readNew reads with HGETALL, in one round trip through the client (which
// routes each key to its slot's master), the keys of a SCAN page not seen
// yet and not skipped, and marks them seen. replies[i] is fresh[i]'s.
func (s *Store) readNew(ctx context.Context, keys []string, seen map[string]struct{}, skip func(string) bool) (fresh []string, replies []rueidis.RedisResult) {
	cmds := make(rueidis.Commands, 0, len(keys))
	for _, k := range keys {
		if _, ok := seen[k]; ok || skip != nil && skip(k) {
			continue
		}
		seen[k] = struct{}{}
		fresh = append(fresh, k)
		cmds = append(cmds, s.client.B().Hgetall().Key(k).Build())
	}
	if len(cmds) == 0 {
		return nil, nil
	}
	return fresh, s.client.DoMulti(ctx, cmds...)
}

// scanMasters SCANs for pattern on every master (the one server when
// standalone) and hands each page of keys to page. A key may be seen twice
// (a failover during the scan): page deduplicates.
func (s *Store) scanMasters(ctx context.Context, pattern string, count int64, what string, page func(keys []string) error) error {
	cluster := s.client.Mode() == rueidis.ClientModeCluster
	for addr, node := range s.client.Nodes() {
		if cluster && isReplica(ctx, node) {
			continue
		}
		for cursor := uint64(0); ; {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(pattern).Count(count).Build()).AsScanEntry()
			if err != nil {
				return fmt.Errorf("redisstore: %s on %s: %w", what, addr, err)
			}
			if err := page(e.Elements); err != nil {
				return err
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	return nil
}

// readMeters reads the meters keys not seen yet, in one round trip through
// the client (which routes each key to its slot's master), and calls fn
// with the unflushed ones.
func (s *Store) readMeters(ctx context.Context, keys []string, seen map[string]struct{}, fn func(limit.MeterState) error) error {
	fresh, replies := s.readNew(ctx, keys, seen, nil)
	for i, r := range replies {
		h, err := r.AsStrMap()
		if wrongType(err) {
			continue // not a meter
		}
		if err != nil {
			return fmt.Errorf("redisstore: scan meters: read %q: %w", fresh[i], err)
		}
		if len(h) == 0 {
			continue // expired meanwhile
		}
		ms, err := parseMeter(fresh[i], h)
		if err != nil {
			continue // not a meter of ours
		}
		if !ms.Flushed.Covers(ms.Live) {
			if err := fn(ms); err != nil {
				return err
			}
		}
	}
	return nil
}

// isReplica reports whether ROLE names node a replica. A node that does not
// answer ROLE (a restricted ACL) is scanned as a master: keys seen twice are
// reported once.
func isReplica(ctx context.Context, node rueidis.Client) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	role, err := node.Do(ctx, node.B().Role().Build()).ToArray()
	if err != nil || len(role) == 0 {
		return false
	}
	r, _ := role[0].ToString()
	return r == "slave" || r == "replica"
}

// runMeter runs op for checks and the meter m (whose key follows theirs)
// charged mcost, then the numbers tail, under the store's deadline; with
// m.Op, as the idempotent op (see opTail).
func (s *Store) runMeter(ctx context.Context, op string, checks []limit.Check, cost int64, lease string, m *limit.Meter, mcost int64, tail ...int64) ([]rueidis.RedisMessage, error) {
	b := batches.Get().(*batch)
	defer b.release()
	b.build(withOp(op, m), s.offset.Load(), checks, cost, lease)
	b.meter(m, mcost)
	b.nums(tail...)
	b.opTail(m)
	return s.exec(ctx, b)
}

// withOp is the script's op for op with the meter m: its idempotent form
// (upper case: 'M', 'N', 'A') when m has an Op.
func withOp(op string, m *limit.Meter) string {
	if m == nil || m.Op == "" {
		return op
	}
	return strings.ToUpper(op)
}

// opMarkerTTL is limit.OpTTL in ms, as the script's ARGV.
var opMarkerTTL = strconv.FormatInt(limit.OpTTL.Milliseconds(), 10)

// opTail appends, for a meter with an Op, the op's marker key to KEYS and
// its tail to ARGV (limit.lua): the marker's TTL and the replay guard, one
// string "<c> <r> <n> <rn> <generation id>" of the usage after and the
// generation ("" without a Replay; a Replay of no generation ends with the
// space). It must come last. The op id is in the marker's key: the
// library needs no more.
func (b *batch) opTail(m *limit.Meter) {
	if m == nil || m.Op == "" {
		return
	}
	b.keys = append(b.keys, keyspace.MeterOp(m.Key, m.Op))
	replay := ""
	if r := m.Replay; r != nil {
		u := r.After
		replay = fmt.Sprintf("%d %d %d %d %s", u.Charged, u.Refunded, u.Calls, u.RefundedCalls, r.Gen)
	}
	b.args = append(b.args, opMarkerTTL, replay)
}

// meter appends the meter's key to KEYS and its block to ARGV (limit.lua),
// with mcost as the meter's charge (m.CostFor of the call's cost; 0 for an
// adjust, which does not read it).
func (b *batch) meter(m *limit.Meter, mcost int64) {
	b.keys = append(b.keys, m.Key)
	seeded := "0"
	if m.Seeded {
		seeded = "1"
	}
	b.args = append(b.args, m.Tenant, m.Period, seeded)
	sd := m.Seed
	b.nums(expireMS(m.ExpireAt), sd.Charged, sd.Refunded, sd.Calls, sd.RefundedCalls, m.Quota, mcost)
}

// nums appends numbers to ARGV, formatted into one string.
func (b *batch) nums(vs ...int64) {
	buf, ends := b.buf[:0], b.ends[:0]
	for _, v := range vs {
		buf = strconv.AppendInt(buf, v, 10)
		ends = append(ends, len(buf))
	}
	all := string(buf)
	b.buf, b.ends = buf, ends
	start := 0
	for _, e := range ends {
		b.args = append(b.args, all[start:e])
		start = e
	}
}

// expireMS is t in milliseconds since 1970 for PEXPIREAT, rounded up so
// that a meter never goes before the time asked for.
func expireMS(t time.Time) int64 {
	ms := t.UnixMilli()
	if t.Nanosecond()%int(time.Millisecond) != 0 {
		ms++
	}
	return ms
}

// wrongType reports whether err is Redis's WRONGTYPE reply: the key holds
// another kind of value, so it is not the meter or breaker a scan looks
// for. Any other error reply (NOPERM from an ACL that refuses HGETALL, a
// Cluster error) is a failure to report: skipped silently, it would make a
// usage sweep or a breaker listing find nothing and say nothing.
func wrongType(err error) bool {
	re, ok := rueidis.IsRedisErr(err)
	return ok && strings.HasPrefix(re.Error(), "WRONGTYPE")
}
