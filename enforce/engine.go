// Package enforce is mcpgate's enforcement engine. It decides whether one
// MCP request may run, and settles what it cost once it has run:
//
//	ticket, d := engine.Admit(ctx, call) // before the work
//	if !d.Allowed { answer with d.Denial() or 503 when d.Unavailable }
//	... do the work ...
//	ticket.Done(ctx, outcome)            // after it, always
//
// Admit applies, in one decision, the loop breaker, the rate-limit rules of
// the caller's tier (tenant rules, global rules, the usage meter and the
// breaker in one store request, all or nothing: see
// limit.GuardedStore.Evaluate), the monthly quota, the local denial cache,
// the store breaker and each tool's on_error policy. Done releases concurrency
// slots, corrects the charge from the cost the tool reported, tells the loop
// breaker how the call ended, and drops the cache entries a mutating tool
// made stale. The engine keeps the live usage meters and flushes them to the
// durable usage store.
//
// Nothing here knows HTTP: the gateway (package gateway) and the go-sdk
// middleware (package gosdk) are two adapters over the same Engine, and
// both count on the same counters when they share a Redis store.
package enforce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/memstore"
	"github.com/mcpgate/mcpgate/metrics"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/usage"
)

// Options configures an Engine. Config is required; a nil or zero field
// otherwise means the documented default.
type Options struct {
	// Config is the policy: tiers, rules, tools, breaker, store and usage
	// settings. SetConfig replaces it later.
	Config *policy.Config
	// Shared is the store shared by all instances (Redis). Nil means
	// in-process only: one instance, counters in Local.
	Shared limit.GuardedStore
	// Probe checks that Shared answers (a PING). It closes the store breaker
	// after an outage. Required with Shared.
	Probe func(ctx context.Context) error
	// Local is the in-process store: the store itself without Shared, the
	// fallback of on_error: local with it. Nil: a new memstore owned (and
	// closed) by the Engine.
	Local limit.GuardedStore
	// Usage is the durable usage store. When set, every admitted tools/call
	// is metered per tenant and month, monthly quotas are enforced, and the
	// live meters are flushed every Config.Usage.FlushInterval. Nil: no
	// metering, no quotas.
	Usage usage.Store
	// Cache holds the results of tools configured with a cache. Nil: an
	// in-process cache owned (and closed) by the Engine.
	Cache *cache.Cache
	// Logger receives the engine's logs; nil: slog.Default().
	Logger *slog.Logger
	// Metrics receives the engine's metrics; nil: a new set.
	Metrics *metrics.Metrics
	// Tracer makes a "mcpgate.admit" span per decision; nil: no span.
	Tracer trace.Tracer
	// Now is the clock of periods, headers and the in-process caches; nil:
	// time.Now.
	Now func() time.Time
	// OnBreakerOpened is called (from the request's goroutine) when a loop
	// breaker opens; nil: it is only logged and counted.
	OnBreakerOpened func(limit.BreakerSpec, limit.BreakerState)
}

// ErrStoreDown means the shared store's breaker is open: the store failed
// repeatedly and is skipped until a probe answers. Decisions then follow
// each tool's on_error policy.
var ErrStoreDown = errors.New("enforce: limit store unavailable (breaker open)")

// releaseTimeout bounds what Done and a refund wait for the store.
const releaseTimeout = time.Second

// compiled is the configuration in force with what is derived from it.
type compiled struct {
	cfg        *policy.Config
	caching    map[string]toolCaching
	sharedTags bool // a shared cached tool has tags: invalidations also cover the shared scope
}

// Engine is mcpgate's enforcement engine. It is safe for concurrent use.
// Close it when done: it flushes usage a last time.
type Engine struct {
	cfg      atomic.Pointer[compiled]
	lim      *limiter
	guard    *guardedStore // nil without a shared store
	ownLocal *memstore.Store
	cache    *cache.Cache
	ownCache bool
	// dropCacheStats takes the cache's counters out of the metrics.
	dropCacheStats func()
	log            *slog.Logger
	metrics        *metrics.Metrics
	now            func() time.Time
	opened         func(limit.BreakerSpec, limit.BreakerState)

	// storeUp is told (without waiting) when the store breaker closes
	// again; the meterer then places at once what it held back.
	storeUp chan struct{}

	stopMeter context.CancelFunc // nil without metering
	meterDone chan struct{}
	closeOnce sync.Once
}

// New builds an Engine from opts and starts its usage flusher.
func New(opts Options) (*Engine, error) {
	if opts.Config == nil {
		return nil, errors.New("enforce: Options.Config is required")
	}
	if opts.Shared != nil && opts.Probe == nil {
		return nil, errors.New("enforce: Options.Probe is required with a Shared store")
	}
	e := &Engine{log: opts.Logger, metrics: opts.Metrics, now: opts.Now, opened: opts.OnBreakerOpened}
	if e.log == nil {
		e.log = slog.Default()
	}
	if e.metrics == nil {
		e.metrics = metrics.New()
	}
	if e.now == nil {
		e.now = time.Now
	}
	if err := e.SetConfig(opts.Config); err != nil {
		return nil, err
	}
	local := opts.Local
	if local == nil {
		ms, err := memstore.New(nil)
		if err != nil {
			return nil, err
		}
		e.ownLocal, local = ms, ms
	}
	e.lim = &limiter{local: local, denials: newDenialCache(0, e.now), log: e.log, stats: e.metrics, tracer: opts.Tracer,
		closing: make(chan struct{})}
	e.lim.breakers = newBreakerCache(e.now, e.breakerOpened)
	if opts.Shared != nil {
		e.metrics.StoreUp.Set(1)
		e.storeUp = make(chan struct{}, 1)
		guard, err := newGuardedStore(opts.Shared, opts.Probe, opts.Config.Store.Timeout, e.log, func(up bool) {
			v := 0.0
			if up {
				v = 1
				select {
				case e.storeUp <- struct{}{}:
				default: // already told
				}
			}
			e.metrics.StoreUp.Set(v)
		})
		if err != nil {
			e.closeOwned()
			return nil, err
		}
		guard.tracer = opts.Tracer
		e.guard, e.lim.shared = guard, guard
	}
	if err := e.openCache(opts.Cache); err != nil {
		e.closeOwned()
		return nil, err
	}
	if opts.Usage != nil {
		e.startMetering(opts.Usage, opts.Config.Usage.FlushInterval)
	}
	return e, nil
}

func (e *Engine) openCache(c *cache.Cache) error {
	if c == nil {
		cs, err := cache.NewMemoryStore(nil)
		if err != nil {
			return err
		}
		if c, err = cache.New(cs, &cache.Options{Logger: e.log}); err != nil {
			return err
		}
		e.ownCache = true
	}
	e.cache = c
	e.dropCacheStats = e.metrics.CacheInvalidations.Add(func() metrics.InvalidationCounts {
		st := c.Stats()
		return metrics.InvalidationCounts{Failed: st.FailedInvalidations, Replayed: st.ReplayedInvalidations,
			Lost: st.LostInvalidations, Pending: st.PendingInvalidations}
	})
	return nil
}

func (e *Engine) startMetering(us usage.Store, every time.Duration) {
	if every <= 0 {
		every = usage.DefaultInterval
	}
	var store limit.MeteredStore = e.lim.local
	if e.guard != nil {
		store = e.guard
	}
	e.lim.meters = newMeterer(store, us, every, e.log, e.metrics)
	e.lim.meters.guard = e.guard
	e.lim.meters.storeUp = e.storeUp // nil without a shared store: never told
	ctx, cancel := context.WithCancel(context.Background())
	e.stopMeter, e.meterDone = cancel, make(chan struct{})
	go func() {
		defer close(e.meterDone)
		e.lim.meters.run(ctx)
	}()
}

// SetConfig replaces the configuration (a reload). Decisions in progress
// finish under the old one. The store, usage and cache settings are read by
// New only. The local denial cache is cleared: a rule may have changed.
func (e *Engine) SetConfig(cfg *policy.Config) error {
	caching, sharedTags, err := compileCaching(cfg)
	if err != nil {
		return fmt.Errorf("enforce: %w", err)
	}
	e.cfg.Store(&compiled{cfg: cfg, caching: caching, sharedTags: sharedTags})
	if e.lim != nil {
		e.lim.denials.forget()
	}
	return nil
}

// Config returns the configuration in force.
func (e *Engine) Config() *policy.Config { return e.cfg.Load().cfg }

// Close flushes usage a last time and releases what the Engine owns (its
// memory store and cache, the store breaker's probe). It does not close
// the stores passed in Options. Stop admitting calls first, so that none
// is admitted after the final flush. A call admitted before and settled
// after (Ticket.Done) writes its cost correction to the usage store at
// once, no flush being left to do it; what cannot be written is counted
// in mcpgate_unmetered_calls_total.
func (e *Engine) Close() error {
	var err error
	e.closeOnce.Do(func() {
		close(e.lim.closing) // failed releases are no longer tried again
		e.lim.retries.Wait()
		if e.stopMeter != nil {
			// the final flush: what was admitted reaches the usage store
			e.stopMeter()
			<-e.meterDone
		}
		err = e.closeOwned()
	})
	return err
}

func (e *Engine) closeOwned() error {
	var err error
	if e.dropCacheStats != nil {
		e.dropCacheStats()
	}
	if e.ownCache && e.cache != nil {
		err = e.cache.Close()
	}
	if e.guard != nil {
		e.guard.Close()
	}
	if e.ownLocal != nil {
		err = errors.Join(err, e.ownLocal.Close())
	}
	return err
}

// breakerOpened logs and counts a loop breaker that just opened, then
// tells Options.OnBreakerOpened.
func (e *Engine) breakerOpened(b limit.BreakerSpec, st limit.BreakerState) {
	e.metrics.BreakersOpened.WithLabelValues(st.Reason).Inc()
	e.log.Warn("loop breaker opened: the agent's calls are refused until the cooldown ends",
		"tenant", b.Tenant, "subject", b.Subject, "breaker", b.ID, "reason", st.Reason,
		"denials", st.Denials, "failures", st.Failures, "identical", st.Identical, "cooldown", st.Cooldown)
	if e.opened != nil {
		e.opened(b, st)
	}
}

// Store returns the store that holds the counters: the shared store, or
// the in-process one without it.
func (e *Engine) Store() limit.GuardedStore {
	if e.guard != nil {
		return e.guard
	}
	return e.lim.local
}

// Stores returns every store that may hold counters: the shared store
// first (when there is one), then the in-process store (a fallback under
// on_error: local).
func (e *Engine) Stores() []limit.GuardedStore {
	if e.guard != nil {
		return []limit.GuardedStore{e.guard, e.lim.local}
	}
	return []limit.GuardedStore{e.lim.local}
}

// StoreAvailable reports whether the shared store is in use (its breaker
// closed). Always true without a shared store.
func (e *Engine) StoreAvailable() bool { return e.guard == nil || e.guard.Available() }

// Cache returns the result cache.
func (e *Engine) Cache() *cache.Cache { return e.cache }

// ForgetDenials clears the local denial cache (after counters were reset).
func (e *Engine) ForgetDenials() { e.lim.denials.forget() }

// ForgetBreaker drops what this instance remembers of the loop breaker
// key (after an operator reset it in the store).
func (e *Engine) ForgetBreaker(key string) { e.lim.breakers.forget(key) }
