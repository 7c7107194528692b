package enforce

import (
	"container/list"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// DefaultDenialCacheSize bounds the local denial cache (entries).
const DefaultDenialCacheSize = 100_000

// DenialCacheHold caps how long a denial is answered in process before the
// store is asked again, however far its retry time. What can admit a denied
// key before its retry time happens on other instances too (an operator's
// POST /admin/limits/reset, a refund, a reload that raised the limit), and
// this instance hears of it only from the store: the cap bounds how long
// it keeps denying after that. A runaway agent on a denied key then costs
// the store one call per DenialCacheHold per instance, instead of one per
// call.
const DenialCacheHold = time.Second

// denialCache remembers, per counter key, that the shared store denied a
// request of some cost until a retry time. Until then a request of at least
// that cost on the same key is denied in-process: a runaway agent hammering a
// denied key costs the store nothing. Only exact retry times are cached
// (never a concurrency denial, whose slots may free at any moment), so the
// cache never admits anything and denies only what the store would deny
// unless a refund intervenes. An entry lives until the retry time or for
// DenialCacheHold, whichever comes first.
//
// The key of an entry is the counter's key, which names the rule, its scope
// and the owner (keyspace.Counter), and the entry holds the rule that
// denied: a counter key does not name the rule's limit, so tiers whose
// rules share a name and algorithm share a counter (a tenant moving between
// tiers keeps its count), and a denial under one tier's limit must not deny
// under another's. The cache is a bounded LRU: when full, the least
// recently used entry goes.
type denialCache struct {
	mu  sync.Mutex
	max int
	m   map[string]*list.Element // of *denialEntry
	lru list.List                // front: most recently used
	now func() time.Time
}

type denialEntry struct {
	key      string
	rule     limit.Rule // the rule that denied: the entry serves checks of it only
	cost     int64
	at       time.Time // when the store denied
	until    time.Time
	decision limit.Decision
}

func newDenialCache(size int, now func() time.Time) *denialCache {
	if size <= 0 {
		size = DefaultDenialCacheSize
	}
	return &denialCache{max: size, m: make(map[string]*list.Element), now: now}
}

// lookup returns a cached denial for any of checks' keys that covers cost.
func (c *denialCache) lookup(checks []limit.Check, cost int64) (limit.Decision, bool) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range checks {
		if ch.Rule.Shadow {
			continue
		}
		el, ok := c.m[ch.Key]
		if !ok {
			continue
		}
		e := el.Value.(*denialEntry)
		if !now.Before(e.until) {
			c.removeLocked(el)
			continue
		}
		if cost < e.cost || ch.Rule != e.rule {
			continue
		}
		c.lru.MoveToFront(el)
		d := e.decision
		elapsed := now.Sub(e.at)
		if d.RetryAfter != limit.Never {
			d.RetryAfter = max(d.RetryAfter-elapsed, time.Microsecond)
		}
		d.ResetAfter = max(d.ResetAfter-elapsed, 0)
		d.Results = nil
		return d, true
	}
	return limit.Decision{}, false
}

// remember caches a denial returned by the store for checks.
func (c *denialCache) remember(checks []limit.Check, cost int64, d limit.Decision) {
	if d.Allowed || d.Rule.Algorithm == limit.Concurrency {
		return
	}
	// The deciding check: its rule, not only its name (a tier rule and a
	// tool rule may share a name with different scopes and limits).
	var key string
	for i, ch := range checks {
		if ch.Rule == d.Rule && !ch.Rule.Shadow && i < len(d.Results) && !d.Results[i].Allowed {
			key = ch.Key
			break
		}
	}
	if key == "" {
		return
	}
	hold := DenialCacheHold
	if d.RetryAfter != limit.Never {
		hold = min(hold, d.RetryAfter)
	}
	now := c.now()
	e := &denialEntry{key: key, rule: d.Rule, cost: cost, at: now, until: now.Add(hold), decision: d}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[key]; ok {
		el.Value = e
		c.lru.MoveToFront(el)
		return
	}
	for len(c.m) >= c.max {
		c.removeLocked(c.lru.Back())
	}
	c.m[key] = c.lru.PushFront(e)
}

func (c *denialCache) removeLocked(el *list.Element) {
	delete(c.m, el.Value.(*denialEntry).key)
	c.lru.Remove(el)
}

// len is the number of entries held.
func (c *denialCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// forget drops every cached denial (on config reload: rules may have changed).
func (c *denialCache) forget() {
	c.mu.Lock()
	clear(c.m)
	c.lru.Init()
	c.mu.Unlock()
}
