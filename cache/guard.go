package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/internal/storeguard"
)

// ErrStoreSkipped means a store operation was not attempted: the store's
// breaker is open after Options.BreakerFailures consecutive failures, until
// a background probe sees the store answer again. The Cache then serves
// every Get by calling its Loader, as if the tool were not cached.
var ErrStoreSkipped = errors.New("cache: store skipped (breaker open)")

// Defaults of the store breaker (Options.BreakerFailures, ProbeInterval),
// the same as the limit store's.
const (
	DefaultBreakerFailures = storeguard.DefaultFailures
	DefaultProbeInterval   = storeguard.DefaultProbeInterval
)

// pinger is a store that does I/O and can be probed cheaply (RedisStore).
type pinger interface {
	ping(ctx context.Context) error
}

// guardedStore is a Store behind a breaker (internal/storeguard): after
// failures consecutive failed operations (timeouts, connection errors) it
// stops calling the store, so that an outage costs a Get nothing instead of
// a timeout, and a background probe closes it again once the store
// answers. Error replies of the server do not count: a server that answers
// is reachable, and skipping it would save no timeout.
//
// An invalidation that fails (or is skipped) is remembered (pend) and
// pushes the breaker open whatever the count: until it is replayed, the
// store may hold entries it was meant to drop, so no operation goes to the
// store. The probe replays the remembered invalidations once the store
// answers, and succeeds (closing the breaker) only when all of them went
// through; otherwise the breaker stays open and the next probe tries again.
type guardedStore struct {
	Store
	br      *storeguard.Breaker
	pend    *pendingInvalidations
	timeout time.Duration // bound of one round trip of a replay
	log     *slog.Logger
	// life is the longest life (ns) an entry of this Cache can get from a
	// load starting now, the most seen (see noteLife); 0: none seen.
	life    atomic.Int64
	stopped atomic.Bool
}

var _ Store = (*guardedStore)(nil)

func newGuardedStore(s Store, p pinger, failures, maxPending int, interval, timeout time.Duration, log *slog.Logger) (*guardedStore, error) {
	g := &guardedStore{Store: s, pend: newPendingInvalidations(maxPending), timeout: timeout, log: log}
	br, err := storeguard.New(storeguard.Options{
		Probe: func(ctx context.Context) error {
			if err := p.ping(ctx); err != nil {
				return err
			}
			return g.replay()
		},
		Failures: failures, ProbeInterval: interval, ProbeTimeout: timeout,
		Name: "cache store", Logger: log,
	})
	if err != nil {
		return nil, err
	}
	g.br = br
	return g, nil
}

// opened returns a channel closed once the breaker is open (already, or
// next time it opens): waiters for another loader's value stop waiting
// then, as that value cannot reach them through a store that is down.
func (g *guardedStore) opened() <-chan struct{} { return g.br.Opened() }

// available reports whether operations currently go to the store: the
// breaker is closed and no failed invalidation waits for its replay.
func (g *guardedStore) available() bool { return g.br.Available() && !g.pend.dirty.Load() }

// skip reports whether the breaker is open, counting the skipped operation.
// Failed invalidations not yet replayed open it (again: it may have closed
// after a replay that finished just before they failed).
func (g *guardedStore) skip() bool {
	if g.pend.dirty.Load() {
		g.forceOpen()
	}
	return g.br.Skip()
}

// forceOpen opens the breaker, if closed, because a failed invalidation
// waits for its replay: the store may serve the entries it missed.
func (g *guardedStore) forceOpen() { g.br.Trip(errPendingInvalidations) }

// noteLife records that an entry loaded from now on may live up to life.
func (g *guardedStore) noteLife(life time.Duration) {
	for {
		cur := g.life.Load()
		if int64(life) <= cur || g.life.CompareAndSwap(cur, int64(life)) {
			return
		}
	}
}

// remember records the failed invalidation of scope's tags and opens the
// breaker until it is replayed.
func (g *guardedStore) remember(scope Scope, tags []string, cause error) {
	life := time.Duration(g.life.Load())
	if life == 0 {
		life = lostLifeUnknown
	}
	if lost := g.pend.add(scope, tags, life, time.Now()); lost > 0 {
		g.log.Error("cache: failed invalidations over Options.MaxPendingInvalidations are lost: this instance serves without the cache until every entry they may have missed has expired; other instances may serve those entries until then (invalidate the tags again once the store is back)",
			"lost", lost, "lost_total", g.pend.lost.Load(), "uncached_for", life, "err", cause)
	}
	g.forceOpen()
}

// replay replays the remembered invalidations on the store (the probe's
// success path: the store answers). It fails, keeping the breaker open,
// unless all of them went through and no loss's period runs.
func (g *guardedStore) replay() error {
	if !g.pend.dirty.Load() {
		return nil
	}
	n := 0
	for _, b := range g.pend.batches() {
		if g.stopped.Load() {
			return ErrClosed
		}
		if _, err := g.Store.invalidate(context.Background(), b.scope, b.tags, g.timeout); err != nil {
			return fmt.Errorf("cache: replaying failed invalidations: %w", err)
		}
		g.pend.done(b)
		n += len(b.tags)
	}
	if n > 0 {
		g.log.Info("cache: replayed failed invalidations", "tags", n, "replayed_total", g.pend.replayed.Load())
	}
	return g.pend.settle(time.Now())
}

func (g *guardedStore) read(ctx context.Context, key Key, tags []string) (record, bool, error) {
	if g.skip() {
		return record{}, false, ErrStoreSkipped
	}
	rec, ok, err := g.Store.read(ctx, key, tags)
	g.observe(ctx, err)
	return rec, ok, err
}

func (g *guardedStore) acquire(ctx context.Context, reqs []acquireReq) []acquireRes {
	if g.skip() {
		out := make([]acquireRes, len(reqs))
		for i := range out {
			out[i].err = ErrStoreSkipped
		}
		return out
	}
	out := g.Store.acquire(ctx, reqs)
	errs := make([]error, len(out))
	for i := range out {
		errs[i] = out[i].err
	}
	g.observe(ctx, errs...)
	return out
}

func (g *guardedStore) commit(ctx context.Context, reqs []commitReq) []commitRes {
	if g.skip() {
		out := make([]commitRes, len(reqs))
		for i := range out {
			out[i].err = ErrStoreSkipped
		}
		return out
	}
	out := g.Store.commit(ctx, reqs)
	errs := make([]error, len(out))
	for i := range out {
		errs[i] = out[i].err
	}
	g.observe(ctx, errs...)
	return out
}

func (g *guardedStore) release(ctx context.Context, reqs []releaseReq) []error {
	if g.skip() {
		out := make([]error, len(reqs))
		for i := range out {
			out[i] = ErrStoreSkipped
		}
		return out
	}
	out := g.Store.release(ctx, reqs)
	g.observe(ctx, out...)
	return out
}

func (g *guardedStore) subscribe(ctx context.Context, entry string) (subscription, error) {
	if g.skip() {
		return nil, ErrStoreSkipped
	}
	s, err := g.Store.subscribe(ctx, entry)
	g.observe(ctx, err)
	return s, err
}

// invalidate remembers an invalidation that fails or is skipped, whatever
// the cause (a timeout, an error reply, the caller leaving: what it did is
// unknown), and opens the breaker until the probe replayed it.
func (g *guardedStore) invalidate(ctx context.Context, scope Scope, tags []string, step time.Duration) (int, error) {
	if g.skip() {
		g.remember(scope, tags, ErrStoreSkipped)
		return 0, ErrStoreSkipped
	}
	n, err := g.Store.invalidate(ctx, scope, tags, step)
	g.observe(ctx, err)
	if err != nil {
		g.remember(scope, tags, err)
	}
	return n, err
}

// observe feeds the results of one operation to the breaker: any failure
// counts once, otherwise an answer resets the count.
func (g *guardedStore) observe(ctx context.Context, errs ...error) {
	for _, err := range errs {
		if failed(ctx, err) {
			g.br.Observe(err)
			return
		}
	}
	g.br.Observe(nil)
}

// errOpTimeout is the cause of a store operation's own deadline
// (Options.Timeout, see withOpTimeout).
var errOpTimeout = errors.New("cache: store operation timed out")

// withOpTimeout bounds a store operation by d, marking the deadline as the
// operation's own: when the caller's ends first (its deadline, or it went
// away), the store was not too slow for anyone else (see failed).
func withOpTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return withOpDeadline(ctx, time.Now().Add(d))
}

// withOpDeadline is withOpTimeout with the operation's deadline.
func withOpDeadline(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithDeadlineCause(ctx, deadline, errOpTimeout)
	return context.WithValue(ctx, opDeadlineKey{}, deadline), cancel
}

// opDeadlineKey is the context key of an operation's own deadline (see
// withOpDeadline).
type opDeadlineKey struct{}

// callersDeadline reports whether ctx's deadline is its caller's, earlier
// than the operation's own: rueidis times a command out by ctx's deadline
// on a timer of its own, which can fire before ctx is done, so the cause
// alone cannot tell.
func callersDeadline(ctx context.Context) bool {
	own, ok := ctx.Value(opDeadlineKey{}).(time.Time)
	dl, has := ctx.Deadline()
	return ok && has && dl.Before(own)
}

// failed tells whether err says the store did not answer. ctx is the
// operation's: a timeout counts only when it is the operation's own
// (withOpTimeout) or the store's inside it, not when the caller's context
// ended first (it went away, or its deadline was shorter): a caller with
// short deadlines would otherwise open the breaker, and serve every
// tenant's cached tools uncached, while the store answers everyone else.
func failed(ctx context.Context, err error) bool {
	var reply *rueidis.RedisError
	switch {
	case err == nil, errors.Is(err, errNoPubSub), errors.Is(err, errReply), errors.As(err, &reply):
		// No I/O, or the server answered.
		return false
	case ctx.Err() != nil && !errors.Is(context.Cause(ctx), errOpTimeout), callersDeadline(ctx):
		return false
	}
	return true
}

// close stops the probe (a replay in progress stops after its current
// round trip) and waits for it.
func (g *guardedStore) close() {
	g.stopped.Store(true)
	g.br.Close()
}
