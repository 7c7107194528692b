package enforce

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/mcpgate/mcpgate/internal/fanout"
	"github.com/mcpgate/mcpgate/limit"
)

// shutdownStep bounds each step of the shutdown's last placement, and how
// long the shutdown waits for an open store breaker to close.
const shutdownStep = 5 * time.Second

// shutdownRetries bounds the shutdown's placements tried again after a
// failure the store breaker did not cause, shutdownRetryPause apart.
const (
	shutdownRetries    = 8
	shutdownRetryPause = 100 * time.Millisecond
)

// shutdown is run's last step, once its context ended: one last try,
// bounded, so that a clean shutdown places what it can. finish stops the
// flusher and returns the error of its final flush.
//
// A store blip just before the shutdown leaves the store breaker open until
// its next probe, the store answering again: every write would be refused
// at once and the pending usage dropped as unmetered for nothing. So the
// shutdown waits for the breaker to close, and tries again what the breaker
// refused, for shutdownStep at most; a store still down then is given up
// on as before, the shutdown having waited that long. A placement that
// fails otherwise (a connection the store's restart broke) is tried again
// a few times (shutdownRetries); a failed final flush alone (the usage
// store down) is not waited for.
func (m *meterer) shutdown(ctx context.Context, finish func() error) {
	g := m.guard
	until := time.Now().Add(shutdownStep)
	if g != nil && m.hasWork() {
		g.awaitUp(until) // with nothing to write, a store still down costs no wait
	}
	// First what a store that lost its meters lost of this instance's.
	m.bounded(ctx, m.checkJournal)
	m.bounded(ctx, m.placePending) // a budget of its own: many journals must not use it up
	// From here on a call settled late writes its own usage (settleClosed):
	// what it records before this is tracked or pending, and so written
	// by the final flush and the placements below, or counted.
	m.closed.Store(true)
	err := finish()
	failedRetries := 0
	for retries := 0; g != nil; retries++ {
		refused := g.refused()
		// What the final flush found lost (its journal went pending), or
		// what the breaker refused: placed on the shared store, then
		// flushed (or else written by another instance's sweep).
		placed := m.pendingCount() > 0
		if placed {
			m.bounded(ctx, m.placePending)
		}
		if err != nil || placed {
			m.bounded(ctx, func(ctx context.Context) { err = m.flusher.Flush(ctx) })
		}
		if err == nil && m.pendingCount() == 0 {
			if retries > 0 {
				m.log.Info("usage placed and flushed once the limit store's breaker closed again", "retries", retries)
			}
			break
		}
		if g.refused() == refused && g.Available() {
			// Not the breaker's doing. A store that restarted just before
			// leaves each connection of the client broken until its next
			// use (an EOF, and the connection is dialled again): retried
			// a few times, the usage is placed. Placing again is safe (an
			// op applies once).
			if m.pendingCount() == 0 || failedRetries >= shutdownRetries || time.Now().After(until) {
				break
			}
			failedRetries++
			time.Sleep(shutdownRetryPause)
			continue
		}
		if !g.awaitUp(until) {
			break // no time left
		}
	}
	if err != nil {
		m.finalFlushFailed(err)
	}
	if n, calls, sent := m.dropPending(); n > 0 {
		m.stats.UsagePending.Set(0)
		m.stats.Unmetered.Add(float64(calls))
		m.log.Error("usage could not be recorded before shutdown: lost with this process; its calls are counted in mcpgate_unmetered_calls_total",
			"meters", n, "calls", calls, "calls_maybe_recorded", sent)
	}
}

// hasWork reports whether the shutdown has anything to write: usage
// pending, journaled or tracked for the final flush.
func (m *meterer) hasWork() bool {
	m.mu.Lock()
	held := len(m.journal) > 0 || len(m.pending) > 0
	m.mu.Unlock()
	return held || m.flusher.Pending() > 0
}

// dropPending drops the pending usage of n meters and returns how many
// calls it held, and how many of them are in ops that were sent with no
// answer: those may have landed on the shared store (where a sweep bills
// them), and are counted as lost all the same since nothing can tell.
// Dropped, they are not counted again by a call settled meanwhile
// (settleClosed), which accounts for what it takes itself.
func (m *meterer) dropPending() (n int, calls, sent int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	defer clear(m.pending)
	n = len(m.pending)
	for _, p := range m.pending {
		calls += p.delta.Calls
		for _, op := range p.ops {
			calls += op.delta.Calls
			if !op.sent.IsZero() {
				sent += op.delta.Calls
			}
		}
	}
	return n, calls, sent
}

// finalFlushFailed reports a final flush that failed. The shared store
// keeps the live counters for another instance's sweep; the in-process
// store's end with the process: their unflushed calls are counted in
// mcpgate_unmetered_calls_total, as lost.
func (m *meterer) finalFlushFailed(err error) {
	if m.guard != nil {
		m.log.Error("final usage flush failed: the shared store's live counters keep the totals for another instance's sweep", "err", err)
		return
	}
	var meters int
	var calls int64
	// The in-process store does no I/O: the scan cannot fail on its own.
	serr := m.store.ScanMeters(context.Background(), func(st limit.MeterState) error {
		meters++
		calls += max(st.Live.Calls-st.Flushed.Calls, 0)
		return nil
	})
	m.stats.Unmetered.Add(float64(calls))
	m.log.Error("final usage flush failed: the in-process counters' unflushed usage is lost with this process; its calls are counted in mcpgate_unmetered_calls_total",
		"err", errors.Join(err, serr), "meters", meters, "calls", calls)
}

// bounded runs step with a context of its own, shutdownStep long, that
// ctx's cancellation does not end.
func (m *meterer) bounded(ctx context.Context, step func(context.Context)) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownStep)
	defer cancel()
	step(sctx)
}

// checkJournal reads every meter the journal has entries for and reports
// it as a flush would: a meter the store lost since the last flush has its
// entries placed again before the final flush. The reads run a few at a
// time: the journal holds every tenant charged since the last flush.
func (m *meterer) checkJournal(ctx context.Context) {
	m.mu.Lock()
	keys := slices.Collect(maps.Keys(m.journal))
	m.mu.Unlock()
	fanout.Do(len(keys), 16, func(i int) {
		if st, ok, err := m.store.ReadMeter(ctx, keys[i]); err == nil {
			m.observe(keys[i], ok, st.Gen, st.Flushed)
		}
	})
}
