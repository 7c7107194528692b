// Package storeguard is the breaker mcpgate puts around a store it reaches
// over the network (the limit store, the cache store): after a run of
// failed operations it stops calling the store, so that an outage costs a
// request nothing instead of a timeout, and a background probe closes it
// again once the store answers.
//
// The breaker knows nothing of the store: its owner wraps each operation in
// Skip (before) and Observe (after), and decides what counts as a failure
// (a timeout or a connection error does; an error reply of a server that
// answered does not).
package storeguard

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Options.
const (
	// DefaultFailures consecutive failures open the breaker.
	DefaultFailures = 3
	// DefaultProbeInterval is how often the probe checks an open breaker's
	// store.
	DefaultProbeInterval = 250 * time.Millisecond
	// MinProbeTimeout is the shortest deadline of one probe.
	MinProbeTimeout = 100 * time.Millisecond
)

// Options configures a Breaker. Probe is required; a zero field otherwise
// means its default.
type Options struct {
	// Probe checks that the store answers (a PING). Required.
	Probe func(ctx context.Context) error
	// Failures is how many consecutive failures open the breaker
	// (DefaultFailures when zero).
	Failures int
	// ProbeInterval is the time between two probes while open
	// (DefaultProbeInterval when zero).
	ProbeInterval time.Duration
	// ProbeTimeout bounds one probe (at least MinProbeTimeout).
	ProbeTimeout time.Duration
	// Name names the store in the breaker's log lines ("limit store").
	Name string
	// Logger receives one line when the breaker opens and one when it
	// closes; nil: slog.Default().
	Logger *slog.Logger
	// OnState, when set, is called with false when the breaker opens and
	// true when it closes, under the breaker's lock (keep it short).
	OnState func(up bool)
}

// Breaker is a store's breaker. It is closed (calls go to the store) until
// Failures consecutive failures open it; a probe every ProbeInterval then
// closes it once the store answers. Safe for concurrent use.
type Breaker struct {
	opts        Options
	consecutive atomic.Int32
	open        atomic.Bool
	skipped     atomic.Int64
	// checking is set while a check of the store (Suspect) runs;
	// suspects counts the operations suspected since the running check
	// began, whose fault it decides.
	checking atomic.Bool
	suspects atomic.Int32
	// opened counts the times the breaker opened: a check whose store
	// request went out before an opening says nothing of the store after
	// it (the probe may have closed the breaker since on a store that
	// answers), and its suspects are dropped.
	opened atomic.Uint64

	mu       sync.Mutex // serialises opening, closing and Close
	probing  bool
	down     chan struct{} // closed when the breaker opens; replaced when it closes
	stop     chan struct{}
	stopOnce sync.Once
	probes   sync.WaitGroup
}

// New returns a closed Breaker.
func New(opts Options) (*Breaker, error) {
	if opts.Probe == nil {
		return nil, errors.New("storeguard: Options.Probe is required")
	}
	if opts.Failures <= 0 {
		opts.Failures = DefaultFailures
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = DefaultProbeInterval
	}
	opts.ProbeTimeout = max(opts.ProbeTimeout, MinProbeTimeout)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Name == "" {
		opts.Name = "store"
	}
	return &Breaker{opts: opts, down: make(chan struct{}), stop: make(chan struct{})}, nil
}

// Available reports whether operations currently go to the store.
func (b *Breaker) Available() bool { return !b.open.Load() }

// Skip reports whether the breaker is open, counting the skipped operation:
// the caller then must not call the store.
func (b *Breaker) Skip() bool {
	if b.open.Load() {
		b.skipped.Add(1)
		return true
	}
	return false
}

// Skipped is the number of operations Skip refused so far.
func (b *Breaker) Skipped() int64 { return b.skipped.Load() }

// Opened returns a channel closed once the breaker is open (already, or the
// next time it opens).
func (b *Breaker) Opened() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.down
}

// Observe feeds the outcome of one operation to the breaker: a nil cause
// (the store answered) resets the count of consecutive failures; a failure
// counts one, and the one that reaches Options.Failures opens the breaker.
func (b *Breaker) Observe(cause error) {
	if cause == nil {
		b.consecutive.Store(0)
		return
	}
	b.fail(cause, 1)
}

// fail counts n failures, cause the last: the one that reaches
// Options.Failures opens the breaker.
func (b *Breaker) fail(cause error, n int32) {
	if b.consecutive.Add(n) >= int32(b.opts.Failures) {
		b.trip(cause)
	}
}

// Suspect reports an operation that failed in a way that need not be the
// store's fault: a caller's deadline, shorter than the store's own, ended
// it. It is not counted, for one impatient caller must not open the
// breaker for everyone while the store answers; but if it never counted, a
// store that stopped answering would never open the breaker while every
// caller's deadline is short, and each call would wait out its deadline.
// So it starts a check of the store (Probe under ProbeTimeout, the store's
// own deadline) in the background, one at a time: if the store fails it,
// the operations suspected while it ran were the store's fault after all
// and count as failures; if it answers, they are forgotten. Nothing
// happens while the breaker is open (its probe runs) or once closed.
func (b *Breaker) Suspect() {
	if b.open.Load() {
		return
	}
	b.suspects.Add(1)
	b.startCheck()
}

// startCheck starts a check of the suspects unless one runs.
func (b *Breaker) startCheck() {
	if !b.checking.CompareAndSwap(false, true) {
		return // the running check decides these too
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.stop:
		b.checking.Store(false)
		return // closed: no check may start
	default:
	}
	b.probes.Add(1)
	go b.check(b.opened.Load())
}

// check runs the check Suspect started and counts its suspects on failure,
// unless the breaker opened since the check began (opened moved on from
// gen) or is open: the probe judges the store then.
func (b *Breaker) check(gen uint64) {
	defer b.probes.Done()
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.ProbeTimeout)
	defer cancel()
	b.probes.Add(1) // the watcher below: Close waits for it too
	go func() {
		defer b.probes.Done()
		select {
		case <-b.stop: // Close waits for this check: do not hold it a timeout
			cancel()
		case <-ctx.Done():
		}
	}()
	err := b.opts.Probe(ctx)
	n := b.suspects.Swap(0)
	stale := b.open.Load() || b.opened.Load() != gen
	if err != nil && n > 0 && !stale && !errors.Is(ctx.Err(), context.Canceled) {
		b.fail(err, n)
	}
	b.checking.Store(false)
	// A Suspect between the Swap and the Store above found a check
	// running and started none: its suspect must not wait for the next.
	if b.suspects.Load() > 0 && !b.open.Load() {
		b.startCheck()
	}
}

// Trip opens the breaker at once, as its Failures-th consecutive failure
// would, for a cause that is not one call's failure (a caller knows the
// store must not be trusted until a probe succeeds). It does nothing when
// the breaker is already open or was closed.
func (b *Breaker) Trip(cause error) { b.trip(cause) }

func (b *Breaker) trip(cause error) {
	if b.open.Load() {
		// Open means a probe runs (both change together under mu): no
		// lock for the callers that keep tripping it meanwhile (a cache
		// with invalidations to replay trips it on every operation).
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.probing {
		return
	}
	select {
	case <-b.stop:
		return // closed: no probe may start
	default:
	}
	b.open.Store(true)
	b.opened.Add(1)
	b.probing = true
	close(b.down)
	if b.opts.OnState != nil {
		b.opts.OnState(false)
	}
	b.opts.Logger.Warn(b.opts.Name+" unavailable: skipping it until a probe succeeds",
		"err", cause, "consecutive_failures", b.consecutive.Load())
	b.probes.Add(1)
	go b.probeLoop()
}

func (b *Breaker) probeLoop() {
	defer b.probes.Done()
	t := time.NewTicker(b.opts.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.opts.ProbeTimeout)
		err := b.opts.Probe(ctx)
		cancel()
		if err != nil {
			continue
		}
		b.mu.Lock()
		if b.opts.OnState != nil {
			b.opts.OnState(true) // before calls resume: Available implies the state was told
		}
		b.consecutive.Store(0)
		b.probing = false
		b.down = make(chan struct{})
		b.open.Store(false)
		b.mu.Unlock()
		b.opts.Logger.Info(b.opts.Name + " reachable again")
		return
	}
}

// Close stops the probe, if one runs, and waits for it. The breaker stays
// in its state; it never opens again.
func (b *Breaker) Close() {
	b.mu.Lock()
	b.stopOnce.Do(func() { close(b.stop) })
	b.mu.Unlock()
	b.probes.Wait()
}
