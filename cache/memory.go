package cache

import (
	"bytes"
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
)

// DefaultMaxEntries is MemoryOptions.MaxEntries when zero.
const DefaultMaxEntries = 100_000

// DefaultMaxBytes is MemoryOptions.MaxBytes when zero. Cache keys come from
// clients' arguments and an answer can be 16 MiB (mcp's response limit), so
// without a byte bound MaxEntries alone would let clients pin gigabytes. 256
// MiB holds the usual tool results (a few KiB each) by the tens of
// thousands while leaving a gateway in a 512 MiB container room for its
// proxy buffers; it admits values of up to 2 MiB (see MaxBytes).
const DefaultMaxBytes = 256 << 20

// memEntryOverhead estimates what a stored value costs beyond its bytes and
// its key's: the slot (about 210 bytes) and its place in the shard's map.
// Tag memberships are not counted: they are bounded with the entries (see
// MaxEntries).
const memEntryOverhead = 256

// memEntryShare is the part of a shard's share of MaxBytes one value may
// take at most: a value of a whole share would flush its shard (a 32nd of
// the cache) on each store, so a client alternating a few large answers
// would evict everyone else's entries of that shard.
const memEntryShare = 4

// MemoryOptions configures a MemoryStore. A nil *MemoryOptions means all
// defaults.
type MemoryOptions struct {
	// MaxEntries bounds the entries held (values, locks and fences of one
	// key count once). When full, an insertion drops expired entries
	// first, else the sampled entry nearest its expiry (like Redis's
	// volatile-ttl). Default DefaultMaxEntries. It bounds the tag
	// indexes too: a membership lives no longer than its entry's slot, so
	// they hold about MaxEntries times the tags one policy renders.
	MaxEntries int
	// MaxBytes bounds the bytes of the values held, each counted with its
	// key and memEntryOverhead: the entry count alone does not bound
	// memory, as values are up to the proxy's response limit. Each of the
	// store's 32 shards gets an equal share, so that no store-wide lock is
	// taken; a value that would not fit evicts as MaxEntries does (dead
	// entries first, else the sampled value nearest its expiry that no
	// loader holds) until it fits. A value counting over a quarter of a
	// share (MaxBytes/128: 2 MiB by default) is not stored at all, nor is
	// one that cannot fit because loaders hold the rest of its shard: its
	// load's callers still get it, and waiters of other Caches are woken
	// to load it themselves, as after a failed load. Default
	// DefaultMaxBytes.
	MaxBytes int64
}

// MemoryStore keeps entries in this process: the embedded default, and
// what Caches of one process share. Locks, fences, wake-ups and tag indexes
// behave as in RedisStore, on a monotonic clock. It is safe for concurrent
// use; the zero MemoryStore is not usable: build one with NewMemoryStore.
//
// Tag names come from clients' arguments, so the tag indexes must not
// outgrow the entries: each slot lists the indexes it is a member of, and
// leaves them all when it is dropped (evicted or dead); the memberships of
// a slot that have ended are removed when the slot is next registered or
// sampled by an insertion's sweep; an index with no member left is deleted,
// and Invalidate deletes the indexes it read.
//
// Its memory is bounded by both MaxEntries and MaxBytes, as the keys, and
// so the number and size of the values, are the clients' to choose.
type MemoryStore struct {
	seed     maphash.Seed
	shards   [memShards]memShard
	perShard int
	// shardBytes is a shard's share of MaxBytes; maxValue the most one
	// value may count (memEntryShare).
	shardBytes, maxValue int64
	fences               atomic.Uint64

	// tagMu is taken after a shard's lock, never before one.
	tagMu sync.Mutex
	tags  map[string]*memTag
}

const memShards = 32

type memShard struct {
	mu    sync.RWMutex
	m     map[string]*memSlot
	bytes int64 // the sizes of m's slots
}

// memSlot is everything of one entry key: value, lock, fence, waiters.
type memSlot struct {
	rec        record // life unused: until holds it
	has        bool
	until      time.Time
	lockToken  string
	lockUntil  time.Time
	fence      uint64
	fenceUntil time.Time
	wake       chan struct{} // closed on commit and release; nil until armed
	size       int64         // what the value counts toward MaxBytes (0: none)
	// tags are the indexes this slot was registered in (written under
	// the shard's lock and tagMu, read under either). A ref may outlive
	// its membership (pruned with its index, or its index deleted by
	// Invalidate); its until is never earlier than the membership's.
	tags []memRef
}

// memRef is a slot's side of a tag membership.
type memRef struct {
	tag   string // the index's key in MemoryStore.tags
	until time.Time
}

func (s *memSlot) dead(now time.Time) bool {
	return !now.Before(s.until) && !now.Before(s.lockUntil) && !now.Before(s.fenceUntil)
}

// drop deletes the slot of k, waking its waiters (they check again), and
// its tag memberships: with no slot, an invalidation has nothing to delete
// or fence, and a new slot registers its tags again before it can be
// locked. The shard is locked.
func (s *MemoryStore) drop(sh *memShard, k string, sl *memSlot) {
	if sl.wake != nil {
		close(sl.wake)
		sl.wake = nil
	}
	delete(sh.m, k)
	sh.bytes -= sl.size
	if len(sl.tags) > 0 {
		s.untagAll(k, sl)
	}
}

// clearValue forgets sl's value; the shard is locked.
func clearValue(sh *memShard, sl *memSlot) {
	sl.has, sl.rec, sl.until = false, record{}, time.Time{}
	sh.bytes -= sl.size
	sl.size = 0
}

// untagAll removes all the tag memberships of entry's slot, and their
// refs; the shard is locked. Out of drop's frame, as sweepTags is out of
// sweep's: they run at the bottom of a load's new goroutine, whose stack
// would otherwise grow (a copy) on every miss.
func (s *MemoryStore) untagAll(entry string, sl *memSlot) {
	s.tagMu.Lock()
	for i := range sl.tags {
		k := sl.tags[i].tag
		if t := s.tags[k]; t != nil {
			delete(t.members, entry)
			s.shrunk(k, t)
		}
	}
	s.tagMu.Unlock()
	sl.tags = nil
}

// untagEnded removes the memberships of entry's slot that have ended, and
// their refs. The shard is locked and tagMu held.
func (s *MemoryStore) untagEnded(entry string, sl *memSlot, now time.Time) {
	kept := sl.tags[:0]
	for _, ref := range sl.tags {
		if now.Before(ref.until) {
			kept = append(kept, ref)
			continue
		}
		// Registrations renew the ref with the membership, so the
		// membership has ended too, if it is still there: an index's
		// prune or an invalidation may have removed it already.
		if t := s.tags[ref.tag]; t != nil {
			if u, ok := t.members[entry]; ok && !now.Before(u) {
				delete(t.members, entry)
				s.shrunk(ref.tag, t)
			}
		}
	}
	clear(sl.tags[len(kept):])
	sl.tags = kept
}

// sweepTags removes the ended memberships of entry's slot, if any; the
// shard is locked.
func (s *MemoryStore) sweepTags(entry string, sl *memSlot, now time.Time) {
	if sl.ended(now) {
		s.tagMu.Lock()
		s.untagEnded(entry, sl, now)
		s.tagMu.Unlock()
	}
}

// ended reports whether a membership of sl has ended (without tagMu: the
// refs only change under the shard's lock, which the caller holds).
func (sl *memSlot) ended(now time.Time) bool {
	for _, ref := range sl.tags {
		if !now.Before(ref.until) {
			return true
		}
	}
	return false
}

// shrunk deletes index k once it has no member. tagMu is held.
func (s *MemoryStore) shrunk(k string, t *memTag) {
	if len(t.members) == 0 {
		delete(s.tags, k)
		return
	}
	// The next prune is due when the index doubles from what is left.
	t.pruned = min(t.pruned, len(t.members))
}

type memTag struct {
	members map[string]time.Time
	pruned  int // size after the last prune
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore(opts *MemoryOptions) (*MemoryStore, error) {
	limit, maxBytes := DefaultMaxEntries, int64(DefaultMaxBytes)
	if opts != nil {
		if opts.MaxEntries < 0 {
			return nil, fmt.Errorf("%w: negative MaxEntries %d", ErrInvalidOptions, opts.MaxEntries)
		}
		if opts.MaxBytes < 0 {
			return nil, fmt.Errorf("%w: negative MaxBytes %d", ErrInvalidOptions, opts.MaxBytes)
		}
		if opts.MaxEntries > 0 {
			limit = opts.MaxEntries
		}
		if opts.MaxBytes > 0 {
			maxBytes = opts.MaxBytes
		}
	}
	// Rounded down (unlike perShard), so that the shards together never
	// hold more than MaxBytes.
	shardBytes := maxBytes / memShards
	s := &MemoryStore{
		seed: maphash.MakeSeed(), perShard: max(1, (limit+memShards-1)/memShards),
		shardBytes: shardBytes, maxValue: shardBytes / memEntryShare,
		tags: make(map[string]*memTag),
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*memSlot)
	}
	// Fences start at the wall clock in microseconds, like Redis's, and
	// only grow.
	s.fences.Store(uint64(time.Now().UnixMicro()))
	return s, nil
}

// Len returns the number of entry keys held (for tests and metrics).
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.RLock()
		n += len(sh.m)
		sh.mu.RUnlock()
	}
	return n
}

// heldBytes returns what the values held count toward MaxBytes.
func (s *MemoryStore) heldBytes() int64 {
	var n int64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.RLock()
		n += sh.bytes
		sh.mu.RUnlock()
	}
	return n
}

func (s *MemoryStore) shard(entry string) *memShard {
	return &s.shards[maphash.String(s.seed, entry)%memShards]
}

// read needs not ask the indexes rec.tags names: an index here loses a
// member only with the member's slot (drop), or after its value
// (invalidate). But a value loaded under other tags than the caller's (a
// config reload added one since) is absent to it: an invalidation of the
// new tag could not find it. A policy without tags costs nothing more.
func (s *MemoryStore) read(_ context.Context, key Key, tags []string) (record, bool, error) {
	entry := key.entry
	sh := s.shard(entry)
	now := time.Now()
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	sl := sh.m[entry]
	if sl == nil || !sl.has || !now.Before(sl.until) {
		return record{}, false, nil
	}
	for _, tag := range tags { // covers, without a slice of keys
		if !slices.Contains(sl.rec.tags, keyspace.CacheTag(key.scope, tag)) {
			return record{}, false, nil
		}
	}
	rec := sl.rec
	rec.life = sl.until.Sub(now)
	return rec, true, nil
}

// slot returns entry's slot, creating it (and making room) if needed. The
// shard is locked.
func (s *MemoryStore) slot(sh *memShard, entry string, now time.Time) *memSlot {
	if sl := sh.m[entry]; sl != nil {
		return sl
	}
	s.sweep(sh, now, len(sh.m) >= s.perShard, nil)
	sl := &memSlot{}
	sh.m[entry] = sl
	return sl
}

// sweep drops dead slots among a few sampled ones (map iteration starts at
// a random place) and the ended tag memberships of the others; when full is
// set and none was dead, it drops the sampled slot nearest its expiry that
// no loader holds. A slot outlives its value by its fence's life, so
// without the second step the memberships of expired values would stay for
// as long. Slots skip reports (nil: none) are not sampled. It reports
// whether it dropped a slot.
func (s *MemoryStore) sweep(sh *memShard, now time.Time, full bool, skip func(string, *memSlot) bool) bool {
	const samples = 8
	var victim string
	var victimUntil time.Time
	seen, dropped := 0, false
	for k, sl := range sh.m {
		if skip != nil && skip(k, sl) {
			continue
		}
		if seen++; seen > samples {
			break
		}
		if sl.dead(now) {
			s.drop(sh, k, sl)
			dropped = true
			continue
		}
		if len(sl.tags) > 0 {
			s.sweepTags(k, sl, now)
		}
		if now.Before(sl.lockUntil) {
			continue
		}
		if victim == "" || sl.until.Before(victimUntil) {
			victim, victimUntil = k, sl.until
		}
	}
	if full && !dropped && victim != "" {
		s.drop(sh, victim, sh.m[victim])
		return true
	}
	return dropped
}

func (s *MemoryStore) nextFence() uint64 { return s.fences.Add(1) }

func (s *MemoryStore) acquire(_ context.Context, reqs []acquireReq) []acquireRes {
	out := make([]acquireRes, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		out[i] = s.acquireOne(r, tagKeys(r.scope, r.tags))
	}
	return out
}

// tagKeys returns the keys of scope's indexes of tags (nil for none): the
// one place a store or a record builds them.
func tagKeys(scope Scope, tags []string) []string {
	if len(tags) == 0 {
		return nil
	}
	keys := make([]string, len(tags))
	for i, tag := range tags {
		keys[i] = keyspace.CacheTag(scope, tag)
	}
	return keys
}

// covers reports whether have, the tag index keys a record was stored
// under, holds every one of want, those of the policy in force: a record
// that lacks one was loaded under other tags (before a config reload added
// one), and an invalidation of the new tag may have missed it, so it is
// not served. A policy has a few tags: a linear search.
func covers(have, want []string) bool {
	for _, k := range want {
		if !slices.Contains(have, k) {
			return false
		}
	}
	return true
}

// acquireOne registers r's entry in the tag indexes keys, then runs
// get-or-lock, under the shard's lock: the slot that will hold the lock
// carries the memberships, so they cannot be dropped before it.
func (s *MemoryStore) acquireOne(r *acquireReq, keys []string) acquireRes {
	sh := s.shard(r.entry)
	now := time.Now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sl := s.slot(sh, r.entry, now)
	s.register(r, sl, keys, now)
	live := sl.has && now.Before(sl.until)
	switch {
	// A value lacking one of keys is not returned (see read): it is
	// loaded again under them.
	case r.mode == modeMiss && live && sl.until.Sub(now) > sl.rec.stale && covers(sl.rec.tags, keys):
		rec := sl.rec
		rec.life = sl.until.Sub(now)
		return acquireRes{status: statusFresh, rec: rec}
	case r.mode == modeRefresh && (!live || sl.rec.fence != r.seen):
		return acquireRes{status: statusSkip}
	}
	if sl.lockToken != "" && now.Before(sl.lockUntil) {
		return acquireRes{status: statusBusy, wait: sl.lockUntil.Sub(now)}
	}
	sl.lockToken, sl.lockUntil = r.token, now.Add(r.lockTTL)
	sl.fence, sl.fenceUntil = s.nextFence(), now.Add(r.fenceTTL)
	return acquireRes{status: statusLocked, fence: sl.fence}
}

// register adds r's entry (slot sl, whose shard is locked) to the tag
// indexes keys (from tagKeys) for r.tagLife, after removing the slot's
// ended memberships. An index is pruned of every ended membership once it
// has doubled since its last prune (amortised O(1) per registration): a
// popular tag would otherwise keep the ended memberships of slots that are
// not sampled soon.
func (s *MemoryStore) register(r *acquireReq, sl *memSlot, keys []string, now time.Time) {
	if len(keys) == 0 && !sl.ended(now) {
		return
	}
	entry, until := r.entry, now.Add(r.tagLife)
	s.tagMu.Lock()
	defer s.tagMu.Unlock()
	s.untagEnded(entry, sl, now)
	for _, k := range keys {
		t := s.tags[k]
		if t == nil {
			t = &memTag{members: make(map[string]time.Time)}
			s.tags[k] = t
		}
		if cur, ok := t.members[entry]; !ok || cur.Before(until) {
			t.members[entry] = until
		}
		sl.ref(k, until)
		if len(t.members) > 2*t.pruned+16 {
			for m, u := range t.members {
				if !now.Before(u) {
					// m's slot keeps its ref until the slot is
					// sampled, registered or dropped.
					delete(t.members, m)
				}
			}
			t.pruned = len(t.members)
		}
	}
}

// ref records sl's membership of index k until until (a policy has a few
// tags: a linear search).
func (sl *memSlot) ref(k string, until time.Time) {
	for i := range sl.tags {
		if sl.tags[i].tag == k {
			if sl.tags[i].until.Before(until) {
				sl.tags[i].until = until
			}
			return
		}
	}
	sl.tags = append(sl.tags, memRef{tag: k, until: until})
}

func (s *MemoryStore) commit(_ context.Context, reqs []commitReq) []commitRes {
	out := make([]commitRes, len(reqs))
	now := time.Now()
	for i, r := range reqs {
		sh := s.shard(r.entry)
		sh.mu.Lock()
		sl := sh.m[r.entry]
		// No slot: its fence ended (a slot a loader holds is not evicted).
		out[i].fenced = sl == nil
		if sl != nil {
			if sl.fence == r.rec.fence && now.Before(sl.fenceUntil) {
				out[i].stored = s.put(sh, r.entry, sl, &r.rec, now)
			} else {
				out[i].fenced = true
			}
			// Waiters wake whether or not the value was kept: without
			// it they take the lock and load.
			unlock(sl, r.token)
		}
		sh.mu.Unlock()
	}
	return out
}

// put stores rec as entry's value (slot sl, whose shard sh is locked),
// making room within the shard's share of MaxBytes, and reports whether it
// did. The value it replaces goes in any case: the load that passed the
// fence is newer, and an older copy must not be served after it. The value
// is copied: a loader's slice may share its array with a larger buffer (a
// response body), which would stay reachable but uncounted.
func (s *MemoryStore) put(sh *memShard, entry string, sl *memSlot, rec *record, now time.Time) bool {
	clearValue(sh, sl)
	size := int64(len(rec.value)) + int64(len(entry)) + memEntryOverhead
	if size > s.maxValue {
		return false
	}
	// Only slots holding a value free bytes (MaxEntries bounds the
	// others), and neither entry's own nor one a loader holds may go.
	skip := func(k string, sl *memSlot) bool { return sl.size == 0 || k == entry || now.Before(sl.lockUntil) }
	for sh.bytes+size > s.shardBytes {
		if !s.sweep(sh, now, true, skip) {
			return false
		}
	}
	sl.rec, sl.has, sl.until, sl.size = *rec, true, now.Add(rec.life), size
	sl.rec.value, sl.rec.life, sl.rec.tags = bytes.Clone(rec.value), 0, sl.refKeys(rec.tags)
	sh.bytes += size
	return true
}

// refKeys returns keys (a record's tag index keys, which read and acquire
// compare with the caller's: see covers), each sharing the string of sl's
// ref of that index when it has one (the acquire of the load registered
// it), so that a tag rendered from a client's arguments is held once per
// slot, not twice. nil for none.
func (sl *memSlot) refKeys(keys []string) []string {
	if len(keys) == 0 {
		return nil
	}
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k
		for _, ref := range sl.tags {
			if ref.tag == k {
				out[i] = ref.tag
				break
			}
		}
	}
	return out
}

func unlock(sl *memSlot, token string) {
	if sl.lockToken == token {
		sl.lockToken, sl.lockUntil = "", time.Time{}
	}
	if sl.wake != nil {
		close(sl.wake)
		sl.wake = nil
	}
}

func (s *MemoryStore) release(_ context.Context, reqs []releaseReq) []error {
	for _, r := range reqs {
		sh := s.shard(r.entry)
		sh.mu.Lock()
		if sl := sh.m[r.entry]; sl != nil && sl.lockToken == r.token {
			unlock(sl, r.token)
		}
		sh.mu.Unlock()
	}
	return make([]error, len(reqs))
}

// invalidate deletes the values of the live members of tags' indexes and
// bumps their fences, and deletes the indexes. Redis keeps an index until
// its memberships end, but that is not observable: a load registered in it
// took its fence in the same critical section, before this, so its fence
// is bumped below and it cannot store; any value or load of a member
// after this registers in the index again before taking its lock.
func (s *MemoryStore) invalidate(_ context.Context, scope Scope, tags []string, _ time.Duration) (int, error) {
	now := time.Now()
	members := make(map[string]struct{})
	s.tagMu.Lock()
	for _, tag := range tags {
		k := keyspace.CacheTag(scope, tag)
		if t := s.tags[k]; t != nil {
			for m, u := range t.members {
				if now.Before(u) {
					members[m] = struct{}{}
				}
			}
			// The members' refs to k stay, harmless: a ref only ever
			// removes its own entry from an index.
			delete(s.tags, k)
		}
	}
	s.tagMu.Unlock()
	n := 0
	for m := range members {
		sh := s.shard(m)
		sh.mu.Lock()
		if sl := sh.m[m]; sl != nil {
			if sl.has && now.Before(sl.until) {
				n++
			}
			clearValue(sh, sl)
			if now.Before(sl.fenceUntil) {
				sl.fence = s.nextFence()
			}
		}
		sh.mu.Unlock()
	}
	return n, nil
}

func (s *MemoryStore) subscribe(_ context.Context, entry string) (subscription, error) {
	return &memSub{s: s, entry: entry}, nil
}

// memSub waits on the slot's wake channel, fetched anew by each arm (a
// closed channel stays closed).
type memSub struct {
	s     *MemoryStore
	entry string
	ch    chan struct{}
}

func (m *memSub) arm() {
	sh := m.s.shard(m.entry)
	sh.mu.Lock()
	sl := m.s.slot(sh, m.entry, time.Now())
	if sl.wake == nil {
		sl.wake = make(chan struct{})
	}
	m.ch = sl.wake
	sh.mu.Unlock()
}

func (m *memSub) wake() <-chan struct{} { return m.ch }
func (m *memSub) alive() bool           { return true }
func (m *memSub) close()                {}
