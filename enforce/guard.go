package enforce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/mcpgate/mcpgate/internal/storeguard"
	"github.com/mcpgate/mcpgate/limit"
)

// DefaultStoreFailures consecutive store errors open the limit store's
// breaker.
const DefaultStoreFailures = storeguard.DefaultFailures

// guardedStore wraps the shared limit store with a breaker
// (internal/storeguard): after DefaultStoreFailures errors in a row it stops
// calling the store (so an outage costs each request nothing instead of a
// timeout) and a background probe closes the breaker again once the store
// answers.
type guardedStore struct {
	limit.GuardedStore
	br     *storeguard.Breaker
	tracer trace.Tracer // nil: no store spans (see storeSpan)
	// timeout is the store's own deadline of one operation (see
	// callersDeadline).
	timeout time.Duration
}

// timeouter is a store that reports the deadline it puts on one operation
// (redisstore.Store).
type timeouter interface{ Timeout() time.Duration }

// newGuardedStore wraps s. timeout is store.timeout: the probe's deadline,
// and the store's own deadline of one operation unless s reports its own
// (timeouter). onState, when set, is told when the breaker opens (false)
// and closes (true): it drives the mcpgate_limit_store_up gauge.
func newGuardedStore(s limit.GuardedStore, probe func(context.Context) error, timeout time.Duration, log *slog.Logger, onState func(up bool)) (*guardedStore, error) {
	br, err := storeguard.New(storeguard.Options{Probe: probe, ProbeTimeout: timeout, Name: "limit store", Logger: log, OnState: onState})
	if err != nil {
		return nil, err
	}
	if t, ok := s.(timeouter); ok {
		timeout = t.Timeout()
	}
	return &guardedStore{GuardedStore: s, br: br, timeout: timeout}, nil
}

// Available reports whether calls currently go to the store.
func (g *guardedStore) Available() bool { return g.br.Available() }

// down reports whether the breaker is open: the store must not be called.
// The call is counted as refused (see refused).
func (g *guardedStore) down() bool { return g.br.Skip() }

// enter tells whether an operation the breaker observes may go to the
// store, and when it starts (see observe). A caller whose context already
// ended gets its context's error, and the store is neither asked nor
// charged with a failure: that caller's deadline says nothing of the
// store, and counted, one impatient caller would open the breaker, and
// hand every tenant to on_error, while the store answers everyone else.
// An open breaker gives ErrStoreDown (counted as refused).
func (g *guardedStore) enter(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, notAsked(err)
	}
	if g.down() {
		return time.Time{}, ErrStoreDown
	}
	return time.Now(), nil
}

// notAsked is the error of an operation not sent to the store because the
// caller's context (err) had ended.
func notAsked(err error) error { return fmt.Errorf("enforce: limit store not asked: %w", err) }

// refused is how many calls the open breaker refused so far: a caller that
// failed tells from it whether the breaker (not the store's answer) was
// the cause, and so whether waiting for the probe can help.
func (g *guardedStore) refused() int64 { return g.br.Skipped() }

// storePoll is how often awaitUp looks at the breaker: small beside the
// probe's interval, which decides when it closes.
const storePoll = 10 * time.Millisecond

// awaitUp waits until the breaker is closed (the probe found the store
// answering) or until passes, and reports whether it is closed. Only the
// shutdown waits so: a call is decided at once whatever the breaker says.
func (g *guardedStore) awaitUp(until time.Time) bool {
	for !g.Available() {
		wait := time.Until(until)
		if wait <= 0 {
			return false
		}
		time.Sleep(min(wait, storePoll))
	}
	return true
}

func (g *guardedStore) Take(ctx context.Context, checks []limit.Check, cost int64) (limit.Decision, error) {
	start, err := g.enter(ctx)
	if err != nil {
		return limit.Decision{}, err
	}
	d, err := g.GuardedStore.Take(ctx, checks, cost)
	g.observe(ctx, start, err)
	return d, err
}

func (g *guardedStore) Refund(ctx context.Context, checks []limit.Check, cost int64, lease string) error {
	start, err := g.enter(ctx)
	if err != nil {
		return err
	}
	sctx, span := g.storeSpan(ctx, "refund")
	err = g.GuardedStore.Refund(sctx, checks, cost, lease)
	endStoreSpan(span, err)
	g.observe(ctx, start, err)
	return err
}

// Renew implements limit.Renewer.
func (g *guardedStore) Renew(ctx context.Context, checks []limit.Check, lease string) (bool, error) {
	start, err := g.enter(ctx)
	if err != nil {
		return false, err
	}
	held, err := g.GuardedStore.Renew(ctx, checks, lease)
	g.observe(ctx, start, err)
	return held, err
}

func (g *guardedStore) Release(ctx context.Context, checks []limit.Check, lease string) error {
	start, err := g.enter(ctx)
	if err != nil {
		return err
	}
	sctx, span := g.storeSpan(ctx, "release")
	err = g.GuardedStore.Release(sctx, checks, lease)
	endStoreSpan(span, err)
	g.observe(ctx, start, err)
	return err
}

// observe feeds the error of one operation, started at start, to the
// breaker: the store's failures count, our own mistakes and a caller that
// went away do not. A timeout counts only when it is the store's own (past
// store.timeout): the store was then too slow for anyone. One under the
// caller's shorter deadline is suspected (storeguard's Suspect): it counts
// only if a check of the store under its own timeout fails too.
func (g *guardedStore) observe(ctx context.Context, start time.Time, err error) {
	switch {
	case err == nil:
		g.br.Observe(nil)
	case errors.Is(err, limit.ErrInvalidRule), errors.Is(err, limit.ErrInvalidCost), errors.Is(err, limit.ErrNoChecks):
		// our own mistake, not the store's health
	case errors.Is(err, limit.ErrStoreRefused):
		// the store answered: one key or command is wrong, not the store
		// (counted, one tenant's bad key would take it down for all)
	case neverPlaced(err):
		// the store answered: one meter is full (MaxUsage), past its
		// expiry, or given an invalid write; counted, one tenant's meter
		// would take the store down for all
	case errors.Is(ctx.Err(), context.Canceled):
		// the caller went away; says nothing about the store
	case errors.Is(err, context.DeadlineExceeded) && g.callersDeadline(ctx, start):
		// the caller's deadline, shorter than the store's, ended it: not
		// counted, but a check under the store's own timeout decides
		// whether the store was too slow for anyone (a dead store must
		// open the breaker even when every caller's deadline is short)
		g.br.Suspect()
	default:
		g.br.Observe(err)
	}
}

// callersDeadline reports whether ctx's deadline came before the store's
// own for an operation started at start: a timeout was then the caller's.
// Whether ctx is done cannot tell: rueidis times a command out by ctx's
// deadline on a timer of its own, which can fire before ctx is done, and a
// caller's deadline just past the store's may be done by the time the
// store's own timeout is observed.
func (g *guardedStore) callersDeadline(ctx context.Context, start time.Time) bool {
	dl, ok := ctx.Deadline()
	return ok && dl.Before(start.Add(g.timeout))
}

// Close stops the background probe.
func (g *guardedStore) Close() { g.br.Close() }

// The usage-meter methods go through the same breaker: a meter lives in the
// shared store like any counter.

func (g *guardedStore) TakeMetered(ctx context.Context, checks []limit.Check, m limit.Meter, cost int64) (limit.Decision, limit.MeterResult, error) {
	start, err := g.enter(ctx)
	if err != nil {
		return limit.Decision{}, limit.MeterResult{}, err
	}
	d, r, err := g.GuardedStore.TakeMetered(ctx, checks, m, cost)
	g.observe(ctx, start, err)
	return d, r, err
}

func (g *guardedStore) Adjust(ctx context.Context, m limit.Meter, delta limit.Usage) (limit.MeterResult, error) {
	start, err := g.enter(ctx)
	if err != nil {
		return limit.MeterResult{}, err
	}
	sctx, span := g.storeSpan(ctx, "adjust")
	r, err := g.GuardedStore.Adjust(sctx, m, delta)
	endStoreSpan(span, err)
	g.observe(ctx, start, err)
	return r, err
}

// pastBreaker is g with Adjust sent to the store even while the breaker is
// open: the meterer's placement of in-doubt ops, which must not wait for
// the probe (see meterer's placing). The outcome is observed as any
// other: an answer while open only resets the count of failures (the probe
// alone closes the breaker), a failure while open changes nothing.
type pastBreaker struct{ *guardedStore }

func (p pastBreaker) Adjust(ctx context.Context, m limit.Meter, delta limit.Usage) (limit.MeterResult, error) {
	if err := ctx.Err(); err != nil {
		return limit.MeterResult{}, notAsked(err)
	}
	start := time.Now()
	sctx, span := p.storeSpan(ctx, "adjust")
	r, err := p.GuardedStore.Adjust(sctx, m, delta)
	endStoreSpan(span, err)
	p.observe(ctx, start, err)
	return r, err
}

func (g *guardedStore) ReadMeter(ctx context.Context, key string) (limit.MeterState, bool, error) {
	if g.down() {
		return limit.MeterState{}, false, ErrStoreDown
	}
	return g.GuardedStore.ReadMeter(ctx, key)
}

func (g *guardedStore) MarkFlushed(ctx context.Context, key, gen string, u limit.Usage) error {
	if g.down() {
		return ErrStoreDown
	}
	return g.GuardedStore.MarkFlushed(ctx, key, gen, u)
}

func (g *guardedStore) ScanMeters(ctx context.Context, fn func(limit.MeterState) error) error {
	if g.down() {
		return ErrStoreDown
	}
	return g.GuardedStore.ScanMeters(ctx, fn)
}

// The loop-breaker methods go through the breaker too.

func (g *guardedStore) Evaluate(ctx context.Context, req limit.Request) (limit.Outcome, error) {
	start, err := g.enter(ctx)
	if err != nil {
		return limit.Outcome{}, err
	}
	o, err := g.GuardedStore.Evaluate(ctx, req)
	g.observe(ctx, start, err)
	return o, err
}

func (g *guardedStore) ReportOutcome(ctx context.Context, b limit.BreakerSpec, failed, probe bool) (limit.BreakerState, error) {
	start, err := g.enter(ctx)
	if err != nil {
		return limit.BreakerState{}, err
	}
	sctx, span := g.storeSpan(ctx, "breaker_outcome")
	st, err := g.GuardedStore.ReportOutcome(sctx, b, failed, probe)
	endStoreSpan(span, err)
	g.observe(ctx, start, err)
	return st, err
}

func (g *guardedStore) AddDenials(ctx context.Context, b limit.BreakerSpec, n int64) (limit.BreakerState, error) {
	start, err := g.enter(ctx)
	if err != nil {
		return limit.BreakerState{}, err
	}
	sctx, span := g.storeSpan(ctx, "breaker_denials")
	st, err := g.GuardedStore.AddDenials(sctx, b, n)
	endStoreSpan(span, err)
	g.observe(ctx, start, err)
	return st, err
}

func (g *guardedStore) ReleaseProbe(ctx context.Context, b limit.BreakerSpec) error {
	start, err := g.enter(ctx)
	if err != nil {
		return err
	}
	sctx, span := g.storeSpan(ctx, "breaker_probe_release")
	err = g.GuardedStore.ReleaseProbe(sctx, b)
	endStoreSpan(span, err)
	g.observe(ctx, start, err)
	return err
}

func (g *guardedStore) ListBreakers(ctx context.Context, fn func(limit.BreakerInfo) error) error {
	if g.down() {
		return ErrStoreDown
	}
	return g.GuardedStore.ListBreakers(ctx, fn)
}

func (g *guardedStore) ResetBreaker(ctx context.Context, key string) (bool, error) {
	if g.down() {
		return false, ErrStoreDown
	}
	return g.GuardedStore.ResetBreaker(ctx, key)
}

// ErrNoReset means a limit store cannot reset counters (it is not a
// limit.Resetter).
var ErrNoReset = errors.New("enforce: the limit store cannot reset counters")

// Reset implements limit.Resetter when the wrapped store does (ErrStoreDown
// while the breaker is open).
func (g *guardedStore) Reset(ctx context.Context, keys []string) (int, error) {
	rs, ok := g.GuardedStore.(limit.Resetter)
	if !ok {
		return 0, ErrNoReset
	}
	start, err := g.enter(ctx)
	if err != nil {
		return 0, err
	}
	n, err := rs.Reset(ctx, keys)
	if !errors.Is(err, limit.ErrNotCounter) { // refused before any I/O
		g.observe(ctx, start, err)
	}
	return n, err
}

// ErrNoHeldCounters means a limit store cannot list the counters it holds
// (it is not a limit.CounterLister): the admin API then knows the counters
// the config names only.
var ErrNoHeldCounters = errors.New("enforce: the limit store cannot list its counters")

// HeldCounters implements limit.CounterLister when the wrapped store does
// (ErrNoHeldCounters otherwise, ErrStoreDown while the breaker is open).
func (g *guardedStore) HeldCounters(ctx context.Context, prefix string) ([]string, error) {
	ls, ok := g.GuardedStore.(limit.CounterLister)
	if !ok {
		return nil, ErrNoHeldCounters
	}
	if g.down() {
		return nil, ErrStoreDown
	}
	// Not observed by the breaker: a listing scans whole masters under a
	// share of the admin API's deadline, and its failures say little of
	// the hot path's health.
	return ls.HeldCounters(ctx, prefix)
}
