package enforce

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/policy"
)

// Bounds of the in-process breaker cache.
const (
	// breakerCacheSize bounds the open breakers remembered in process, and
	// so each of the breakers seen failing and the counts of denials.
	breakerCacheSize = 100_000
	// breakerTenantShare bounds one tenant's breakers seen failing, and
	// its counts of denials: past it a tenant's new entry evicts its own
	// oldest, so that it takes no other tenant's room (ten tenants full
	// can).
	breakerTenantShare = breakerCacheSize / 10
	// BreakerCacheHold caps how long an open breaker is answered in process
	// without asking the store, so that DELETE /admin/breakers/{key} on one
	// instance reaches the others within this time.
	BreakerCacheHold = time.Second
	// ProbeRetry caps the Retry-After of a call refused because another
	// call's half-open probe is in flight, and how long such a refusal is
	// answered in process: the store's retry time is the probe's lease
	// (the upstream timeout and more), but the probe's outcome, which
	// closes or reopens the breaker, usually comes within a second.
	ProbeRetry = time.Second
)

// breakerCache answers open breakers in process until they may close (at
// most BreakerCacheHold at a time while the store can be asked; until they
// may close while it cannot), and counts the denials the local denial
// cache answered, so that they count toward consecutive_denials.
type breakerCache struct {
	now   func() time.Time
	alert func(limit.BreakerSpec, limit.BreakerState)

	mu sync.Mutex
	// open holds the breakers seen open, each until it may close: one
	// tenant's breakers (keyed by session, say) past its share evict its
	// own oldest, and a full cache loses its oldest entry, in O(1) under
	// the lock, however many entries are still within their cooldown.
	open aging[openBreaker]
	// denials is the store's count of a breaker's consecutive denials as
	// last seen, when not zero, until BreakerCacheHold after it was seen
	// (deniedLocally reads no older count).
	denials aging[seenDenials]
	// failing holds the breakers whose count of consecutive failures was
	// last seen above zero: a success must then reset it even when the
	// call saw none on admission (a call admitted alongside one that
	// failed first), or fail, succeed, fail would open the breaker. Each
	// is held until the store may have dropped the count (MaxCooldown past
	// its last change, see algo.BreakerExpiry): one tenant's breakers
	// failing once each (keyed by session, say) age out, past its share
	// evict its own oldest, and a full record loses its oldest entries,
	// not everyone's.
	failing aging[struct{}]
	// nFailing is failing's length, read without the lock: a healthy
	// agent's success (none failing) costs hasFailures no lock.
	nFailing atomic.Int64
}

// aging is a map of at most breakerCacheSize entries, at most
// breakerTenantShare of them a tenant's, kept in the order they were last
// set, each with the time it lapses. set drops the lapsed entries from the
// front and, for room, the tenant's oldest entry when it holds its share,
// else everyone's oldest: one tenant's breakers (keyed by session, say)
// evict only its own, and a full record loses its oldest entries, not all.
// Each call is O(1), amortized. Entries of one kind lapse a fixed time
// after they are set (the configuration's, which a reload may change), or
// near enough (an open breaker's cooldown grows to its max_cooldown), so
// the front is the first to lapse, or near enough: one behind it that
// lapses earlier is dropped with it, or for room, and get ignores it
// meanwhile. The
// zero aging is empty and ready. Its user locks it.
type aging[V any] struct {
	m       map[string]*agingEntry[V]
	order   list.List             // of *agingEntry[V]; front: set longest ago
	tenants map[string]*list.List // each tenant's entries, in the same order
	// dropped counts the entries set dropped (lapsed, or for room): the
	// whole of its work beyond one entry, which tests bound.
	dropped int64
}

type agingEntry[V any] struct {
	key, tenant string
	v           V
	until       time.Time     // when it lapses
	e, te       *list.Element // in order, in its tenant's list
}

// get returns key's value unless it lapsed by now.
func (a *aging[V]) get(key string, now time.Time) (V, bool) {
	if ae, ok := a.m[key]; ok && now.Before(ae.until) {
		return ae.v, true
	}
	var zero V
	return zero, false
}

// set holds key's v (a breaker of tenant) until until, as the newest
// entry, after dropping the entries lapsed by now and making room.
func (a *aging[V]) set(key, tenant string, v V, now, until time.Time) {
	if a.m == nil {
		a.m, a.tenants = make(map[string]*agingEntry[V]), make(map[string]*list.List)
	}
	for e := a.order.Front(); e != nil && !now.Before(e.Value.(*agingEntry[V]).until); e = a.order.Front() {
		a.remove(e.Value.(*agingEntry[V]))
		a.dropped++
	}
	if ae, ok := a.m[key]; ok {
		ae.v, ae.until = v, until
		a.order.MoveToBack(ae.e)
		a.tenants[ae.tenant].MoveToBack(ae.te)
		return
	}
	if tl := a.tenants[tenant]; tl != nil && tl.Len() >= breakerTenantShare {
		a.remove(tl.Front().Value.(*agingEntry[V]))
		a.dropped++
	} else if len(a.m) >= breakerCacheSize {
		a.remove(a.order.Front().Value.(*agingEntry[V]))
		a.dropped++
	}
	tl := a.tenants[tenant]
	if tl == nil {
		tl = list.New()
		a.tenants[tenant] = tl
	}
	ae := &agingEntry[V]{key: key, tenant: tenant, v: v, until: until}
	ae.e, ae.te = a.order.PushBack(ae), tl.PushBack(ae)
	a.m[key] = ae
}

// delete drops key.
func (a *aging[V]) delete(key string) {
	if ae, ok := a.m[key]; ok {
		a.remove(ae)
	}
}

func (a *aging[V]) remove(ae *agingEntry[V]) {
	a.order.Remove(ae.e)
	if tl := a.tenants[ae.tenant]; tl.Remove(ae.te) != nil && tl.Len() == 0 {
		delete(a.tenants, ae.tenant)
	}
	delete(a.m, ae.key)
}

func (a *aging[V]) len() int { return len(a.m) }

type seenDenials struct {
	n  int64
	at time.Time
}

type openBreaker struct {
	until time.Time // when a probe may go
	hold  time.Time // when to ask the store again
	state limit.BreakerState
}

func newBreakerCache(now func() time.Time, alert func(limit.BreakerSpec, limit.BreakerState)) *breakerCache {
	return &breakerCache{now: now, alert: alert}
}

// markFailing records that a failure of b is being reported.
func (c *breakerCache) markFailing(b *limit.BreakerSpec) {
	if c == nil || b == nil {
		return
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setFailingLocked(b, true, now)
}

// setFailingLocked records whether b's count of failures is above zero, as
// seen at now. c.mu is held.
func (c *breakerCache) setFailingLocked(b *limit.BreakerSpec, on bool, now time.Time) {
	if on {
		// A closed breaker's counts live MaxCooldown past their last
		// change (algo.BreakerExpiry): a success after that resets
		// nothing. An entry evicted early (breakerCacheSize) leaves a
		// success unreported: what the store's count did before this map.
		hold := max(b.MaxCooldown, b.Cooldown)
		if hold <= 0 {
			hold = limit.MaxBreakerDuration
		}
		c.failing.set(b.Key, b.Tenant, struct{}{}, now, now.Add(hold))
	} else {
		c.failing.delete(b.Key)
	}
	c.nFailing.Store(int64(c.failing.len()))
}

// hasFailures reports whether key's count of consecutive failures was last
// seen above zero in this process.
func (c *breakerCache) hasFailures(key string) bool {
	if c == nil || c.nFailing.Load() == 0 {
		return false
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.failing.get(key, now)
	return ok
}

// lookup returns the state of a breaker known open, with RetryAfter counted
// down to now. storeUp tells whether the breaker's store can be asked:
// then an entry answers until its hold, so that the store is asked again
// (an admin reset on another instance shows); otherwise it answers until
// the breaker may close (until), for the store cannot say otherwise and
// forgetting it would hand the runaway caller to on_error.
func (c *breakerCache) lookup(key string, storeUp bool) (limit.BreakerState, bool) {
	if c == nil {
		return limit.BreakerState{}, false
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.open.get(key, now) // none past its until
	switch {
	case !ok:
		return limit.BreakerState{}, false
	case storeUp && !now.Before(e.hold):
		// Kept until its until: should asking the store fail, it still
		// answers (stillOpen).
		return limit.BreakerState{}, false
	}
	return e.answer(now), true
}

// stillOpen returns the state of a breaker known open until a time not yet
// come, whatever its hold: the answer when asking its store failed.
func (c *breakerCache) stillOpen(key string) (limit.BreakerState, bool) {
	return c.lookup(key, false)
}

// answer is e's state as a call refused at now sees it.
func (e openBreaker) answer(now time.Time) limit.BreakerState {
	st := e.state
	st.Open, st.Opened, st.Probe = true, false, false
	st.RetryAfter = max(e.until.Sub(now), time.Millisecond)
	return st
}

// observe records what the store said about a breaker: remembers it while
// open (and forgets it otherwise), keeps its count of denials, and alerts
// when this operation opened it.
func (c *breakerCache) observe(b *limit.BreakerSpec, st limit.BreakerState) {
	if c == nil || b == nil {
		return
	}
	if st.Opened {
		c.alert(*b, st)
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case st.Denials == 0:
		c.denials.delete(b.Key)
	default:
		// One evicted early only costs a round trip: an unknown count is
		// asked of the store.
		c.denials.set(b.Key, b.Tenant, seenDenials{n: st.Denials, at: now}, now, now.Add(BreakerCacheHold))
	}
	c.setFailingLocked(b, st.Failures > 0, now)
	if !st.Open && !st.Opened {
		// Closed, or half-open with no probe in flight: an entry held for
		// it is stale (say, a refusal answered while a probe ran that has
		// just closed it), and would refuse calls the store admits.
		c.open.delete(b.Key)
		return
	}
	if st.HalfOpen {
		st.RetryAfter = min(st.RetryAfter, ProbeRetry)
	}
	until := now.Add(st.RetryAfter)
	c.open.set(b.Key, b.Tenant, openBreaker{until: until, hold: minTime(until, now.Add(BreakerCacheHold)), state: st}, now, until)
}

// unhold stops answering key in process (its probe's lease was released:
// the next call should reach the store and become the probe), keeping its
// count of denials.
func (c *breakerCache) unhold(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.open.delete(key)
	c.mu.Unlock()
}

func (c *breakerCache) forget(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.open.delete(key)
	c.denials.delete(key)
	c.failing.delete(key)
	c.nFailing.Store(int64(c.failing.len()))
	c.mu.Unlock()
}

// deniedLocally counts toward consecutive_denials a denial that the local
// denial cache answered, and reports whether the breaker is open, opened by
// an earlier call (the call is then the breaker's to answer, as the store
// would). The denial is sent to the store (AddDenials, one round trip) while
// the store's count, as last seen, is below the threshold: the breaker then
// opens after exactly consecutive_denials denials, however many instances
// answered them, at the cost of fewer round trips than that per opening.
// Once the store's count has reached the threshold without opening the
// breaker (it is half-open: denials do not reopen it), denials are not sent
// for BreakerCacheHold, so that an agent looping on a denied key costs the
// store at most one call a second.
func (c *breakerCache) deniedLocally(ctx context.Context, gs limit.GuardedStore, b *limit.BreakerSpec) (limit.BreakerState, bool) {
	if c == nil || b == nil || b.ConsecutiveDenials == 0 {
		return limit.BreakerState{}, false
	}
	now := c.now()
	c.mu.Lock()
	seen, ok := c.denials.get(b.Key, now)
	c.mu.Unlock()
	if ok && seen.n >= b.ConsecutiveDenials && now.Sub(seen.at) < BreakerCacheHold {
		return limit.BreakerState{}, false
	}
	st, err := gs.AddDenials(ctx, *b, 1)
	if err != nil {
		return limit.BreakerState{}, false
	}
	c.observe(b, st)
	return st, st.Open && !st.Opened
}

// releaseProbe frees the lease of the half-open probe st says this call
// was, when the call will report no outcome (a later stage denied it, or
// its client went away before a result): without it the breaker would
// refuse every call until the lease ran out. A failed release is logged;
// the lease then runs out by itself.
func (l *limiter) releaseProbe(ctx context.Context, b *limit.BreakerSpec, st limit.BreakerState) {
	if b == nil || !st.Probe {
		return
	}
	var gs limit.GuardedStore = l.local
	if l.shared != nil {
		gs = l.shared
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if err := gs.ReleaseProbe(ctx, *b); err != nil {
		l.log.Warn("releasing a loop breaker's probe failed: the breaker refuses calls until its lease runs out", "key", b.Key, "err", err)
		return
	}
	l.breakers.unhold(b.Key)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// evaluate runs one request in store: rules, meter, breaker and global
// rules in one atomic step (limit.GuardedStore.Evaluate).
func (l *limiter) evaluate(ctx context.Context, store limit.GuardedStore, req limit.Request) (batch, error) {
	if len(req.Checks) == 0 && len(req.Global) == 0 && req.Meter == nil && req.Breaker == nil {
		// Nothing left to ask (a meter dropped after a failed seed): admitted
		// without a decision.
		return batch{d: limit.Decision{Allowed: true}}, nil
	}
	out, err := store.Evaluate(ctx, req)
	if err != nil {
		return batch{}, err
	}
	if req.Breaker != nil {
		l.breakers.observe(req.Breaker, out.Breaker)
	}
	if req.Meter == nil {
		out.Meter = limit.MeterResult{Allowed: true}
	}
	return batch{d: out.Decision, g: out.Global, globalDecides: out.GlobalDecides, mr: out.Meter, store: store,
		breaker: out.Breaker, breakerOpen: out.Breaker.Open}, nil
}

// ms rounds d up to whole milliseconds (breaker durations are kept in ms).
func ms(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}

// breakerSpec is the loop breaker of a call, or nil when the config has none.
// The identity follows breaker.key: the subject (default), the tenant, or the
// MCP session (falling back to the subject without one).
func breakerSpec(cfg *policy.Config, p Call, tool string) *limit.BreakerSpec {
	b := cfg.Breaker
	if !b.Enabled() {
		return nil
	}
	id := "subject:" + p.Subject
	switch {
	case b.Key == "tenant":
		id = "tenant"
	case b.Key == "session" && p.Session != "":
		id = "session:" + p.Session
	}
	spec := &limit.BreakerSpec{
		Key: keyspace.Breaker(p.Tenant, id), Tenant: p.Tenant, Subject: p.Subject, ID: id,
		ConsecutiveDenials:  int64(b.ConsecutiveDenials),
		ConsecutiveFailures: int64(b.ConsecutiveFailures),
		Cooldown:            ms(b.Cooldown),
		MaxCooldown:         ms(max(b.MaxCooldown, b.Cooldown)),
		// A probe's call may outlive its client by upstream.timeout (a
		// session-less call is read to its end, see gateway/outlive.go):
		// its lease covers that too, so that no second probe goes while
		// it still runs.
		ProbeLease: probeLease(cfg.Upstream.Timeout),
	}
	if b.IdenticalCalls.Count > 1 {
		spec.IdenticalKey = keyspace.BreakerCall(p.Tenant, id, fingerprint(tool, p.Arguments))
		spec.IdenticalCount = int64(b.IdenticalCalls.Count)
		spec.IdenticalWithin = ms(b.IdenticalCalls.Within)
	}
	return spec
}

// probeLease is the lease of a half-open probe whose call may run for
// timeout and outlive its client as long: 2*timeout+5s, at most
// limit.MaxBreakerDuration (the stores refuse a longer one, and with it
// every call the breaker guards). timeout is clamped first: policy.Parse
// bounds it, but a Config built in code need not be, and doubling a huge
// one would overflow into a negative lease.
func probeLease(timeout time.Duration) time.Duration {
	timeout = min(max(timeout, 0), limit.MaxBreakerDuration)
	return ms(min(2*timeout+5*time.Second, limit.MaxBreakerDuration))
}

// fingerprint identifies a call for the identical-calls trigger: the tool
// and its canonical arguments (key order, whitespace and number spelling do
// not matter).
func fingerprint(tool string, args json.RawMessage) string {
	canon, err := jsonscan.Canonical(args)
	if err != nil {
		canon = args
	}
	h := sha256.New()
	h.Write([]byte(tool))
	h.Write([]byte{0})
	h.Write(canon)
	return hex.EncodeToString(h.Sum(nil)[:16])
}
