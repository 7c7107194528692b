package cache

import (
	"context"
	"errors"
	"log/slog"
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
type guardedStore struct {
	Store
	br *storeguard.Breaker
}

var _ Store = (*guardedStore)(nil)

func newGuardedStore(s Store, p pinger, failures int, interval, timeout time.Duration, log *slog.Logger) (*guardedStore, error) {
	br, err := storeguard.New(storeguard.Options{
		Probe: p.ping, Failures: failures, ProbeInterval: interval, ProbeTimeout: timeout,
		Name: "cache store", Logger: log,
	})
	if err != nil {
		return nil, err
	}
	return &guardedStore{Store: s, br: br}, nil
}

// opened returns a channel closed once the breaker is open (already, or
// next time it opens): waiters for another loader's value stop waiting
// then, as that value cannot reach them through a store that is down.
func (g *guardedStore) opened() <-chan struct{} { return g.br.Opened() }

// available reports whether operations currently go to the store.
func (g *guardedStore) available() bool { return g.br.Available() }

// skip reports whether the breaker is open, counting the skipped operation.
func (g *guardedStore) skip() bool { return g.br.Skip() }

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

func (g *guardedStore) invalidate(ctx context.Context, scope Scope, tags []string, step time.Duration) (int, error) {
	if g.skip() {
		return 0, ErrStoreSkipped
	}
	n, err := g.Store.invalidate(ctx, scope, tags, step)
	g.observe(ctx, err)
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

// failed tells whether err says the store did not answer.
func failed(ctx context.Context, err error) bool {
	var reply *rueidis.RedisError
	switch {
	case err == nil, errors.Is(err, errNoPubSub), errors.Is(err, errReply), errors.As(err, &reply):
		// No I/O, or the server answered.
		return false
	case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
		// The caller went away; that says nothing about the store.
		return false
	}
	return true
}

// close stops the probe and waits for it.
func (g *guardedStore) close() { g.br.Close() }
