package cache

import (
	"context"
	"time"
)

// Store is where a Cache keeps its entries, loader locks, fences and tag
// indexes: a *MemoryStore (one process) or a *RedisStore (shared by every
// gateway instance). Caches sharing one store coalesce their loads: a key is
// loaded once for all of them. The interface is sealed: only this package
// implements it, so that both stores keep the same semantics, which one
// conformance suite checks.
//
// acquire, commit and release take and give up locks: a store doing I/O
// runs them to their end even when ctx ends first (the caller then gets
// ctx's error), and releases the locks an acquire took for a caller that
// had stopped waiting, so that no lock outlives the load it was taken for
// (other instances would wait for it for the lock's whole TTL).
type Store interface {
	// read returns the record of key's entry; ok is false when there is
	// none, only an unreadable one, or one that a tag index it was
	// registered in (rec.tags) no longer lists: an invalidation could not
	// find it, so it is never served (RedisStore deletes it, so that
	// acquire, which registers it again, does not return it either).
	// Stale copies are returned too. tags are the caller's policy's: a
	// record that does not name each of them (stored before a reload added
	// a tag to its tool) is read as absent, since that tag's invalidation
	// cannot find it; beyond them, the record's own tags are what is
	// checked.
	read(ctx context.Context, key Key, tags []string) (rec record, ok bool, err error)
	// acquire runs get-or-lock for every request, and registers each
	// request's entry in its tag indexes before the lock can be used, so an
	// invalidation that misses the registration happened before the load.
	acquire(ctx context.Context, reqs []acquireReq) []acquireRes
	// commit stores each record if its fence is still the entry's current
	// fence, releases the lock if still held by the token, and wakes waiters.
	commit(ctx context.Context, reqs []commitReq) []commitRes
	// release deletes each lock still held by its token and wakes waiters.
	release(ctx context.Context, reqs []releaseReq) []error
	// subscribe returns a subscription to the entry's wake-ups.
	subscribe(ctx context.Context, entry string) (subscription, error)
	// invalidate deletes scope's entries tagged with any of tags and bumps
	// their fences, so loads in flight cannot store what they read before.
	// Each round trip to the server is bounded by step (0: only by ctx).
	invalidate(ctx context.Context, scope Scope, tags []string, step time.Duration) (int, error)
}

type acquireMode uint8

const (
	// modeMiss: return the value if fresh, else take the lock.
	modeMiss acquireMode = iota
	// modeRefresh: take the lock only if the value is still the one the
	// reader saw (fence seen), so two early refreshes do not run in a row.
	modeRefresh
)

type acquireReq struct {
	entry    string
	scope    Scope
	tags     []string
	tagLife  time.Duration // how long the tag memberships must last
	token    string        // lock owner
	lockTTL  time.Duration
	fenceTTL time.Duration
	mode     acquireMode
	seen     uint64
}

type acquireStatus uint8

const (
	statusFresh  acquireStatus = iota // rec is a fresh value
	statusLocked                      // the lock is ours, under fence
	statusBusy                        // another loader holds the lock for wait
	statusSkip                        // refresh: the value changed or is gone
)

type acquireRes struct {
	status acquireStatus
	rec    record
	fence  uint64
	wait   time.Duration
	err    error
}

type commitReq struct {
	entry   string
	token   string
	rec     record        // rec.fence is the loader's fence; rec.life the key's life
	lockTTL time.Duration // how long the lock can outlive a commit that failed half-way
}

type commitRes struct {
	stored bool
	// fenced: refused because the fence is no longer the loader's (an
	// invalidation or a newer load came after it); not set when the
	// store merely did not keep the value (MemoryOptions.MaxBytes,
	// RedisOptions.MaxValueBytes).
	fenced bool
	err    error
}

type releaseReq struct {
	entry   string
	token   string
	lockTTL time.Duration // how long the lock can outlive a release that failed half-way
}

// subscription delivers an entry's wake-ups (a value landed, or a lock was
// released without one). Protocol: arm, check the entry, then wait on wake:
// a wake-up after arm is never lost.
type subscription interface {
	arm()
	wake() <-chan struct{}
	// alive is false once the subscription ended on its own (the server
	// dropped it); subscribe again.
	alive() bool
	close()
}
