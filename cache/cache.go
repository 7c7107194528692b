package cache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Options.
const (
	DefaultLockTTL         = 10 * time.Second
	DefaultStaleWindow     = time.Minute
	DefaultTimeout         = 100 * time.Millisecond
	DefaultPollInterval    = 100 * time.Millisecond
	DefaultBeta            = 1.0
	DefaultWarmConcurrency = 8
)

// ErrInvalidKey means a Get was given the zero Key.
var ErrInvalidKey = errors.New("cache: invalid key")

// ErrInvalidPolicy means a Policy is unusable: a TTL that is not positive, a
// jitter outside [0, 1], a negative NegativeTTL or LoadTimeout, or a nil
// Loader.
var ErrInvalidPolicy = errors.New("cache: invalid policy")

// ErrInvalidOptions means New was given unusable Options.
var ErrInvalidOptions = errors.New("cache: invalid options")

// ErrLoaderPanic means a Loader panicked; the panic is logged with its stack
// and returned as this error to every caller waiting for that load.
var ErrLoaderPanic = errors.New("cache: loader panicked")

// ErrLoaderAbandoned means a Loader had not returned a short grace period
// (1s) after its context ended (Options.LoadTimeout, or Policy.LoadTimeout):
// it ignores its context. Every caller waiting for that load gets this
// error, which wraps the context's (context.DeadlineExceeded); the entry's
// lock is released, nothing is stored, and the Loader is left to end on
// its own, not waited for by Close.
var ErrLoaderAbandoned = errors.New("cache: loader abandoned: still running")

// ErrClosed means the Cache was closed.
var ErrClosed = errors.New("cache: closed")

// Options configures a Cache. A nil *Options means all defaults; a zero
// field means its default.
type Options struct {
	// LockTTL is how long a loader holds an entry's distributed lock. A
	// load that outlives it may be overtaken by another loader (and then
	// its result is not stored: fencing). Default DefaultLockTTL.
	LockTTL time.Duration
	// LoadTimeout bounds one load: the Loader's context, detached from
	// the callers' contexts, is cancelled after it. A Loader that has not
	// returned 1s later is abandoned (ErrLoaderAbandoned): its callers,
	// the entry's lock and Close stop waiting for it. Default LockTTL.
	// Policy.LoadTimeout overrides it for one Get.
	LoadTimeout time.Duration
	// WaitTimeout bounds how long a caller waits for a load running
	// elsewhere (another instance holds the lock). Then it gets the stale
	// copy if there is one, else it calls its Loader itself (without
	// storing the result). Default: the lock's TTL (LockTTL, or the
	// longer one of a Policy.LoadTimeout).
	WaitTimeout time.Duration
	// StaleWindow is how long a value is kept after its TTL, to be served
	// when waiting for a fresh one times out. Negative keeps none.
	// Negative (isError) results never keep a stale copy. Default
	// DefaultStaleWindow.
	StaleWindow time.Duration
	// Timeout is the deadline of one store operation: a read, a lock, a
	// commit, an unlock, a wait's subscription, one round trip of an
	// invalidation. A Get whose read or lock fails or times out is served
	// by its Loader without the store (Entry.StoreErr). Default
	// DefaultTimeout.
	Timeout time.Duration
	// BreakerFailures consecutive failed store operations (timeouts,
	// connection errors; not error replies) open the store's breaker:
	// operations are then skipped (ErrStoreSkipped), so an outage adds no
	// timeout to a Get, until a background probe (PING every
	// ProbeInterval) sees the store answer. Only stores that do I/O have
	// one (RedisStore). A failed or skipped invalidation opens it at
	// once, whatever the count, until it is replayed (see Invalidate).
	// Default DefaultBreakerFailures; negative: no breaker (and failed
	// invalidations are not remembered).
	BreakerFailures int
	// ProbeInterval is how often the probe of an open breaker runs.
	// Default DefaultProbeInterval.
	ProbeInterval time.Duration
	// MaxPendingInvalidations bounds the failed invalidations a Cache with
	// a breaker remembers for replay, counted in (scope, tag) pairs (see
	// Invalidate). A failed invalidation opens the breaker, and the probe
	// closes it only once every remembered one has been replayed on the
	// store. Past the bound a failed invalidation is lost (logged,
	// Stats.LostInvalidations): the store then stays unavailable (Gets
	// served by their Loader) until every entry it may have missed has
	// expired, that is for the longest life an entry of this Cache can
	// get (TTL or NegativeTTL, stale window, LoadTimeout and Timeout; a
	// day when this Cache has loaded nothing yet) after the loss. Other
	// instances know nothing of a lost invalidation. Default
	// DefaultMaxPendingInvalidations.
	MaxPendingInvalidations int
	// Beta scales XFetch early refresh: a value whose load took delta is
	// refreshed before expiry when now - delta*Beta*ln(rand()) >= expiry.
	// Larger refreshes earlier; negative disables early refresh. Default
	// DefaultBeta.
	Beta float64
	// PollInterval is how often a waiter re-checks when the store cannot
	// push wake-ups (Redis without sharded pub/sub). Default
	// DefaultPollInterval.
	PollInterval time.Duration
	// WarmConcurrency bounds the loaders Warm runs at once. Default
	// DefaultWarmConcurrency.
	WarmConcurrency int
	// Logger receives warnings (store errors, at most one line per 10s)
	// and loader panics. Default slog.Default().
	Logger *slog.Logger
}

// Policy says how one tool's results are cached (policy.ToolCache).
type Policy struct {
	// TTL is the fresh life of a successful result; it must be positive.
	TTL time.Duration
	// Jitter, in [0, 1], shortens each TTL by a random fraction in
	// [0, Jitter], so entries written together do not expire together.
	Jitter float64
	// NegativeTTL is the life of a negative result (Loader returned
	// negative: an isError tool result); 0 means negative results are not
	// stored. Jitter applies to it too.
	NegativeTTL time.Duration
	// Tags are the entry's rendered tags (see Tags.Render); Invalidate
	// with one of them drops the entry.
	Tags []string
	// LoadTimeout, when positive, bounds this Get's load instead of
	// Options.LoadTimeout, for a bound that follows the caller's
	// configuration (the gateway's changes on reload). The entry's lock is
	// then held as long, never less than Options.LockTTL, and its fence
	// longer, so that no load that may still commit is overtaken.
	LoadTimeout time.Duration
}

func (p *Policy) validate() error {
	switch {
	case p.TTL <= 0:
		return fmt.Errorf("%w: TTL %v is not positive", ErrInvalidPolicy, p.TTL)
	case !(p.Jitter >= 0 && p.Jitter <= 1):
		return fmt.Errorf("%w: jitter %v outside [0, 1]", ErrInvalidPolicy, p.Jitter)
	case p.NegativeTTL < 0:
		return fmt.Errorf("%w: negative NegativeTTL %v", ErrInvalidPolicy, p.NegativeTTL)
	case p.LoadTimeout < 0:
		return fmt.Errorf("%w: negative LoadTimeout %v", ErrInvalidPolicy, p.LoadTimeout)
	}
	return nil
}

// Loader computes a value on a miss: it calls the tool. negative marks a
// result that is a tool-level failure (MCP isError: true), stored for
// Policy.NegativeTTL. An error (timeout, protocol error, 429, upstream 5xx)
// is returned to the callers and never stored. ctx is detached from the
// callers (one caller giving up does not cancel the load others wait for)
// and carries the callers' values; it ends after Options.LoadTimeout (or
// Policy.LoadTimeout). A Loader that ignores its end is abandoned soon
// after (ErrLoaderAbandoned) and runs on with nobody waiting for it. The Cache keeps value: the Loader
// must not modify it after returning.
// An early refresh's ctx is marked (Refreshing).
type Loader func(ctx context.Context) (value []byte, negative bool, err error)

// refreshKey marks the context of an early refresh's Loader.
type refreshKey struct{}

// Refreshing reports whether ctx is a Loader's in an early (XFetch)
// refresh: the load runs for the cache alone, started by a hit that was
// answered at once, so no caller waits for it and it may well run after
// the Get that started it returned. A Loader that acts for its caller (its
// request's id, its connection) must then act for itself.
func Refreshing(ctx context.Context) bool { return ctx.Value(refreshKey{}) != nil }

// Entry is a cached or freshly loaded value. Value is shared with other
// callers: do not modify it.
type Entry struct {
	Value    []byte
	Negative bool // a negative (isError) result
	// TTL is the remaining fresh life: the full TTL after a load, zero or
	// negative when the value is stale, zero when the value was not stored.
	TTL time.Duration
	// StoreErr is nil unless the value was loaded without the store
	// because a store operation failed, timed out, or was skipped by the
	// breaker (errors.Is(StoreErr, ErrStoreSkipped)): the call was served
	// as if the tool were not cached.
	StoreErr error
}

// Source says where an Entry came from.
type Source uint8

// Sources. A Get that fails returns Source 0.
const (
	// Miss: this caller's flight ran the Loader.
	Miss Source = iota + 1
	// Hit: a fresh stored value.
	Hit
	// Stale: waiting for another loader timed out; the stale copy.
	Stale
	// Coalesced: a value another caller loaded, in this process (single
	// flight) or in another instance sharing the store (lock and wake-up).
	Coalesced
)

func (s Source) String() string {
	switch s {
	case Miss:
		return "miss"
	case Hit:
		return "hit"
	case Stale:
		return "stale"
	case Coalesced:
		return "coalesced"
	}
	return "Source(" + strconv.Itoa(int(s)) + ")"
}

// Stats are counters since New. Hits + Misses + Stale + Coalesced is the
// number of successful Gets.
type Stats struct {
	Hits, Misses, Stale, Coalesced int64
	Loads                          int64 // Loader calls, including early refreshes and Warm
	Refreshes                      int64 // early (XFetch) refreshes that took the lock
	Uncached                       int64 // loads whose result could not be stored (wait timed out without a stale copy, store error)
	Rejected                       int64 // commits refused by the fence (a newer load or an invalidation won), or not kept by the store (MemoryOptions.MaxBytes, RedisOptions.MaxValueBytes)
	StoreErrors                    int64 // store operations that failed or timed out
	// Degraded counts successful Gets served without the store (Entry.StoreErr
	// set); they are counted in Misses or Coalesced too.
	Degraded int64
	// StoreSkipped counts store operations not attempted: the breaker was
	// open.
	StoreSkipped int64
	// FailedInvalidations counts the (scope, tag) pairs of Invalidate
	// calls that failed or were skipped by the breaker, remembered for
	// replay unless over Options.MaxPendingInvalidations (then also in
	// LostInvalidations). ReplayedInvalidations counts the remembered
	// pairs the probe replayed (a pair that failed again before its replay
	// is replayed once); PendingInvalidations is how many wait for their
	// replay now. Only a Cache with a breaker has any.
	FailedInvalidations, ReplayedInvalidations, LostInvalidations int64
	PendingInvalidations                                          int64
}

type counters struct {
	hits, misses, stale, coalesced                    atomic.Int64
	loads, refreshes, uncached, rejected, storeErrors atomic.Int64
	degraded                                          atomic.Int64
}

// Cache is a tool-result cache (cache-aside with single flight, a
// distributed lock with fencing, XFetch early refresh and tags) over a
// Store. It is safe for concurrent use. Build it with New.
type Cache struct {
	store       Store
	guard       *guardedStore // the breaker around store; nil: none
	remote      bool          // the store does I/O: bound each call by timeout
	lockTTL     time.Duration
	loadTimeout time.Duration
	wait        time.Duration
	waitSet     bool // Options.WaitTimeout given: it does not follow a Policy's lock
	stale       time.Duration
	timeout     time.Duration
	poll        time.Duration
	fenceTTL    time.Duration
	beta        float64
	warmN       int
	log         *slog.Logger

	tokenPrefix string
	tokenSeq    atomic.Uint64
	lastLog     atomic.Int64
	stats       counters
	// invalidations counts the Invalidate calls of this Cache. A flight
	// started before one may be loading what the invalidation's write
	// replaced: a Get that begins after Invalidate returned must not join
	// it (see join).
	invalidations atomic.Uint64

	mu         sync.Mutex
	flights    map[string]*flight // the newest flight of each entry key
	refreshing map[string]struct{}
	closed     bool
	wg         sync.WaitGroup
}

// flight is one in-process load of a key that every concurrent Get of the
// key waits for.
type flight struct {
	done  chan struct{}
	gen   uint64 // Cache.invalidations when the flight started
	entry Entry
	src   Source
	// fenced: the load's commit was refused by the fence (see join).
	fenced bool
	err    error
}

// New returns a Cache over store, behind a breaker (see
// Options.BreakerFailures) when store does I/O. It fails with
// ErrInvalidOptions on a negative duration, a NaN Beta, a negative
// WarmConcurrency or MaxPendingInvalidations.
func New(store Store, opts *Options) (*Cache, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidOptions)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	for name, d := range map[string]time.Duration{"LockTTL": o.LockTTL, "LoadTimeout": o.LoadTimeout,
		"WaitTimeout": o.WaitTimeout, "Timeout": o.Timeout, "PollInterval": o.PollInterval, "ProbeInterval": o.ProbeInterval} {
		if d < 0 {
			return nil, fmt.Errorf("%w: negative %s %v", ErrInvalidOptions, name, d)
		}
	}
	if math.IsNaN(o.Beta) || math.IsInf(o.Beta, 0) || o.WarmConcurrency < 0 || o.MaxPendingInvalidations < 0 {
		return nil, fmt.Errorf("%w: Beta %v, WarmConcurrency %d, MaxPendingInvalidations %d",
			ErrInvalidOptions, o.Beta, o.WarmConcurrency, o.MaxPendingInvalidations)
	}
	_, local := store.(*MemoryStore)
	c := &Cache{
		store:       store,
		remote:      !local,
		lockTTL:     or(o.LockTTL, DefaultLockTTL),
		stale:       or(o.StaleWindow, DefaultStaleWindow),
		timeout:     or(o.Timeout, DefaultTimeout),
		poll:        or(o.PollInterval, DefaultPollInterval),
		beta:        o.Beta,
		warmN:       o.WarmConcurrency,
		log:         o.Logger,
		flights:     make(map[string]*flight),
		refreshing:  make(map[string]struct{}),
		tokenPrefix: randomHex(12) + ".",
	}
	c.loadTimeout = or(o.LoadTimeout, c.lockTTL)
	c.wait, c.waitSet = or(o.WaitTimeout, c.lockTTL), o.WaitTimeout != 0
	c.stale = max(c.stale, 0)
	c.fenceTTL = fenceTTL(c.loadTimeout, c.lockTTL)
	if c.beta == 0 {
		c.beta = DefaultBeta
	}
	if c.warmN == 0 {
		c.warmN = DefaultWarmConcurrency
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	if p, ok := store.(pinger); ok && o.BreakerFailures >= 0 {
		failures := o.BreakerFailures
		if failures == 0 {
			failures = DefaultBreakerFailures
		}
		maxPending := o.MaxPendingInvalidations
		if maxPending == 0 {
			maxPending = DefaultMaxPendingInvalidations
		}
		g, err := newGuardedStore(store, p, failures, maxPending, or(o.ProbeInterval, DefaultProbeInterval), c.timeout, c.log)
		if err != nil {
			return nil, err
		}
		c.guard, c.store = g, g
	}
	return c, nil
}

// fenceTTL is the life of the fence a load (bounded by load, under a lock
// of lock) takes: it outlives the load (a load that outlives its fence is
// refused at commit), plus room for clock-free slack.
func fenceTTL(load, lock time.Duration) time.Duration { return load + lock + time.Minute }

// bounds are the time limits of one load.
type bounds struct {
	load  time.Duration // the Loader's context; a longer load is not stored
	lock  time.Duration // the entry's lock
	fence time.Duration // the entry's fence
	wait  time.Duration // a wait for another loader's value
}

// bounds returns the limits of a load under pol: the Options', unless
// pol.LoadTimeout sets its own. The lock then covers the whole load (else
// a load still running could be overtaken, and its result not stored),
// and so does a waiter's wait unless Options.WaitTimeout says otherwise.
func (c *Cache) bounds(pol *Policy) bounds {
	b := bounds{load: c.loadTimeout, lock: c.lockTTL, fence: c.fenceTTL, wait: c.wait}
	if pol.LoadTimeout <= 0 {
		return b
	}
	b.load = pol.LoadTimeout
	b.lock = max(c.lockTTL, b.load)
	b.fence = fenceTTL(b.load, b.lock)
	if !c.waitSet {
		b.wait = b.lock
	}
	return b
}

func or(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand documents it)
	return hex.EncodeToString(b)
}

// token returns a lock owner token unique across processes.
func (c *Cache) token() string {
	return c.tokenPrefix + strconv.FormatUint(c.tokenSeq.Add(1), 36)
}

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	s := &c.stats
	st := Stats{
		Hits: s.hits.Load(), Misses: s.misses.Load(), Stale: s.stale.Load(), Coalesced: s.coalesced.Load(),
		Loads: s.loads.Load(), Refreshes: s.refreshes.Load(), Uncached: s.uncached.Load(),
		Rejected: s.rejected.Load(), StoreErrors: s.storeErrors.Load(), Degraded: s.degraded.Load(),
		StoreSkipped: c.skipped(),
	}
	if c.guard != nil {
		p := c.guard.pend
		st.FailedInvalidations, st.ReplayedInvalidations = p.failed.Load(), p.replayed.Load()
		st.LostInvalidations, st.PendingInvalidations = p.lost.Load(), p.pending()
	}
	return st
}

func (c *Cache) skipped() int64 {
	if c.guard == nil {
		return 0
	}
	return c.guard.br.Skipped()
}

// StoreAvailable reports whether store operations are attempted: false
// while the store's breaker is open, which includes while failed
// invalidations wait for their replay (see Invalidate).
func (c *Cache) StoreAvailable() bool { return c.guard == nil || c.guard.available() }

// Close stops early refreshes and the breaker's probe, and waits for the
// loads in flight (each bounded by its LoadTimeout, plus 1s for the Loader
// to notice: a Loader still running then is abandoned, see
// ErrLoaderAbandoned, and Close does not wait for it) and for the releases
// of locks whose commit the breaker skipped (each bounded by Timeout).
// Later Gets fail with ErrClosed. The store is not closed.
func (c *Cache) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.wg.Wait()
	if c.guard != nil {
		c.guard.close()
	}
	return nil
}

// Get returns the value of key: the stored value when fresh (Hit),
// otherwise the result of load, run once for all concurrent Gets of the key
// in this process and, through the store's lock, in every process sharing
// the store. A fresh value close to expiry is refreshed in the background
// (XFetch) while callers keep getting it.
//
// A caller whose ctx ends stops waiting and gets ctx's error; the load goes
// on for the others. A caller whose read fails because its ctx ended gets
// ctx's error and starts no load: nobody waits for one, and that failure
// says nothing about the store. A Loader error is returned to every caller
// waiting for that load and is never stored. Errors of the store never
// fail a Get: when the read or the lock fails, times out or is skipped by
// the breaker, the value is loaded without the store (Entry.StoreErr,
// Stats.Degraded), with no further store operation for that Get.
func (c *Cache) Get(ctx context.Context, key Key, load Loader, pol Policy) (Entry, Source, error) {
	if key.IsZero() {
		return Entry{}, 0, ErrInvalidKey
	}
	if load == nil {
		return Entry{}, 0, fmt.Errorf("%w: nil loader", ErrInvalidPolicy)
	}
	if err := pol.validate(); err != nil {
		return Entry{}, 0, err
	}
	rec, ok, err := c.read(ctx, key, pol.Tags)
	if err != nil && (ctx.Err() != nil || errors.Is(err, errCallersDeadline)) {
		// The caller left (or its deadline passed) during the read: a
		// flight started now would load without the store for nobody,
		// and the callers joining it would get a value it does not keep.
		if ctx.Err() != nil {
			return Entry{}, 0, ctx.Err()
		}
		return Entry{}, 0, context.DeadlineExceeded
	}
	if ok && rec.fresh() > 0 {
		c.stats.hits.Add(1)
		if c.early(&rec) {
			c.refresh(ctx, key, load, pol, rec.fence)
		}
		return rec.entry(), Hit, nil
	}
	return c.join(ctx, key, load, pol, err)
}

// read is the store's read of key (tags: the caller's policy's, see
// Store.read) under the operation timeout; an error comes with ok false,
// and is counted and logged unless ctx ended (the caller's doing).
func (c *Cache) read(ctx context.Context, key Key, tags []string) (record, bool, error) {
	rctx := ctx
	if c.remote {
		var cancel context.CancelFunc
		rctx, cancel = withOpTimeout(ctx, c.timeout)
		defer cancel()
	}
	rctx, span := c.storeSpan(rctx, "read")
	rec, ok, err := c.store.read(rctx, key, tags)
	endStoreSpan(span, err)
	if err != nil {
		switch {
		case errors.Is(err, context.DeadlineExceeded) && callersDeadline(rctx):
			// rueidis may time the command out a moment before ctx is
			// done: the caller's deadline all the same.
			return record{}, false, errCallersDeadline
		case ctx.Err() == nil:
			c.storeError("read", err)
		}
		return record{}, false, err
	}
	return rec, ok, nil
}

// errCallersDeadline is read's error when the caller's own deadline, not
// the operation's, ended it.
var errCallersDeadline = fmt.Errorf("cache: the caller's deadline passed during the read: %w", context.DeadlineExceeded)

// early is the XFetch condition: now - delta*beta*ln(U) >= expiry, that is
// delta*beta*(-ln U) >= the remaining fresh life.
func (c *Cache) early(rec *record) bool {
	if c.beta < 0 {
		return false
	}
	return float64(rec.delta)*c.beta*-math.Log(mrand.Float64()) >= float64(rec.fresh())
}

// Invalidate drops scope's entries tagged with any of tags (rendered tags,
// see Tags.Render) and returns how many stored entries it deleted. Loads of
// those entries in flight cannot store what they loaded (their fence is
// bumped), and a Get of this Cache that begins after Invalidate returned
// does not join a flight that began before it (it loads anew). An entry of
// another scope is never touched: invalidate a tag of shared entries with
// Shared(), a tenant's with Tenant(tenant).
//
// An invalidation that fails (a timeout, a connection error, an error
// reply, ctx ending) or that the breaker skips (ErrStoreSkipped) is not
// lost, when the store has a breaker (a RedisStore, unless
// Options.BreakerFailures is negative): the Cache remembers its scope and
// tags and treats the store as unavailable (the breaker opens at once, even
// after a single failure, and Gets are served by their Loader, uncached)
// until the breaker's probe has replayed every remembered invalidation on
// the store; a replay that fails keeps the breaker open until the next
// probe. So an entry the failed invalidation missed is never served again,
// by this instance or, once replayed, by any other (until the replay, the
// other instances' view of the store is not affected). Over
// Options.MaxPendingInvalidations remembered pairs, see there. The error
// is still returned: the invalidation did not happen yet.
func (c *Cache) Invalidate(ctx context.Context, scope Scope, tags []string) (int, error) {
	if len(tags) == 0 {
		return 0, nil
	}
	// Counted once the store is done (even when it failed part-way: what
	// it did is unknown), so that every flight that may have been served
	// the value it deleted, or may have loaded before the write, is one
	// that began before the count and that later Gets do not join.
	defer c.invalidations.Add(1)
	var step time.Duration
	if c.remote {
		step = c.timeout
	}
	ctx, span := c.storeSpan(ctx, "invalidate")
	n, err := c.store.invalidate(ctx, scope, tags, step)
	endStoreSpan(span, err)
	if err != nil {
		return n, fmt.Errorf("cache: invalidate: %w", err)
	}
	return n, nil
}

// storeError counts err and logs it at most once per 10 seconds. A skipped
// operation is neither: the breaker counts it and logs its state changes.
func (c *Cache) storeError(op string, err error) {
	if errors.Is(err, ErrStoreSkipped) {
		return
	}
	n := c.stats.storeErrors.Add(1)
	now := time.Now().UnixNano()
	last := c.lastLog.Load()
	if now-last < int64(10*time.Second) || !c.lastLog.CompareAndSwap(last, now) {
		return
	}
	c.log.Warn("cache: store error; serving without the cache where needed", "op", op, "err", err, "store_errors", n)
}
