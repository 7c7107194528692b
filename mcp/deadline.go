package mcp

import (
	"context"
	"io"
	"net/http"
	"time"
)

// deadlines derives the upstream request's context from r's: cancelled with
// r's (the client went away, or cancelled with ErrCancelled), after
// ProxyOptions.MaxDuration, and by the idle timer it returns (nil when there
// is no idle timeout). Notification streams get neither bound. stop releases
// both.
func (p *Proxy) deadlines(r *http.Request, f Forward) (ctx context.Context, idle *idleTimer, stop func()) {
	ctx, cancel := context.WithCancelCause(r.Context())
	if r.Method == http.MethodGet || methodOf(f.Msg) == MethodSubscriptionsListen {
		return ctx, nil, func() { cancel(nil) }
	}
	stopCap := func() bool { return false }
	if p.maxDur > 0 {
		t := time.AfterFunc(p.maxDur, func() { cancel(errMaxDuration) })
		stopCap = t.Stop
	}
	if p.timeout > 0 {
		idle = &idleTimer{d: p.timeout, t: time.AfterFunc(p.timeout, func() { cancel(ErrUpstreamTimeout) })}
	}
	return ctx, idle, func() {
		stopCap()
		idle.stop()
		cancel(nil)
	}
}

// idleTimer cancels an exchange that received nothing from the upstream for
// d. touch and reader are called from the goroutine relaying the answer; a
// nil *idleTimer is valid and does nothing.
type idleTimer struct {
	d time.Duration
	t *time.Timer
}

// touch starts the idle period again: something arrived. After the timer
// fired it reschedules a cancellation that is then a no-op (the context is
// already cancelled).
func (it *idleTimer) touch() {
	if it != nil {
		it.t.Reset(it.d)
	}
}

func (it *idleTimer) stop() {
	if it != nil {
		it.t.Stop()
	}
}

// reader returns r, touching the timer on every read that returns bytes.
func (it *idleTimer) reader(r io.Reader) io.Reader {
	if it == nil {
		return r
	}
	return &touchReader{r: r, idle: it}
}

type touchReader struct {
	r    io.Reader
	idle *idleTimer
}

func (t *touchReader) Read(b []byte) (int, error) {
	n, err := t.r.Read(b)
	if n > 0 {
		t.idle.touch()
	}
	return n, err
}
