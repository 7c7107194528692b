// Package memstore is the in-process limit.Store: counters live in this
// process's memory, so it suits a single gateway instance, an MCP server that
// limits its own tools, and the fallback when Redis is unreachable.
//
// It runs the reference algorithms of limit/internal/algo directly, so its
// decisions are the Redis store's decisions given the same times:
//
//   - Time is whole microseconds since Epoch (the Redis store's epoch, so fixed
//     windows align with wall-clock minutes and hours). It is the wall time of
//     the store's first clock reading plus the monotonic time elapsed since, so
//     it never runs backwards, whatever happens to the wall clock. A Take of
//     one check reads the clock before taking its shard's lock (so that the
//     lock is held for less time) and every call then uses the later of that
//     reading and the latest time already used under the locks it holds: two
//     calls on one counter see times in the order they saw its state.
//   - A Take is atomic across its checks: all their counters are locked, every
//     check is evaluated, and only if every enforced (non-shadow) check allows
//     is each allowing check charged. A batch must not name the same key twice
//     (ErrDuplicateKey): one counter holds one rule's state.
//   - Counters expire: one past its expiry is a fresh counter, and is dropped
//     when next touched and by Sweep, which a background goroutine runs every
//     SweepInterval. Idle keys therefore cost no memory for long.
//   - It is a limit.MeteredStore: usage meters (monthly quotas) are charged
//     in the same atomic step as the checks (TakeMetered), and kept until
//     their Meter.ExpireAt. They live in this process only: after a restart
//     the caller re-seeds them from its durable store (limit.Meter.Seed).
//   - It is a limit.GuardedStore: loop breakers (see Evaluate) are
//     evaluated in the same atomic step as the checks and the meter.
//
// A Store is safe for concurrent use. Counters are spread over shards, each
// with its own lock; calls on keys of different shards do not contend.
package memstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"hash/maphash"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/internal/algo"
)

// Epoch is the origin of the store's time, 2020-01-01T00:00:00Z, the same as
// the Redis store's.
var Epoch = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// Defaults and bounds of Options.
const (
	DefaultShards        = 64
	MaxShards            = 1 << 16
	DefaultSweepInterval = 10 * time.Second
)

// ErrInvalidOptions means New was given options out of range.
var ErrInvalidOptions = errors.New("memstore: invalid options")

// ErrDuplicateKey means two checks of one batch named the same key. A counter
// holds one rule's state and a batch is judged on the state before it, so a
// repeated key could not be charged twice consistently: the batch is refused
// rather than half counted. Errors wrapping it also wrap limit.ErrInvalidRule.
var ErrDuplicateKey = limit.ErrDuplicateKey

// Clock is the time source of a Store. Readings must not run backwards
// between calls (time.Now's monotonic reading, or a test clock that only
// advances).
type Clock interface {
	Now() time.Time
}

// Options configure a Store. A nil *Options, and zero fields, mean the
// documented defaults.
type Options struct {
	// Clock is read for every decision; nil means the real clock, through its
	// monotonic reading.
	Clock Clock
	// Shards is the number of independently locked parts the counters are
	// spread over, 1 to MaxShards; 0 means DefaultShards.
	Shards int
	// SweepInterval is how often expired counters are dropped in the
	// background; 0 means DefaultSweepInterval. A sweep scans one shard at a
	// time under its lock, so a larger interval trades memory for fewer scans.
	SweepInterval time.Duration
}

// Store is the in-process limit.Store. Create it with New; Close stops its
// background sweeper. The zero value is not usable.
type Store struct {
	c *core
}

var _ limit.MeteredStore = (*Store)(nil)

// core is the Store's state. The sweeper goroutine holds core, not Store, so
// that a Store nobody closed can still be collected (and its sweeper stopped).
type core struct {
	shards []shard
	seed   maphash.Seed
	clock  Clock // nil: time.Since(base)
	base   time.Time
	baseUS int64 // base in µs since Epoch

	leasePrefix string
	leaseSeq    atomic.Uint64

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// shard is one lock and the counters and usage meters under it, padded to
// two cache lines so that neighbouring locks do not share one. A key's meter
// lives in the key's shard, like a counter, so one lock order covers both.
type shard struct {
	mu     sync.Mutex
	m      map[string]*counter
	meters map[string]*algo.Meter // made on first use
	ops    map[string]*opMarker   // markers of applied ops (limit.Meter.Op), made on first use
	br     *breakerMaps           // made on first use
	peak   int                    // largest len(m) since m was made
	// last is the latest time used under mu (see at).
	last int64
	// slab[used:] is where results are carved from (see results).
	slab []limit.Result
	used int
	_    [48]byte
}

// counter is one rate-limit counter and the last rule it was evaluated
// under by a single-check Take. That rule passed Rule.Validate, so a check
// with an equal rule (rules are plain values: equal rules validate alike)
// need not be validated again; the zero Rule matches no valid rule.
type counter struct {
	algo.State
	rule limit.Rule
}

// New returns a Store, or an error wrapping ErrInvalidOptions. opts may be nil.
func New(opts *Options) (*Store, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	switch {
	case o.Shards < 0 || o.Shards > MaxShards:
		return nil, fmt.Errorf("%w: shards must be between 0 and %d, got %d", ErrInvalidOptions, MaxShards, o.Shards)
	case o.SweepInterval < 0:
		return nil, fmt.Errorf("%w: sweep interval must not be negative, got %v", ErrInvalidOptions, o.SweepInterval)
	}
	if o.Shards == 0 {
		o.Shards = DefaultShards
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = DefaultSweepInterval
	}
	c := &core{
		shards:      make([]shard, o.Shards),
		seed:        maphash.MakeSeed(),
		clock:       o.Clock,
		leasePrefix: "mem-" + rand.Text()[:16] + "-",
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
	for i := range c.shards {
		c.shards[i].m = make(map[string]*counter)
	}
	if c.clock == nil {
		c.base = time.Now()
	} else {
		c.base = c.clock.Now()
	}
	// A wall clock before the epoch is broken; counting from the epoch then
	// keeps every time non-negative, as the window arithmetic needs.
	c.baseUS = max(0, int64(c.base.Sub(Epoch)/time.Microsecond))
	go c.sweepEvery(o.SweepInterval)
	s := &Store{c: c}
	runtime.AddCleanup(s, func(c *core) { c.stopOnce.Do(func() { close(c.stop) }) }, c)
	return s, nil
}

// Close stops the background sweeper and waits for it to finish. The Store
// stays usable: expired counters are then dropped only when touched or by
// Sweep. Close is idempotent and always returns nil.
func (s *Store) Close() error {
	s.c.stopOnce.Do(func() { close(s.c.stop) })
	<-s.c.done
	return nil
}

func (c *core) sweepEvery(d time.Duration) {
	defer close(c.done)
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.sweep()
		}
	}
}

// now reads the store's clock, in µs since Epoch. A reading taken before a
// lock may be earlier than one another call took later and used under that
// lock: pass it through at (or core.at) before using it under the lock.
func (c *core) now() int64 {
	var elapsed time.Duration
	if c.clock == nil {
		elapsed = time.Since(c.base)
	} else {
		elapsed = c.clock.Now().Sub(c.base)
	}
	return c.baseUS + int64(elapsed/time.Microsecond)
}

// at returns the time of a call holding sh.mu that read the clock at t: t,
// or the latest time already used under sh.mu if that is later (another
// call read the clock after t but took the lock first), and records it.
// Times under one lock therefore never run backwards, which the window
// algorithms need (an earlier time would reopen a window already left).
func (sh *shard) at(t int64) int64 {
	t = max(t, sh.last)
	sh.last = t
	return t
}

// at is shard.at for a call holding the locks of the shards locks.
func (c *core) at(t int64, locks []int) int64 {
	for _, i := range locks {
		t = max(t, c.shards[i].last)
	}
	for _, i := range locks {
		c.shards[i].last = t
	}
	return t
}

// slabSize is the number of results one allocation of results holds.
const slabSize = 64

// results returns n zeroed results for one decision, carved from the
// shard's slab: one allocation serves slabSize results, so that a decision
// costs no allocation of its own. The slice's capacity is n, so appending
// to it cannot reach another decision's results. A slab stays in memory
// while any decision carved from it is referenced. Call with sh.mu held.
func (sh *shard) results(n int) []limit.Result {
	if n > slabSize/4 {
		return make([]limit.Result, n)
	}
	if len(sh.slab)-sh.used < n {
		// the only pointer stored; other calls move an index, which
		// costs no write barrier while the GC runs
		sh.slab, sh.used = make([]limit.Result, slabSize), 0
	}
	i := sh.used
	sh.used += n
	return sh.slab[i : i+n : i+n]
}

func (c *core) shardOf(key string) int {
	return int(maphash.String(c.seed, key) % uint64(len(c.shards)))
}

// get returns key's counter, or nil when the shard holds none. A counter past
// its expiry is reset in place (a fresh counter is equivalent); release drops
// it unless it was charged meanwhile. Call with sh.mu held.
func (sh *shard) get(key string, now int64) *counter {
	st := sh.m[key]
	if st != nil && st.ExpiresAt <= now {
		st.Assign(algo.State{})
	}
	return st
}

// put stores a counter charged for the first time.
func (sh *shard) put(key string, st *counter) {
	sh.m[key] = st
	sh.peak = max(sh.peak, len(sh.m))
}

// release drops key's counter st (as returned by get) if it holds nothing.
func (sh *shard) release(key string, st *counter) {
	if st != nil && (!st.Used || st.Leases != nil && len(st.Leases) == 0) {
		delete(sh.m, key)
	}
}

// Take evaluates checks for one request of the given cost, atomically: if
// every enforced check allows, every allowing check is charged and, when a
// concurrency check is among them, Decision.Lease names the slots taken.
// Otherwise nothing is charged. Errors: ctx.Err() when ctx is done before
// any work (nothing charged), limit.ErrNoChecks, limit.ErrInvalidCost,
// limit.ErrInvalidRule, ErrDuplicateKey.
//
// Decision.Results of several decisions may share one allocation (see
// shard.results); each decision's results are its own, and its capacity
// is its length, so appending to it copies.
func (s *Store) Take(ctx context.Context, checks []limit.Check, cost int64) (limit.Decision, error) {
	if err := ctx.Err(); err != nil {
		return limit.Decision{}, err
	}
	if len(checks) == 1 && cost >= 1 && checks[0].Key != "" && checks[0].Rule.Algorithm != limit.Concurrency {
		// Any other error is the rule's, which takeOne reports. The
		// decision is built in place: it is large, and this is the hot path.
		var d limit.Decision
		err := s.c.takeOne(checks, cost, &d)
		return d, err
	}
	if err := validate(checks, cost); err != nil {
		return limit.Decision{}, err
	}
	lease, results := s.c.takeMany(checks, cost)
	return limit.Combine(checks, results, lease), nil
}

// takeOne is Take for a single check without a lease, of a valid cost and
// a non-empty key: its own result decides, so one Eval that charges only
// when it allows is the whole batch. The rule is validated only when it
// differs from the one the counter was last evaluated under, so that the
// usual call (the same rule on a counter) skips Rule.Validate; an invalid
// rule is refused with its Validate error, and nothing is charged.
func (c *core) takeOne(checks []limit.Check, cost int64, d *limit.Decision) error {
	ch := &checks[0]
	sh := &c.shards[c.shardOf(ch.Key)]
	t := c.now()
	sh.mu.Lock()
	now := sh.at(t)
	st := sh.get(ch.Key, now)
	if st == nil || st.rule != ch.Rule {
		if err := ch.Rule.Validate(); err != nil {
			sh.mu.Unlock()
			return err
		}
	}
	res := sh.results(1)
	if st != nil {
		res[0] = algo.Eval(ch.Rule, &st.State, now, cost, "", true)
		if st.rule != ch.Rule {
			st.rule = ch.Rule
		}
		sh.release(ch.Key, st)
	} else {
		var fresh algo.State
		res[0] = algo.Eval(ch.Rule, &fresh, now, cost, "", true)
		if fresh.Used {
			sh.put(ch.Key, &counter{State: fresh, rule: ch.Rule})
		}
	}
	sh.mu.Unlock()
	decideOne(d, ch, res)
	return nil
}

// decideOne sets the zero *d to limit.Combine(checks, results, "") for a
// batch of the one check ch that takes no lease, without Combine's general
// loop: ch decides, and a shadow check never denies.
func decideOne(d *limit.Decision, ch *limit.Check, results []limit.Result) {
	r := &results[0]
	d.Allowed = r.Allowed || ch.Rule.Shadow
	d.Rule = ch.Rule
	d.Limit = ch.Rule.Limit
	if a := ch.Rule.Algorithm; a == limit.TokenBucket || a == limit.GCRA {
		d.Limit = ch.Rule.Capacity()
	}
	d.Remaining = r.Remaining
	d.ResetAfter = r.ResetAfter
	if !d.Allowed {
		d.RetryAfter = r.RetryAfter
	}
	d.Results = results
}

// batchSize is the batch size handled without heap allocation.
const batchSize = 8

// takeMany evaluates every check without charging, then charges the allowing
// ones if no enforced check denied. It returns the results and the lease
// when a concurrency slot was taken.
func (c *core) takeMany(checks []limit.Check, cost int64) (lease string, results []limit.Result) {
	var ib, lb [batchSize]int
	var sb [batchSize]*counter
	idx, locks := c.lock(checks, ib[:0], lb[:0])
	defer c.unlock(locks)
	now := c.at(c.now(), locks)
	results = c.shards[locks[0]].results(len(checks))
	states, admit := c.dryRun(checks, idx, sb[:0], results, now, cost)

	if admit {
		lease = c.commit(checks, results, states, idx, now, cost)
	}
	for i, st := range states {
		c.shards[idx[i]].release(checks[i].Key, st)
	}
	return lease, results
}

// dryRun evaluates every check without charging: it appends each check's
// state (nil when the counter does not exist) to states, fills results, and
// reports whether every enforced check allows. The shards must be locked.
func (c *core) dryRun(checks []limit.Check, idx []int, states []*counter, results []limit.Result, now, cost int64) ([]*counter, bool) {
	admit := true
	for i, ch := range checks {
		st := c.shards[idx[i]].get(ch.Key, now)
		states = append(states, st)
		if st == nil {
			var fresh algo.State
			results[i] = algo.Eval(ch.Rule, &fresh, now, cost, "", false)
		} else {
			results[i] = algo.Eval(ch.Rule, &st.State, now, cost, "", false)
		}
		if !results[i].Allowed && !ch.Rule.Shadow {
			admit = false
		}
	}
	return states, admit
}

// commit charges, after an admitting dry run, every check whose result
// allowed, taking a lease when a concurrency check is among them; a state
// the dry run found missing is created (and recorded in states). The
// shards must be locked.
func (c *core) commit(checks []limit.Check, results []limit.Result, states []*counter, idx []int, now, cost int64) (lease string) {
	for i, ch := range checks {
		if ch.Rule.Algorithm == limit.Concurrency && results[i].Allowed {
			lease = c.newLease()
			break
		}
	}
	for i, ch := range checks {
		if !results[i].Allowed {
			continue
		}
		st := states[i]
		if st == nil {
			st = &counter{rule: ch.Rule}
			c.shards[idx[i]].put(ch.Key, st)
			states[i] = st
		}
		// Same state, time and request as the dry run: same result.
		algo.Eval(ch.Rule, &st.State, now, cost, lease, true)
	}
	return lease
}

// lock locks the shards of checks in ascending order, each once, so that
// batches over overlapping shards cannot deadlock. It returns each check's
// shard (appended to idx) and the shards locked (appended to locks).
func (c *core) lock(checks []limit.Check, idx, locks []int) ([]int, []int) {
	for _, ch := range checks {
		i := c.shardOf(ch.Key)
		idx = append(idx, i)
		// insertion into the sorted, duplicate-free locks
		j := len(locks)
		for j > 0 && locks[j-1] > i {
			j--
		}
		if j > 0 && locks[j-1] == i {
			continue
		}
		locks = append(locks, 0)
		copy(locks[j+1:], locks[j:])
		locks[j] = i
	}
	for _, i := range locks {
		c.shards[i].mu.Lock()
	}
	return idx, locks
}

func (c *core) unlock(locks []int) {
	for _, i := range locks {
		c.shards[i].mu.Unlock()
	}
}

// newLease returns an id no other Take of any Store in any process returns:
// a random prefix per Store and a sequence number.
func (c *core) newLease() string {
	var b [48]byte
	buf := append(b[:0], c.leasePrefix...)
	return string(strconv.AppendUint(buf, c.leaseSeq.Add(1), 36))
}

// Refund gives back what an admitted Take of these checks charged: cost
// units, and the concurrency slots of lease. Pass the checks whose results
// allowed (a shadow check that denied was not charged; refunding it anyway
// raises it, at most to full capacity). A counter that has expired meanwhile
// is already full and is left alone. Errors are those of Take; a Refund with
// an error changed nothing.
func (s *Store) Refund(ctx context.Context, checks []limit.Check, cost int64, lease string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validate(checks, cost); err != nil {
		return err
	}
	s.c.apply(checks, func(ch limit.Check, st *algo.State, now int64) {
		algo.Refund(ch.Rule, st, now, cost, lease)
	})
	return nil
}

// Release frees the concurrency slots held under lease by checks; other
// algorithms are unaffected. Releasing twice, an expired lease, or an empty
// one is harmless. Errors: ctx.Err(), and the validation errors of Take.
func (s *Store) Release(ctx context.Context, checks []limit.Check, lease string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validate(checks, 1); err != nil {
		return err
	}
	if lease == "" {
		return nil
	}
	s.c.apply(checks, func(ch limit.Check, st *algo.State, _ int64) {
		algo.Release(ch.Rule, st, lease)
	})
	return nil
}

// Renew implements limit.Renewer: the concurrency slots held under lease
// get a full period from now. Errors: ctx.Err(), and the validation errors
// of Take.
func (s *Store) Renew(ctx context.Context, checks []limit.Check, lease string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := validate(checks, 1); err != nil {
		return false, err
	}
	want, renewed := 0, 0
	for _, ch := range checks {
		if ch.Rule.Algorithm == limit.Concurrency {
			want++
		}
	}
	if want == 0 {
		return true, nil
	}
	if lease == "" {
		return false, nil
	}
	// apply skips missing counters: a slot in none is not held
	s.c.apply(checks, func(ch limit.Check, st *algo.State, now int64) {
		if ch.Rule.Algorithm == limit.Concurrency && algo.Renew(ch.Rule, st, now, lease) {
			renewed++
		}
	})
	return renewed == want, nil
}

// apply runs f on the live counter of each check, under the batch's locks,
// and drops the counters left empty.
func (c *core) apply(checks []limit.Check, f func(limit.Check, *algo.State, int64)) {
	var ib, lb [batchSize]int
	idx, locks := c.lock(checks, ib[:0], lb[:0])
	defer c.unlock(locks)
	now := c.at(c.now(), locks)
	for i, ch := range checks {
		sh := &c.shards[idx[i]]
		st := sh.get(ch.Key, now)
		if st != nil && st.Used {
			f(ch, &st.State, now)
		}
		sh.release(ch.Key, st)
	}
}

// validate is limit.Validate plus the rule that keys are distinct.
func validate(checks []limit.Check, cost int64) error {
	if err := limit.Validate(checks, cost); err != nil {
		return err
	}
	if len(checks) > 16 {
		seen := make(map[string]struct{}, len(checks))
		for _, ch := range checks {
			if _, ok := seen[ch.Key]; ok {
				return duplicate(ch)
			}
			seen[ch.Key] = struct{}{}
		}
		return nil
	}
	for i := 1; i < len(checks); i++ {
		for j := range i {
			if checks[i].Key == checks[j].Key {
				return duplicate(checks[i])
			}
		}
	}
	return nil
}

func duplicate(ch limit.Check) error {
	return fmt.Errorf("%w %q: %w: %q", limit.ErrInvalidRule, ch.Rule.Name, ErrDuplicateKey, ch.Key)
}
