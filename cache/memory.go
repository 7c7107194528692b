package cache

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
)

// DefaultMaxEntries is MemoryOptions.MaxEntries when zero.
const DefaultMaxEntries = 100_000

// MemoryOptions configures a MemoryStore. A nil *MemoryOptions means all
// defaults.
type MemoryOptions struct {
	// MaxEntries bounds the entries held (values, locks and fences of one
	// key count once). When full, an insertion drops expired entries
	// first, else the sampled entry nearest its expiry (like Redis's
	// volatile-ttl). Default DefaultMaxEntries.
	MaxEntries int
}

// MemoryStore keeps entries in this process: the embedded default, and
// what Caches of one process share. Locks, fences, wake-ups and tag indexes
// behave as in RedisStore, on a monotonic clock. It is safe for concurrent
// use; the zero MemoryStore is not usable: build one with NewMemoryStore.
type MemoryStore struct {
	seed     maphash.Seed
	shards   [memShards]memShard
	perShard int
	fences   atomic.Uint64

	tagMu sync.Mutex
	tags  map[string]*memTag
}

const memShards = 32

type memShard struct {
	mu sync.RWMutex
	m  map[string]*memSlot
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
}

func (s *memSlot) dead(now time.Time) bool {
	return !now.Before(s.until) && !now.Before(s.lockUntil) && !now.Before(s.fenceUntil)
}

// drop deletes the slot of k, waking its waiters (they check again).
func drop(sh *memShard, k string, sl *memSlot) {
	if sl.wake != nil {
		close(sl.wake)
		sl.wake = nil
	}
	delete(sh.m, k)
}

type memTag struct {
	members map[string]time.Time
	pruned  int // size after the last prune
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore(opts *MemoryOptions) (*MemoryStore, error) {
	limit := DefaultMaxEntries
	if opts != nil {
		if opts.MaxEntries < 0 {
			return nil, fmt.Errorf("%w: negative MaxEntries %d", ErrInvalidOptions, opts.MaxEntries)
		}
		if opts.MaxEntries > 0 {
			limit = opts.MaxEntries
		}
	}
	s := &MemoryStore{seed: maphash.MakeSeed(), perShard: max(1, (limit+memShards-1)/memShards), tags: make(map[string]*memTag)}
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

func (s *MemoryStore) shard(entry string) *memShard {
	return &s.shards[maphash.String(s.seed, entry)%memShards]
}

func (s *MemoryStore) read(_ context.Context, entry string) (record, bool, error) {
	sh := s.shard(entry)
	now := time.Now()
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	sl := sh.m[entry]
	if sl == nil || !sl.has || !now.Before(sl.until) {
		return record{}, false, nil
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
	s.sweep(sh, now, len(sh.m) >= s.perShard)
	sl := &memSlot{}
	sh.m[entry] = sl
	return sl
}

// sweep drops dead slots among a few sampled ones (map iteration starts at
// a random place); when full is set and none was dead, it drops the sampled
// slot nearest its expiry that no loader holds.
func (s *MemoryStore) sweep(sh *memShard, now time.Time, full bool) {
	const samples = 8
	var victim string
	var victimUntil time.Time
	seen, dropped := 0, false
	for k, sl := range sh.m {
		if seen++; seen > samples {
			break
		}
		if sl.dead(now) {
			drop(sh, k, sl)
			dropped = true
			continue
		}
		if now.Before(sl.lockUntil) {
			continue
		}
		if victim == "" || sl.until.Before(victimUntil) {
			victim, victimUntil = k, sl.until
		}
	}
	if full && !dropped && victim != "" {
		drop(sh, victim, sh.m[victim])
	}
}

func (s *MemoryStore) nextFence() uint64 { return s.fences.Add(1) }

func (s *MemoryStore) acquire(_ context.Context, reqs []acquireReq) []acquireRes {
	out := make([]acquireRes, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		s.register(r)
		out[i] = s.acquireOne(r)
	}
	return out
}

func (s *MemoryStore) acquireOne(r *acquireReq) acquireRes {
	sh := s.shard(r.entry)
	now := time.Now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sl := s.slot(sh, r.entry, now)
	live := sl.has && now.Before(sl.until)
	switch {
	case r.mode == modeMiss && live && sl.until.Sub(now) > sl.rec.stale:
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

// register adds r's entry to its tag indexes, pruning expired members once
// an index has doubled since its last prune.
func (s *MemoryStore) register(r *acquireReq) {
	if len(r.tags) == 0 {
		return
	}
	now := time.Now()
	until := now.Add(r.tagLife)
	s.tagMu.Lock()
	defer s.tagMu.Unlock()
	for _, tag := range r.tags {
		k := keyspace.CacheTag(r.scope, tag)
		t := s.tags[k]
		if t == nil {
			t = &memTag{members: make(map[string]time.Time)}
			s.tags[k] = t
		}
		if cur, ok := t.members[r.entry]; !ok || cur.Before(until) {
			t.members[r.entry] = until
		}
		if len(t.members) > 2*t.pruned+16 {
			for m, u := range t.members {
				if !now.Before(u) {
					delete(t.members, m)
				}
			}
			t.pruned = len(t.members)
		}
	}
}

func (s *MemoryStore) commit(_ context.Context, reqs []commitReq) []commitRes {
	out := make([]commitRes, len(reqs))
	now := time.Now()
	for i, r := range reqs {
		sh := s.shard(r.entry)
		sh.mu.Lock()
		sl := sh.m[r.entry]
		if sl != nil {
			if sl.fence == r.rec.fence && now.Before(sl.fenceUntil) {
				sl.rec, sl.has, sl.until = r.rec, true, now.Add(r.rec.life)
				sl.rec.life = 0
				out[i].stored = true
			}
			unlock(sl, r.token)
		}
		sh.mu.Unlock()
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

func (s *MemoryStore) invalidate(_ context.Context, scope Scope, tags []string, _ time.Duration) (int, error) {
	now := time.Now()
	members := make(map[string]struct{})
	s.tagMu.Lock()
	for _, tag := range tags {
		if t := s.tags[keyspace.CacheTag(scope, tag)]; t != nil {
			for m, u := range t.members {
				if now.Before(u) {
					members[m] = struct{}{}
				}
			}
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
			sl.has, sl.rec, sl.until = false, record{}, time.Time{}
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
