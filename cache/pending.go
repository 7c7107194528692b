package cache

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// This file is the memory of failed invalidations (see Cache.Invalidate):
// an invalidation that fails or is skipped while the store is down would
// otherwise be lost, and once the store answers again every instance would
// serve the entries it was meant to drop until their TTL ends. The store's
// breaker stays open (reads bypass the cache) until every remembered
// invalidation has been replayed (see guardedStore).

// DefaultMaxPendingInvalidations is the default of
// Options.MaxPendingInvalidations.
const DefaultMaxPendingInvalidations = 10000

// lostLifeUnknown is how long the store stays unavailable after an
// invalidation was lost (see pendingInvalidations.lost) when this Cache has
// not loaded anything yet, so it does not know how long an entry lives.
const lostLifeUnknown = 24 * time.Hour

// replayChunk bounds the tags of one replayed invalidation, so that each
// round trip stays small enough for the operation timeout.
const replayChunk = 256

// errPendingInvalidations is the cause given to the breaker when a failed
// invalidation pushes it open, and the probe's error while invalidations
// are left to replay.
var errPendingInvalidations = errors.New("cache: failed invalidations not yet replayed")

// pendingInvalidations are the (scope, tag) pairs whose invalidation failed
// and was not replayed yet, at most limit of them. Past the bound a failed
// invalidation is not remembered: it is lost, and the store then counts as
// unavailable until every entry written before the loss has expired
// (lostUntil: the loss plus the longest life an entry of this Cache can get
// from a load starting then).
type pendingInvalidations struct {
	// dirty is set while the store must not be used: some pairs wait for
	// their replay, or a loss's period has not ended. Only the replay
	// (settle) clears it.
	dirty atomic.Bool

	mu        sync.Mutex
	tags      map[Scope]map[string]uint64 // tag -> seq of its latest failure
	n         int
	limit     int
	seq       uint64
	lostUntil time.Time

	failed, replayed, lost atomic.Int64
}

func newPendingInvalidations(limit int) *pendingInvalidations {
	return &pendingInvalidations{tags: make(map[Scope]map[string]uint64), limit: limit}
}

// add remembers that the invalidation of scope's tags failed; life is the
// longest life an entry can get from a load starting now, which bounds how
// long an entry a lost invalidation missed may be served. It returns how
// many tags could not be remembered (over the bound).
func (p *pendingInvalidations) add(scope Scope, tags []string, life time.Duration, now time.Time) (lost int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dirty.Store(true)
	p.failed.Add(int64(len(tags)))
	p.seq++
	m := p.tags[scope]
	for _, tag := range tags {
		if _, ok := m[tag]; !ok { // a new pair: counted against the bound
			if p.n >= p.limit {
				lost++
				continue
			}
			if m == nil {
				m = make(map[string]uint64)
				p.tags[scope] = m
			}
			p.n++
		}
		m[tag] = p.seq
	}
	if lost > 0 {
		p.lost.Add(int64(lost))
		if until := now.Add(life); until.After(p.lostUntil) {
			p.lostUntil = until
		}
	}
	return lost
}

// pendingBatch is a chunk of one scope's remembered tags, with the seq of
// each when it was taken.
type pendingBatch struct {
	scope Scope
	tags  []string
	seqs  []uint64
}

// batches returns the remembered tags in chunks of at most replayChunk.
func (p *pendingInvalidations) batches() []pendingBatch {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []pendingBatch
	for scope, m := range p.tags {
		tags := make([]string, 0, len(m))
		for tag := range m {
			tags = append(tags, tag)
		}
		slices.Sort(tags)
		for chunk := range slices.Chunk(tags, replayChunk) {
			b := pendingBatch{scope: scope, tags: chunk, seqs: make([]uint64, len(chunk))}
			for i, tag := range chunk {
				b.seqs[i] = m[tag]
			}
			out = append(out, b)
		}
	}
	return out
}

// done forgets b's tags, replayed, except those that failed again since b
// was taken (their replay may have missed what the later failure did not
// drop).
func (p *pendingInvalidations) done(b pendingBatch) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.tags[b.scope]
	for i, tag := range b.tags {
		if seq, ok := m[tag]; ok && seq == b.seqs[i] {
			delete(m, tag)
			p.n--
			p.replayed.Add(1)
		}
	}
	if len(m) == 0 {
		delete(p.tags, b.scope)
	}
}

// settle clears dirty when nothing is left to replay and no loss's period
// runs; otherwise it says why the store stays unavailable.
func (p *pendingInvalidations) settle(now time.Time) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.n > 0:
		return fmt.Errorf("%w: %d left", errPendingInvalidations, p.n)
	case now.Before(p.lostUntil):
		return fmt.Errorf("%w: some were lost (over Options.MaxPendingInvalidations): the store stays unavailable until %s, when every entry they may have missed has expired",
			errPendingInvalidations, p.lostUntil.Format(time.RFC3339))
	}
	p.lostUntil = time.Time{}
	p.dirty.Store(false)
	return nil
}

// pending returns how many pairs wait for their replay.
func (p *pendingInvalidations) pending() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return int64(p.n)
}
