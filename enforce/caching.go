package enforce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/internal/jsonscan"
	"github.com/mcpgate/mcpgate/policy"
)

// toolCaching is what the engine knows about caching one tool.
type toolCaching struct {
	policy      *policy.ToolCache // nil: results not cached
	tags        *cache.Tags       // tag templates of cached entries
	invalidates *cache.Tags       // tags dropped after a successful call
	// loadTimeout bounds a load of a cached result: CacheLoadTimeout of
	// the config this was compiled from, so that a reload changing the
	// calls' timeouts changes it too.
	loadTimeout time.Duration
}

// CacheLoadTimeout is how long one load of a cached tool may take under
// cfg: as long as the call it stands for may. That is
// upstream.max_duration when set, else the longest idle timeout of a call
// (upstream.timeout, an upstream's or a tool's timeout): a load quiet for
// longer has failed anyway, and one streaming for longer is rare enough to
// go uncached. Never below cache.DefaultLockTTL. The entry's lock is held
// as long (a load that outlived its lock would be overtaken and not
// stored).
func CacheLoadTimeout(cfg *policy.Config) time.Duration {
	if cfg.Upstream.MaxDuration > 0 {
		return max(cfg.Upstream.MaxDuration, cache.DefaultLockTTL)
	}
	return max(cfg.LongestCallTimeout(), cache.DefaultLockTTL)
}

// compileCaching compiles the cache settings of every tool of cfg.
func compileCaching(cfg *policy.Config) (map[string]toolCaching, bool, error) {
	out := make(map[string]toolCaching)
	sharedTags := false
	load := CacheLoadTimeout(cfg)
	for name, t := range cfg.Tools {
		var tc toolCaching
		var err error
		if t.Cache != nil {
			tc.policy, tc.loadTimeout = t.Cache, load
			if tc.tags, err = cache.CompileTags(t.Cache.Tags); err != nil {
				return nil, false, fmt.Errorf("tools.%s.cache.tags: %w", name, err)
			}
			sharedTags = sharedTags || (t.Cache.Shared && len(t.Cache.Tags) > 0)
		}
		if len(t.Invalidates) > 0 {
			if tc.invalidates, err = cache.CompileTags(t.Invalidates); err != nil {
				return nil, false, fmt.Errorf("tools.%s.invalidates: %w", name, err)
			}
		}
		if tc.policy != nil || tc.invalidates != nil {
			out[name] = tc
		}
	}
	return out, sharedTags, nil
}

// ErrArgumentsNotCanonical means a tools/call's arguments have no
// canonical form (a member spelled twice, mostly) where governing the call
// needs one; CheckArguments refuses it.
var ErrArgumentsNotCanonical = errors.New("enforce: arguments have no canonical form")

// CheckArguments reports whether a tools/call of tool with arguments args
// can be governed. Arguments with no canonical form (a member spelled
// twice, ...) cannot be, and the error wraps ErrArgumentsNotCanonical:
//   - for a tool whose calls invalidate cache entries (the error also
//     wraps cache.ErrInvalidArguments): it could not name the entries it
//     makes stale while the upstream, keeping one of the twins, runs the
//     call;
//   - for every tool while the loop breaker counts identical calls: such
//     calls have no fingerprint that spacing or spelling cannot change, so
//     an agent repeating one could never trip the breaker.
//
// Nil otherwise.
func (e *Engine) CheckArguments(tool string, args json.RawMessage) error {
	cfg := e.cfg.Load()
	if tc, ok := cfg.caching[tool]; ok && tc.invalidates != nil {
		if _, err := tc.invalidates.Render(args); errors.Is(err, cache.ErrInvalidArguments) {
			return fmt.Errorf("%w: %w", ErrArgumentsNotCanonical, err)
		}
	}
	if cfg.cfg.Breaker.IdenticalCalls.Count > 1 {
		if _, err := jsonscan.Canonical(args); err != nil {
			return fmt.Errorf("%w (the loop breaker compares calls by their canonical arguments): %v", ErrArgumentsNotCanonical, err)
		}
	}
	return nil
}

// invalidateAfter drops the cache entries a successful call of a mutating
// tool made stale. For a forwarded call it runs before the answer is
// relayed (Ticket.Answered), so that the caller's next read
// cannot get a stale entry.
func (e *Engine) invalidateAfter(ctx context.Context, cp *compiled, tenant string, tc toolCaching, args json.RawMessage) {
	tags, err := tc.invalidates.Render(args)
	if err != nil || len(tags) == 0 {
		return
	}
	// The caller's answer waits for this: bounded like a slot release.
	ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	if _, err := e.invalidate(ctx, cp, tenant, tags); err != nil {
		e.log.Warn("cache invalidation failed", "tenant", tenant, "tags", tags, "err", err)
	}
}

// invalidate drops the tenant's entries with tags, and the shared entries
// with them when any shared tool is tagged. The shared scope is asked even
// when the tenant's failed: the cache remembers (and replays) only the
// scopes whose invalidation failed, so a shared scope never asked would
// keep serving entries the mutation made stale once the store is back.
func (e *Engine) invalidate(ctx context.Context, cp *compiled, tenant string, tags []string) (int, error) {
	n, err := e.cache.Invalidate(ctx, cache.Tenant(tenant), tags)
	if !cp.sharedTags {
		return n, err
	}
	m, err2 := e.cache.Invalidate(ctx, cache.Shared(), tags)
	return n + m, errors.Join(err, err2)
}

// Invalidate drops tenant's cache entries tagged with any of tags, and the
// shared entries with them when a shared cached tool is tagged. It returns
// how many entries were dropped.
func (e *Engine) Invalidate(ctx context.Context, tenant string, tags []string) (int, error) {
	return e.invalidate(ctx, e.cfg.Load(), tenant, tags)
}

// CachePlan is how a tools/call's result is cached: under Key, with
// Policy. See Ticket.CachePlan.
type CachePlan struct {
	Key    cache.Key
	Policy cache.Policy
}

// CachePlan reports whether the admitted call's result may be served from
// the result cache, and how. Cached answers pass auth, limits, quota and
// the breaker like any call (and are charged the tool's cost); only the
// load that fills the cache does the work, through Cache().Get, which runs
// one load per key across concurrent callers (and across instances on a
// Redis cache). Entries are keyed per tenant unless the tool's cache is
// shared, so an answer never crosses tenants. The load is bounded by the
// config in force (CacheLoadTimeout), not the cache's bound from start.
func (t *Ticket) CachePlan() (CachePlan, bool) {
	tc := t.caching
	if tc.policy == nil || t.settled() {
		return CachePlan{}, false
	}
	scope := cache.Tenant(t.call.Tenant)
	if tc.policy.Shared {
		scope = cache.Shared()
	}
	key, err := cache.NewKey(scope, t.call.Name, t.call.Arguments)
	if err != nil {
		return CachePlan{}, false
	}
	tags, err := tc.tags.Render(t.call.Arguments)
	if err != nil {
		tags = nil // the entry is still cached, just not tagged
		t.e.log.Warn("cache tags cannot be rendered", "tool", t.call.Name, "err", err)
	}
	return CachePlan{Key: key, Policy: cache.Policy{TTL: tc.policy.TTL, Jitter: tc.policy.Jitter,
		NegativeTTL: tc.policy.NegativeTTL, Tags: tags, LoadTimeout: tc.loadTimeout}}, true
}
