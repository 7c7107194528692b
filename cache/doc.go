// Package cache is mcpgate's tool-result cache: cache-aside with negative
// entries, TTL jitter, stampede protection (in-process single flight plus a
// distributed lock with fencing), XFetch early refresh, tag invalidation and
// warming. It works on its own — an MCP server author can wrap any loader —
// and inside the gateway.
//
// # Model
//
// An entry is named by a Key: a Scope (one tenant's entries, or the entries
// every tenant shares), a tool name and the SHA-256 of the canonical JSON of
// the call's arguments (jsonscan.Canonical: member order, whitespace and
// number format do not matter). Tenants never see each other's entries, and
// no tenant name reaches the shared scope. Values are opaque bytes: the
// gateway stores the JSON-RPC result and puts each request's own id around
// it.
//
// Get returns a fresh stored value (Hit) or runs the Loader once for every
// concurrent Get of the key:
//
//   - In one process, concurrent Gets share one flight. The flight runs
//     detached from the callers' contexts (context.WithoutCancel, bounded by
//     Options.LoadTimeout, or Policy.LoadTimeout): a caller that gives up gets its ctx error, the
//     others still get the value. A Loader that ignores the end of its
//     context is abandoned 1s later: its callers get ErrLoaderAbandoned
//     (a context.DeadlineExceeded), its lock is released, and neither they
//     nor Close wait for it.
//   - A Get that begins after Invalidate returned does not join a flight of
//     its Cache that began before (that load may have read the data the
//     invalidated write replaced): it starts a new flight. An invalidation
//     through another instance shows as the fence refusing the flight's
//     commit: the Gets that joined that flight then start over.
//   - Across processes sharing a store, the flight takes the entry's lock
//     (SET NX PX with a random owner token; released by compare-and-delete)
//     together with a fence, a number that only grows (INCR, at least the
//     server clock in µs). The commit stores the value only if the fence is
//     still the entry's current one: a loader whose lock expired and was
//     taken over, or whose entry was invalidated meanwhile, cannot overwrite
//     the newer state. Commit and release publish on the entry's shard
//     channel (SPUBLISH, in the entry's slot); waiters subscribed with
//     SSUBSCRIBE re-check at once, and otherwise when the holder's lock
//     expires (then one of them takes it over). After Options.WaitTimeout a
//     waiter serves the stale copy (Stale) if one is left, else calls its
//     Loader itself without storing the result (no second stampede on the
//     store, and the lock holder's result still lands).
//   - The Loader's negative flag marks an isError result, stored for
//     Policy.NegativeTTL (0: not stored). A Loader error — timeout, protocol
//     error, 429, upstream 5xx — reaches every caller of that flight and is
//     never stored.
//   - A stored value keeps its load time (delta). Each hit refreshes it in
//     the background, under the lock, when now - delta*Beta*ln(rand()) >=
//     expiry (XFetch; the remaining life is the server's PTTL), while
//     readers keep getting the current value. Under steady load a popular
//     entry is refreshed before it expires, by one loader.
//   - An entry's key lives TTL (shortened by up to Policy.Jitter) plus
//     Options.StaleWindow; the stale copy is only served when waiting for a
//     fresh one times out.
//
// Tags: Policy.Tags (rendered from templates such as "product:{{args.id}}"
// by Tags.Render) are registered in per-tag indexes before the load starts,
// so an invalidation after a mutation either sees the entry (and bumps its
// fence: the load in flight is not stored) or happened before the load read
// anything. Invalidate deletes each tagged entry of one scope. An index is a
// sorted set in its own slot, pruned of ended memberships on every write; no
// command spans two Cluster slots. An invalidation moves the index aside in
// one command, whatever its size, and deletes its entries a page per round
// trip, so that one tenant's huge index cannot make it time out. An entry records the indexes it was
// registered in, and is served only while each of them still lists it:
// Redis may evict an index (a cold key) before its entries (hot ones), and
// an invalidation through an evicted index finds nothing to delete. An entry
// missing one of the tags its tool's policy now names (a reload added it) is
// read as absent and reloaded under them.
//
// # Stores
//
// NewMemoryStore keeps everything in the process (the embedded default;
// Caches of one process may share it), within MemoryOptions.MaxEntries
// entries and MaxBytes of values (DefaultMaxBytes: 256 MiB; a value over a
// quarter of a shard's share, 2 MiB by default, is served but not kept). NewRedisStore uses Redis, Valkey or
// Redis Cluster through rueidis; every gateway instance sharing it
// coalesces its loads with the others. It keeps no value over
// RedisOptions.MaxValueBytes (DefaultRedisMaxValueBytes: 2 MiB), which
// would not be read back within Options.Timeout. Sharded pub/sub needs Redis 7 (or
// Valkey); on older servers waiters poll every Options.PollInterval. Give
// the cache its own server with an evicting policy (CheckEviction warns
// about a layout that can evict rate-limit counters or refuse cache writes).
//
// A store error never fails a Get: the value is loaded without the store,
// as if the tool were not cached (Entry.StoreErr, Stats.Degraded). Every
// store operation has a deadline (Options.Timeout), and a store that does
// I/O sits behind a breaker: after Options.BreakerFailures consecutive
// timeouts or connection errors its operations are skipped
// (ErrStoreSkipped), so an outage adds no timeout to a Get, until a
// background PING succeeds. Waiters for another instance's load stop
// waiting when the breaker opens. The breaker logs when it opens and
// closes; StoreAvailable reports its state.
//
// An invalidation that fails or is skipped is remembered, not lost: it
// opens the breaker at once (even a single timeout with the breaker
// closed), and the probe replays every remembered invalidation once the
// store answers, closing the breaker only when all of them went through.
// Until then Gets are served uncached, so an entry a failed invalidation
// missed is never served again. At most Options.MaxPendingInvalidations
// (scope, tag) pairs are remembered; past that, a lost invalidation keeps
// the store unavailable until every entry it may have missed has expired
// (Stats.FailedInvalidations, ReplayedInvalidations, LostInvalidations,
// PendingInvalidations).
//
// A lock is never left behind by a caller that gave up on the store. The
// deadline ends the caller's wait, not the round trips that take or give
// up locks: a lock script that timed out still runs to its end (bounded
// by Options.LockTTL), and a lock it took for a caller that moved on is
// released as soon as its reply comes; a commit or release the breaker
// skipped still releases its lock, in the background. Otherwise the lock
// would stay until its TTL, and every instance's waiters for the entry
// with it (LockTTL, 10s by default: a client's whole timeout).
//
// # Gateway integration
//
// At startup (cfg is a *policy.Config):
//
//	var store cache.Store
//	if client == nil { // neither cache.redis nor store.redis
//		store, err = cache.NewMemoryStore(nil)
//	} else { // a client for cfg.Cache.Redis, else the store's client
//		store, err = cache.NewRedisStore(client, nil)
//		_, warn, err := cache.CheckEviction(ctx, client, cache.RoleCache) // log warn once
//	}
//	c, err := cache.New(store, &cache.Options{Logger: logger})
//	tags, err := cache.CompileTags(tool.Cache.Tags)          // per cacheable tool
//	invalidates, err := cache.CompileTags(tool.Invalidates)  // per mutating tool
//
// On a tools/call of a tool with a Cache (after auth, limits and quota):
//
//	scope := cache.Tenant(principal.Tenant)
//	if tc.Shared {
//		scope = cache.Shared()
//	}
//	key, err := cache.NewKey(scope, name, args) // ErrInvalidArguments: forward without the cache
//	rendered, err := tags.Render(args)
//	pol := cache.Policy{TTL: tc.TTL, Jitter: tc.Jitter, NegativeTTL: tc.NegativeTTL, Tags: rendered}
//	entry, src, err := c.Get(ctx, key, func(ctx context.Context) ([]byte, bool, error) {
//		// Forward upstream with ctx (detached from the agent's request).
//		// Return the JSON-RPC "result" (SSE: the final result event) and
//		// its isError; return an error for anything that is not a result
//		// (wrap the upstream response in it to relay it as is).
//	}, pol)
//	// reply {"jsonrpc":"2.0","id":<this request's id>,"result":entry.Value};
//	// src (hit, miss, stale, coalesced) is for headers and metrics.
//
// The Loader runs once for many callers, with the first caller's context
// values: a cacheable tool's result must not depend on who asks within the
// scope (subject, session), which is what per-tenant or shared caching
// means.
//
// After a successful call of a tool with Invalidates, and for POST
// /admin/cache/invalidate {"tenant": T, "tags": [...]}:
//
//	t, err := invalidates.Render(args)             // admin: the tags as given
//	n, err := c.Invalidate(ctx, cache.Tenant(T), t)
//	m, err := c.Invalidate(ctx, cache.Shared(), t) // if any shared tool is tagged
//
// Warm-up, before /readyz reports ready: one WarmItem per cfg.Cache.Warm
// entry (args marshalled to JSON for NewKey; Load calls the upstream as that
// tenant), then c.Warm(ctx, items). On shutdown, c.Close waits for loads in
// flight. c.Stats feeds metrics.
package cache
