package cache

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// ErrStoreSkipped means a store operation was not attempted: the store's
// breaker is open after Options.BreakerFailures consecutive failures, until
// a background probe sees the store answer again. The Cache then serves
// every Get by calling its Loader, as if the tool were not cached.
var ErrStoreSkipped = errors.New("cache: store skipped (breaker open)")

// Defaults of the store breaker (Options.BreakerFailures, ProbeInterval),
// the same as the limit store's.
const (
	DefaultBreakerFailures = 3
	DefaultProbeInterval   = 250 * time.Millisecond
)

// pinger is a store that does I/O and can be probed cheaply (RedisStore).
type pinger interface {
	ping(ctx context.Context) error
}

// guardedStore is a Store behind a breaker: after failures consecutive
// failed operations (timeouts, connection errors) it stops calling the
// store, so that an outage costs a Get nothing instead of a timeout, and a
// background probe closes it again once the store answers. Error replies
// of the server do not count: a server that answers is reachable, and
// skipping it would save no timeout.
type guardedStore struct {
	Store
	ping     func(ctx context.Context) error
	failures int32
	interval time.Duration
	timeout  time.Duration // of one probe
	log      *slog.Logger

	consecutive atomic.Int32
	open        atomic.Bool
	skipped     atomic.Int64

	mu       sync.Mutex // serialises opening and closing
	probing  bool
	down     chan struct{} // closed when the breaker opens; replaced when it closes
	stop     chan struct{}
	stopOnce sync.Once
	probes   sync.WaitGroup
}

var _ Store = (*guardedStore)(nil)

func newGuardedStore(s Store, p pinger, failures int, interval, timeout time.Duration, log *slog.Logger) *guardedStore {
	return &guardedStore{
		Store: s, ping: p.ping, failures: int32(failures), interval: interval,
		timeout: timeout, log: log, stop: make(chan struct{}), down: make(chan struct{}),
	}
}

// opened returns a channel closed once the breaker is open (already, or
// next time it opens): waiters for another loader's value stop waiting
// then, as that value cannot reach them through a store that is down.
func (g *guardedStore) opened() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.down
}

// available reports whether operations currently go to the store.
func (g *guardedStore) available() bool { return !g.open.Load() }

// skip reports whether the breaker is open, counting the skipped operation.
func (g *guardedStore) skip() bool {
	if g.open.Load() {
		g.skipped.Add(1)
		return true
	}
	return false
}

func (g *guardedStore) read(ctx context.Context, entry string) (record, bool, error) {
	if g.skip() {
		return record{}, false, ErrStoreSkipped
	}
	rec, ok, err := g.Store.read(ctx, entry)
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
	var failure error
	for _, err := range errs {
		if failed(ctx, err) {
			failure = err
			break
		}
	}
	if failure == nil {
		g.consecutive.Store(0)
		return
	}
	if g.consecutive.Add(1) >= g.failures {
		g.trip(failure)
	}
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

func (g *guardedStore) trip(cause error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.probing {
		return
	}
	select {
	case <-g.stop:
		return
	default:
	}
	g.open.Store(true)
	g.probing = true
	close(g.down)
	g.log.Warn("cache store unavailable: skipping it until a probe succeeds; cached tools are served uncached",
		"err", cause, "consecutive_failures", g.consecutive.Load())
	g.probes.Add(1)
	go g.probeLoop()
}

func (g *guardedStore) probeLoop() {
	defer g.probes.Done()
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
		err := g.ping(ctx)
		cancel()
		if err == nil {
			g.mu.Lock()
			g.consecutive.Store(0)
			g.open.Store(false)
			g.probing = false
			g.down = make(chan struct{})
			g.mu.Unlock()
			g.log.Info("cache store reachable again: caching resumed")
			return
		}
	}
}

// close stops the probe and waits for it.
func (g *guardedStore) close() {
	// Under mu, so that no trip starts a probe once Wait may run.
	g.mu.Lock()
	g.stopOnce.Do(func() { close(g.stop) })
	g.mu.Unlock()
	g.probes.Wait()
}
