package cache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/keyspace"
)

// RedisStore keeps entries in Redis, Valkey or Redis Cluster, shared by
// every gateway instance, through rueidis.
//
// An entry is one string (a small header and the value) whose key TTL is
// its fresh life plus the stale window; its lock, fence and wake-up channel
// share its hash tag (package keyspace), so each script touches one slot. A
// tag index is a sorted set in its own slot, of entry keys scored by when
// the membership ends; expired members are pruned on every write to it and
// on every invalidation, which first moves it aside whole (one command
// whatever its size) and then drops its entries a page at a time. No
// command spans two slots.
//
// An invalidation finds entries only through their indexes, and Redis may
// evict an index before its entries: under allkeys-lfu or volatile-lru a
// hot entry, read on every Get, outlives its index, written about once per
// load. So an entry records the keys of its indexes (record.tags, in the
// blob), and a read serves it only while each of them still lists it
// (ZSCORE): the caller's policy's indexes are asked in the read's pipeline
// (one round trip, one command per tag; the indexes a record names beyond
// those, after a policy change, take a second one), and an entry one of
// them no longer lists is deleted, if unchanged, and read as a miss, as is
// one that does not record an index of the caller's policy (loaded before
// a config change added the tag: that tag's invalidation cannot find it). The
// check is not atomic with the GET (the keys are in different slots, so no
// script can read both on a cluster), and needs little: a membership is
// only lost for good (evicted with its index, ended, or moved aside by an
// invalidation, which is to readers the index's eviction: see invalidate),
// and the reader that finds it lost
// deletes the entry before its own load registers the entry again; an
// acquire (which registers it again, and returns a fresh value; Warm
// acquires without a read) checks the value with what each registration
// found before it (acquireChecked). Only a read whose GET came before
// that deletion and whose ZSCORE came after that registration (two round
// trips of another instance between two commands of one pipeline) could
// still be served the entry. The reads
// also keep the indexes of hot entries hot, so the eviction policy seldom
// picks them.
//
// Per-tag version counters stored with the entry and compared on read
// would also do (a lost counter counting as invalidated), at the cost of a
// key per tag and a write per invalidated tag; the index already says what
// is needed (the entry is still findable), so nothing new is kept.
//
// Waiters are woken by sharded pub/sub (SPUBLISH from the commit and
// release scripts, SSUBSCRIBE on the entry's channel: Redis 7 or Valkey).
// On a server without it, waiters re-check every Options.PollInterval.
//
// Use an eviction policy that evicts (allkeys-lfu, volatile-lru, ...) on the
// cache's server, and a separate server for rate-limit counters: see
// CheckEviction.
type RedisStore struct {
	client   rueidis.Client
	maxValue int // RedisOptions.MaxValueBytes
	// pollOnly is set once SSUBSCRIBE was refused: later waits poll
	// without trying again.
	pollOnly atomic.Bool
}

var _ Store = (*RedisStore)(nil)

// DefaultRedisMaxValueBytes is RedisOptions.MaxValueBytes when zero: 2 MiB,
// the largest value a MemoryStore of DefaultMaxBytes keeps.
const DefaultRedisMaxValueBytes = DefaultMaxBytes / (memShards * memEntryShare)

// RedisOptions configures a RedisStore. A nil *RedisOptions means all
// defaults.
type RedisOptions struct {
	// MaxValueBytes bounds the values the store keeps. A longer value is
	// served to the callers of its load but not stored, and the value it
	// replaces is deleted (a newer load passed the fence); waiters are
	// woken to load it themselves, as after a failed load. Every Get reads
	// an entry whole within the Cache's Options.Timeout: a value too large
	// to arrive in time (an answer can be 16 MiB, mcp's response limit)
	// would time out on every read, each timeout counting toward the
	// store's breaker, which, open, serves every tenant's cached tools
	// uncached; and the loads those reads fall back to would store it
	// again. Default DefaultRedisMaxValueBytes.
	MaxValueBytes int
}

// NewRedisStore returns a RedisStore on client (standalone, Cluster or
// Sentinel). The store does not own client: closing it is the caller's job.
// Keep client-side caching off for this client (DisableCache): entries are
// read once per Get, and tracking them would cost the server memory. It
// fails with ErrInvalidOptions on a negative MaxValueBytes.
func NewRedisStore(client rueidis.Client, opts *RedisOptions) (*RedisStore, error) {
	if client == nil {
		return nil, errors.New("cache: nil Redis client")
	}
	maxValue := DefaultRedisMaxValueBytes
	if opts != nil {
		if opts.MaxValueBytes < 0 {
			return nil, fmt.Errorf("%w: negative MaxValueBytes %d", ErrInvalidOptions, opts.MaxValueBytes)
		}
		if opts.MaxValueBytes > 0 {
			maxValue = opts.MaxValueBytes
		}
	}
	return &RedisStore{client: client, maxValue: maxValue}, nil
}

// ping checks that the server answers: the breaker's probe.
func (r *RedisStore) ping(ctx context.Context) error {
	return r.client.Do(ctx, r.client.B().Ping().Build()).Error()
}

// errReply means a script answered something the store does not expect.
var errReply = errors.New("cache: unexpected reply from Redis")

type scriptCall struct {
	s    *script
	keys []string
	args []string
}

// run sends calls in one pipeline (rueidis splits it by node in a cluster)
// with EVALSHA, then sends again with EVAL those that got NOSCRIPT (which
// did not run).
func (r *RedisStore) run(ctx context.Context, calls []scriptCall) []rueidis.RedisResult {
	cmds := make(rueidis.Commands, len(calls))
	for i, c := range calls {
		cmds[i] = r.client.B().Evalsha().Sha1(c.s.sha).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(c.args...).Build()
	}
	res := r.client.DoMulti(ctx, cmds...)
	var again []int
	for i := range res {
		if e, ok := rueidis.IsRedisErr(res[i].Error()); ok && e.IsNoScript() {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		cmds = cmds[:0]
		for _, i := range again {
			c := calls[i]
			cmds = append(cmds, r.client.B().Eval().Script(c.s.src).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(c.args...).Build())
		}
		for j, x := range r.client.DoMulti(ctx, cmds...) {
			res[again[j]] = x
		}
	}
	return res
}

// lifeOf converts a PTTL reply: -2 (gone) is no entry, -1 (no expiry, which
// this package never sets) is a very long life.
func lifeOf(pttl int64) (time.Duration, bool) {
	switch {
	case pttl == -1:
		return math.MaxInt64 / 2, true
	case pttl < 0:
		return 0, false
	}
	return time.Duration(pttl) * time.Millisecond, true
}

func ms(d time.Duration) string { return strconv.FormatInt(max(millis(d), 1), 10) }

// Outcomes of settle's operation.
const (
	opRunning int32 = iota
	opWaited        // the caller took the outcome
	opLeft          // the caller stopped waiting first
)

// settle runs op, a round trip that takes or gives up locks for n
// requests, to its end, while the caller waits for it only until ctx ends;
// the caller then gets n results made by gaveUp from ctx's error, and op's
// results go to left (nil: nothing to undo) instead.
//
// Giving up on such a round trip does not undo it: once sent, the script
// runs on the server, late (the cause of the timeout), and a lock it takes
// for a caller that has moved on would be held until its TTL, every
// instance's waiters for the entry waiting that long. A commit or release
// given up on may never run at all: rueidis closes the connection of a
// lone command whose deadline passed, and the lock then stays too. So op
// gets a deadline of its own, life (the lock's TTL: a script held up
// longer than that is a stalled server, which the breaker deals with), and
// its reply, even a late one, is acted on.
func settle[R any](ctx context.Context, life time.Duration, n int, op func(context.Context) []R,
	left func(context.Context, []R), gaveUp func(error) R) []R {
	if err := ctx.Err(); err != nil {
		return gaveUpAll(n, err, gaveUp) // nothing sent
	}
	if life <= 0 {
		life = DefaultLockTTL
	}
	if d, ok := ctx.Deadline(); ok {
		life = max(life, time.Until(d))
	}
	var state atomic.Int32
	var out []R
	done := make(chan struct{})
	go func() {
		defer close(done)
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), life)
		defer cancel()
		out = op(octx)
		if !state.CompareAndSwap(opRunning, opWaited) && left != nil {
			left(octx, out)
		}
	}()
	select {
	case <-done:
		return out
	case <-ctx.Done():
		if state.CompareAndSwap(opRunning, opLeft) {
			return gaveUpAll(n, ctx.Err(), gaveUp) // out is op's, still running
		}
		<-done // op ended meanwhile: its outcome is the caller's
		return out
	}
}

// gaveUpAll is n results of gaveUp(err).
func gaveUpAll[R any](n int, err error, gaveUp func(error) R) []R {
	out := make([]R, n)
	for i := range out {
		out[i] = gaveUp(err)
	}
	return out
}

// acquire runs acquireNow to its end (settle): the locks it takes after
// the caller stopped waiting are released.
func (r *RedisStore) acquire(ctx context.Context, reqs []acquireReq) []acquireRes {
	life := time.Duration(0)
	for _, q := range reqs {
		life = max(life, q.lockTTL)
	}
	return settle(ctx, life, len(reqs), func(ctx context.Context) []acquireRes {
		return r.acquireNow(ctx, reqs)
	}, func(ctx context.Context, out []acquireRes) {
		var taken []releaseReq
		for i, res := range out {
			if res.err == nil && res.status == statusLocked {
				taken = append(taken, releaseReq{entry: reqs[i].entry, token: reqs[i].token})
			}
		}
		if len(taken) > 0 {
			r.releaseNow(ctx, taken)
		}
	}, func(err error) acquireRes { return acquireRes{err: err} })
}

func (r *RedisStore) acquireNow(ctx context.Context, reqs []acquireReq) []acquireRes {
	return r.acquireChecked(ctx, reqs, true)
}

// acquireChecked is acquireNow; check makes it check a fresh value's tag
// indexes as read does (see RedisStore), with what each registration
// found before it registered the entry: registering an entry again must
// not make an entry an invalidation missed findable (and served) again.
// Registering comes before the lock in the pipeline, and acquire is also
// reached without a read (Warm), so the read's check alone does not do.
// An unlisted value is deleted, if unchanged, and its request acquired
// again (unchecked: what it finds then was stored since).
func (r *RedisStore) acquireChecked(ctx context.Context, reqs []acquireReq, check bool) []acquireRes {
	var calls []scriptCall
	keys := make([][]string, len(reqs))
	for k, q := range reqs {
		// Tag registrations first in the pipeline: they complete before
		// the lock reply reaches the loader.
		keys[k] = tagKeys(q.scope, q.tags)
		for _, tk := range keys[k] {
			calls = append(calls, scriptCall{tagScript, []string{tk}, []string{q.entry, ms(q.tagLife)}})
		}
		mode, seen := "m", ""
		if q.mode == modeRefresh {
			mode, seen = "r", fenceBytes(q.seen)
		}
		calls = append(calls, scriptCall{acquireScript,
			[]string{q.entry, keyspace.CacheLock(q.entry), keyspace.CacheFence(q.entry)},
			[]string{q.token, ms(q.lockTTL), ms(q.fenceTTL), mode, seen}})
	}
	res := r.run(ctx, calls)
	out := make([]acquireRes, len(reqs))
	var again []int
	i := 0
	for k, q := range reqs {
		var tagErr error
		tagRes := res[i : i+len(q.tags)] // did each index list the entry before this acquire
		for _, tr := range tagRes {
			if _, err := tr.AsInt64(); err != nil && tagErr == nil {
				tagErr = fmt.Errorf("tag index: %w", err)
			}
		}
		i += len(q.tags)
		out[k] = parseAcquire(res[i])
		i++
		if tagErr != nil && out[k].err == nil {
			// An entry that may be missing from a tag index must not be
			// loaded under the lock: an invalidation could miss it.
			if out[k].status == statusLocked {
				r.releaseNow(ctx, []releaseReq{{entry: q.entry, token: q.token}})
			}
			out[k] = acquireRes{err: tagErr}
		}
		// A value lacking one of the policy's indexes is checked too (and
		// so deleted): it was loaded under other tags (see checkListed).
		if check && out[k].err == nil && out[k].status == statusFresh && len(out[k].rec.tags)+len(keys[k]) > 0 {
			listedBefore := func(j int) (bool, error) { n, _ := tagRes[j].AsInt64(); return n == 1, nil }
			switch ok, err := r.checkListed(ctx, q.entry, &out[k].rec, keys[k], listedBefore); {
			case err != nil:
				out[k] = acquireRes{err: err}
			case !ok:
				again = append(again, k)
			}
		}
	}
	if len(again) > 0 {
		retry := make([]acquireReq, len(again))
		for j, k := range again {
			retry[j] = reqs[k]
		}
		for j, res := range r.acquireChecked(ctx, retry, false) {
			out[again[j]] = res
		}
	}
	return out
}

func parseAcquire(res rueidis.RedisResult) acquireRes {
	arr, err := res.ToArray()
	if err != nil {
		return acquireRes{err: err}
	}
	if len(arr) == 0 {
		return acquireRes{err: errReply}
	}
	status, err := arr[0].AsInt64()
	if err != nil {
		return acquireRes{err: err}
	}
	switch {
	case status == 0 && len(arr) == 3:
		b, err1 := arr[1].AsBytes()
		pttl, err2 := arr[2].AsInt64()
		life, ok := lifeOf(pttl)
		if err := errors.Join(err1, err2); err != nil || !ok {
			return acquireRes{err: fmt.Errorf("%w: %w", errReply, err)}
		}
		rec, ok := decodeBlob(b, life)
		if !ok {
			return acquireRes{err: errReply}
		}
		return acquireRes{status: statusFresh, rec: rec}
	case status == 1 && len(arr) == 2:
		f, err := arr[1].AsInt64()
		if err != nil {
			return acquireRes{err: err}
		}
		return acquireRes{status: statusLocked, fence: uint64(f)}
	case status == 2 && len(arr) == 2:
		p, err := arr[1].AsInt64()
		if err != nil {
			return acquireRes{err: err}
		}
		return acquireRes{status: statusBusy, wait: time.Duration(p) * time.Millisecond}
	case status == 3:
		return acquireRes{status: statusSkip}
	}
	return acquireRes{err: errReply}
}

// commit runs commitNow to its end (settle).
func (r *RedisStore) commit(ctx context.Context, reqs []commitReq) []commitRes {
	life := time.Duration(0)
	for _, q := range reqs {
		life = max(life, q.lockTTL)
	}
	return settle(ctx, life, len(reqs), func(ctx context.Context) []commitRes { return r.commitNow(ctx, reqs) },
		nil, func(err error) commitRes { return commitRes{err: err} })
}

// commitNow commits reqs; a value over maxValue is sent as no value, which
// the script does not keep (see RedisOptions.MaxValueBytes).
func (r *RedisStore) commitNow(ctx context.Context, reqs []commitReq) []commitRes {
	calls := make([]scriptCall, len(reqs))
	for i, q := range reqs {
		blob := ""
		if len(q.rec.value) <= r.maxValue {
			blob = rueidis.BinaryString(encodeBlob(&q.rec))
		}
		calls[i] = scriptCall{commitScript,
			[]string{q.entry, keyspace.CacheLock(q.entry), keyspace.CacheFence(q.entry)},
			[]string{q.token, strconv.FormatUint(q.rec.fence, 10), blob, ms(q.rec.life), keyspace.CacheChannel(q.entry)}}
	}
	out := make([]commitRes, len(reqs))
	for i, res := range r.run(ctx, calls) {
		n, err := res.AsInt64()
		// The script refuses only on a fence that is no longer ours.
		out[i] = commitRes{stored: err == nil && n == 1, fenced: err == nil && n == 0, err: err}
	}
	return out
}

// release runs releaseNow to its end (settle).
func (r *RedisStore) release(ctx context.Context, reqs []releaseReq) []error {
	life := time.Duration(0)
	for _, q := range reqs {
		life = max(life, q.lockTTL)
	}
	return settle(ctx, life, len(reqs), func(ctx context.Context) []error { return r.releaseNow(ctx, reqs) },
		nil, func(err error) error { return err })
}

func (r *RedisStore) releaseNow(ctx context.Context, reqs []releaseReq) []error {
	calls := make([]scriptCall, len(reqs))
	for i, q := range reqs {
		calls[i] = scriptCall{releaseScript, []string{keyspace.CacheLock(q.entry)}, []string{q.token, keyspace.CacheChannel(q.entry)}}
	}
	out := make([]error, len(reqs))
	for i, res := range r.run(ctx, calls) {
		out[i] = res.Error()
	}
	return out
}

// invalidatePage is how many entries of a drained tag index one round
// trip drops: one tenant's index can list as many entries as its loads
// made, and read whole it could take longer than the store's timeout (the
// failed invalidation then holding the store's breaker open for every
// tenant until its replay, which would fail the same way).
const invalidatePage = 512

// runStep is run bounded by step (0: by ctx alone).
func (r *RedisStore) runStep(ctx context.Context, step time.Duration, calls []scriptCall) []rueidis.RedisResult {
	if step > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, step)
		defer cancel()
	}
	return r.run(ctx, calls)
}

// invalidate moves each tag's index aside (drainSrc), then drops the
// entries it listed a page at a time, bumping their fences (so that a load
// in flight stores nothing), and removes a page's memberships only once
// its entries are dropped (pageSrc): a failure leaves them in the drain,
// which the next invalidation of the tag (the replay) empties with it.
// Each round trip is bounded by step.
func (r *RedisStore) invalidate(ctx context.Context, scope Scope, tags []string, step time.Duration) (int, error) {
	page := strconv.Itoa(invalidatePage)
	drains := make([]string, len(tags))
	calls := make([]scriptCall, len(tags))
	for i, tag := range tags {
		index := keyspace.CacheTag(scope, tag)
		drains[i] = keyspace.CacheTagDrain(index)
		calls[i] = scriptCall{drainScript, []string{index, drains[i]}, []string{page}}
	}
	pages, err := pagesOf(r.runStep(ctx, step, calls))
	n := 0
	for err == nil {
		d, more, derr := r.dropPages(ctx, step, pages)
		n += d
		if derr != nil || !more {
			return n, derr
		}
		calls = calls[:0]
		var next []string
		for i, members := range pages {
			if len(members) > 0 {
				next = append(next, drains[i])
				calls = append(calls, scriptCall{pageScript, []string{drains[i]}, append([]string{page}, members...)})
			}
		}
		drains = next
		pages, err = pagesOf(r.runStep(ctx, step, calls))
	}
	return n, err
}

// dropPages deletes the entries pages list, each once (an entry of two tags
// is in two pages), bumping their fences, and reports how many it deleted
// and whether there were any to delete.
func (r *RedisStore) dropPages(ctx context.Context, step time.Duration, pages [][]string) (n int, any bool, err error) {
	var calls []scriptCall
	seen := make(map[string]bool)
	for _, members := range pages {
		for _, m := range members {
			if !seen[m] {
				seen[m] = true
				calls = append(calls, scriptCall{dropScript, []string{m, keyspace.CacheFence(m)}, []string{droppedFenceTTL}})
			}
		}
	}
	if len(calls) == 0 {
		return 0, false, nil
	}
	for _, res := range r.runStep(ctx, step, calls) {
		d, err := res.AsInt64()
		if err != nil {
			return n, true, err
		}
		n += int(d)
	}
	return n, true, nil
}

// droppedFenceTTL is the life of a fence an invalidation bumps: it must outlive
// any load in flight; a day is far beyond any LoadTimeout, and the key only
// exists where a load recently ran.
var droppedFenceTTL = strconv.FormatInt((24 * time.Hour).Milliseconds(), 10)

// pagesOf reads the pages drainSrc and pageSrc reply.
func pagesOf(res []rueidis.RedisResult) ([][]string, error) {
	pages := make([][]string, len(res))
	for i, x := range res {
		ms, err := x.AsStrSlice()
		if err != nil {
			return nil, err
		}
		pages[i] = ms
	}
	return pages, nil
}

func (r *RedisStore) subscribe(ctx context.Context, entry string) (subscription, error) {
	if r.pollOnly.Load() {
		return nil, errNoPubSub
	}
	ch := keyspace.CacheChannel(entry)
	s := &redisSub{sig: make(chan struct{}, 1), done: make(chan struct{})}
	ready := make(chan struct{})
	var once sync.Once
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	rctx = rueidis.WithOnSubscriptionHook(rctx, func(p rueidis.PubSubSubscription) {
		if p.Kind == "ssubscribe" && p.Channel == ch {
			once.Do(func() { close(ready) })
		}
	})
	// Receive leaves the server-side subscription behind when it returns.
	// Unsubscribing is bounded like subscribing (ctx's deadline), so that
	// closing a wait on a stalled server does not hold the caller longer.
	unsub := time.Second
	if d, ok := ctx.Deadline(); ok {
		unsub = max(time.Until(d), time.Millisecond)
	}
	rctx = rueidis.WithOnReceiveReturnHook(rctx, func(err error, cc rueidis.CommandClient) error {
		uctx, cancel := context.WithTimeout(context.Background(), unsub)
		defer cancel()
		_ = cc.Do(uctx, cc.B().Sunsubscribe().Channel(ch).Build()).Error()
		return err
	})
	go func() {
		s.err = r.client.Receive(rctx, r.client.B().Ssubscribe().Channel(ch).Build(), func(rueidis.PubSubMessage) {
			s.signal()
		})
		close(s.done)
		s.signal()
	}()
	select {
	case <-ready:
		return s, nil
	case <-s.done:
		cancel()
		if e, ok := rueidis.IsRedisErr(s.err); ok && strings.Contains(strings.ToLower(e.Error()), "unknown command") {
			// The server refuses SSUBSCRIBE (Redis before 7): poll.
			r.pollOnly.Store(true)
		}
		return nil, fmt.Errorf("cache: subscribe: %w", s.err)
	case <-ctx.Done():
		cancel()
		return nil, fmt.Errorf("cache: subscribe: %w", ctx.Err())
	}
}

var errNoPubSub = errors.New("cache: the server has no sharded pub/sub; polling")

// redisSub is one SSUBSCRIBE held by a Receive goroutine. Messages
// coalesce into sig (capacity 1): a waiter only needs to know that
// something happened since it armed.
type redisSub struct {
	sig    chan struct{}
	done   chan struct{}
	err    error
	cancel context.CancelFunc
}

func (s *redisSub) signal() {
	select {
	case s.sig <- struct{}{}:
	default:
	}
}

func (s *redisSub) arm() {
	select {
	case <-s.sig:
	default:
	}
}

func (s *redisSub) wake() <-chan struct{} { return s.sig }

func (s *redisSub) alive() bool {
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

func (s *redisSub) close() {
	s.cancel()
	<-s.done
}
