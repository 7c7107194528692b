package federate

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/internal/redact"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// call is one request on its way to an upstream: the breaker's admission,
// the idle timeout, the session, and the outcome reported back.
type call struct {
	f     *Federator
	up    *upstream
	ss    *mcp.ServerSession
	cs    *mcp.ClientSession
	slot  *sessionSlot // of cs, a client's own session; nil for a shared one
	probe bool
	idle  *idleTimer
	heard uint64 // the upstream's heardCount when the call was sent (see upstream.alive)
	// parent is the client's request context. The call's notifications
	// arrive on other goroutines (the upstream session's handlers) and
	// must be sent on the client's request stream, which the go-sdk picks
	// by this context: that is why a call keeps it.
	parent context.Context
	status atomic.Int32 // the HTTP status of the call's POST (HTTP upstreams)
	posted atomic.Bool  // a notification of the call was queued for ss (see flush)
	// stopOnClose undoes the call's cancellation by Federator.Close.
	stopOnClose func() bool
}

// errClosing is the cause of the calls Federator.Close ends.
var errClosing = errors.New("federate: closing")

// begin admits a call to up and opens (or finds) its session. It returns
// the call's context (ctx with the idle timeout and the HTTP status
// recorder: send the request with it, and give it to end). A call that is
// not sent gets a refusal.
func (f *Federator) begin(ctx context.Context, up *upstream, ss *mcp.ServerSession, stateless bool, timeout time.Duration) (context.Context, *call, *refusal) {
	caller := up.callerOf(ctx)
	probe, r := up.admit(time.Now(), caller)
	if r != nil {
		f.outcome(up, OutcomeRefused)
		return nil, nil, r
	}
	c := &call{f: f, up: up, ss: ss, probe: probe, parent: ctx}
	cctx, idle := withIdle(context.WithValue(ctx, statusKey{}, &c.status), timeout)
	c.idle = idle
	// Close ends the calls in flight (a call reporting progress would
	// otherwise hold it without bound).
	c.stopOnClose = context.AfterFunc(f.ctx, func() { c.idle.cancel(errClosing) })
	cs, slot, err := f.session(cctx, up, ss, stateless)
	if err != nil {
		c.stopOnClose()
		c.idle.stop()
		if ctx.Err() != nil || f.ctx.Err() != nil || errors.Is(err, errSessionEnded) {
			up.report(probe, abandoned)
			f.outcome(up, OutcomeCancelled)
			return nil, nil, &refusal{reason: "the client went away"}
		}
		up.report(probe, failed)
		f.outcome(up, OutcomeRefused)
		err = redact.URLError(err) // its text reaches the log and the client: the URL may hold a key
		f.log.Warn("federate: cannot open an upstream session", "upstream", up.cfg.Name, "err", err)
		return nil, nil, up.failure(caller, fmt.Sprintf("it cannot be reached: %v", err))
	}
	c.cs, c.slot, c.heard = cs, slot, up.heardCount()
	if !usesShared(up, ss, stateless) {
		// Only a client's own session asks for its newest call (a shared
		// session's messages go to no client: newClient's target).
		f.inflight.add(c)
	}
	return cctx, c, nil
}

// verdict is how a call ended, for the client: nothing (a result), err (a
// JSON-RPC error: the upstream's own, or one saying what went wrong after
// the request was sent), or a refusal (it was not served: a tool error
// with the retry time); retry means the upstream had lost the session, a
// new one is open, and the request may be sent again.
type verdict struct {
	err     error
	refusal *refusal
	retry   bool
	outcome Outcome // for Options.OnCall
}

// end reports how the call went to the breaker and to Options.OnCall, and
// tells the client's answer. It first lets the notifications the upstream
// sent before its answer reach the client (see wireCount and flush).
func (c *call) end(ctx context.Context, err error) verdict {
	defer c.stopOnClose()
	v := c.verdict(ctx, err)
	c.f.outcome(c.up, v.outcome)
	return v
}

// verdict classifies how the call ended; see end. ctx is the call's.
func (c *call) verdict(ctx context.Context, err error) verdict {
	c.f.wires.drain(c.cs)
	if c.posted.Load() {
		c.f.flush(c.parent, c.ss)
	}
	defer c.idle.stop()
	c.f.inflight.remove(c)
	status := int(c.status.Load())
	var je *jsonrpc.Error
	switch {
	case err == nil:
		c.up.report(c.probe, answered)
		return verdict{outcome: OutcomeOK}
	case c.parent.Err() != nil:
		c.up.report(c.probe, abandoned)
		return verdict{err: c.parent.Err(), outcome: OutcomeCancelled}
	case errors.Is(context.Cause(ctx), errClosing):
		c.up.report(c.probe, abandoned)
		return verdict{err: c.up.rpcErr("was not waited for: the gateway is shutting down"), outcome: OutcomeCancelled}
	case errors.Is(context.Cause(ctx), errIdle):
		// A failure of the upstream only if it answered nothing else
		// since the call was sent and answers no ping now: an upstream
		// that answers is not down, the silence is this call's (see
		// upstream.alive).
		switch {
		case c.up.alive(c.parent, c.cs, c.heard, c.idle.d):
			c.up.report(c.probe, abandoned)
		case c.f.ctx.Err() != nil: // Close ended the ping
			c.up.report(c.probe, abandoned)
		default:
			c.up.report(c.probe, failed)
		}
		return verdict{err: c.up.rpcErr(fmt.Sprintf("timed out: it sent nothing for %v", c.idle.d)), outcome: OutcomeFailed}
	case status == http.StatusNotFound, status == 0 && sessionLost(err):
		// The upstream lost the session (it restarted, or expired it), or
		// the SDK client had ended it (after an earlier non-2xx answer, a
		// broken event stream): the request was not served. A new session,
		// and the request again; not a failure of the upstream. Checked
		// before the upstream's own JSON-RPC errors: a 404 may carry one.
		c.up.report(c.probe, abandoned)
		if c.up.cfg.stdio() {
			// A stdio session is its process: closed, the process has
			// exited and supervise is restarting it; sent again, the
			// request would only meet the same closed session.
			return verdict{refusal: &refusal{reason: reasonDown}, outcome: OutcomeRefused}
		}
		c.drop()
		return verdict{retry: true, err: c.up.rpcErr("lost the session"), outcome: OutcomeRetried}
	case errors.As(err, &je) && !transportCode(je.Code):
		// The upstream's JSON-RPC error (over a 2xx), or a 4xx's: a plain
		// one rewritten (see headerTransport.refusedAnswer), or one whose
		// body is a JSON-RPC error; a 4xx is no sign the upstream serves
		// (see throughMCP).
		if throughMCP(status) {
			c.up.report(c.probe, answered)
		} else {
			c.up.report(c.probe, refused)
		}
		return verdict{err: je, outcome: OutcomeError}
	case status == http.StatusTooManyRequests:
		// The SDK keeps the session (a transient status): so do we. A
		// proxy in front of a hung upstream may answer it: refused, not
		// answered (see throughMCP).
		c.up.report(c.probe, refused)
		return verdict{refusal: c.up.failure(c.up.callerOf(c.parent), "it answered 429"), outcome: OutcomeRefused}
	case status >= 400 && status < 500:
		// It answered: this request is refused, the upstream works (one
		// client's bad request must not open the breaker for all). A plain
		// 4xx to a request comes as its JSON-RPC error (refusedErr, see
		// headerTransport.refusedAnswer: the case above) and leaves the
		// session to the other calls; one that did not (the SDK ended the
		// session on it) has the next call open another, and the calls
		// that were in flight on it are sent again (the
		// ErrConnectionClosed case above).
		c.up.report(c.probe, refused)
		c.drop()
		return verdict{err: c.up.refusedErr(status), outcome: OutcomeError}
	case errors.As(err, &je) && je.Code == -32005 && status == 0:
		// Rejected by the transport before anything was sent (no
		// connection): not served, so a refusal, as when the breaker is open.
		c.up.report(c.probe, failed)
		c.drop()
		return verdict{refusal: c.up.failure(c.up.callerOf(c.parent), fmt.Sprintf("it cannot be reached: %v", redact.URLError(err))), outcome: OutcomeRefused}
	}
	c.up.report(c.probe, failed)
	if status < 500 { // a 5xx leaves the session alive in the SDK
		c.drop()
	}
	err = redact.URLError(err) // its text reaches the log and the client: the URL may hold a key
	c.f.log.Warn("federate: upstream call failed", "upstream", c.up.cfg.Name, "status", status, "err", err)
	return verdict{err: c.up.rpcErr(fmt.Sprintf("failed: %v", err)), outcome: OutcomeFailed}
}

// drop forgets the call's session, which failed, so that the next call
// opens another: in its own client's slot only (the other clients' slots
// of the upstream may be locked by a connection in progress, which must
// not hold up this client's answer), or as the shared session.
func (c *call) drop() {
	if c.slot != nil {
		c.slot.cs.CompareAndSwap(c.cs, nil)
	}
	c.up.drop(c.cs)
}

// rpcErr is the JSON-RPC error of a call that went wrong after it was
// sent, as the gateway answers for its single upstream (-32603).
func (up *upstream) rpcErr(what string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("upstream %q %s", up.cfg.Name, what)}
}

// refusedErr is the JSON-RPC error of a request the upstream refused
// with an HTTP 4xx status, naming it.
func (up *upstream) refusedErr(status int) *jsonrpc.Error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError,
		Message: fmt.Sprintf("upstream %q refused the request: HTTP %d %s", up.cfg.Name, status, http.StatusText(status))}
}

// transportCode reports whether a JSON-RPC error code is one the SDK's
// own transport makes (the request never reached the upstream, or the
// connection is closing) rather than an answer of the upstream.
func transportCode(code int64) bool {
	switch code {
	case -32005, -32004, -32003: // rejected by transport, server closing, client closing
		return true
	}
	return false
}

// failure is the refusal a call of the caller key (see callerKey) that
// was not served gets: a 429 seen on the way, for the whole upstream or
// for that caller, names its retry time.
func (up *upstream) failure(caller, reason string) *refusal {
	up.mu.Lock()
	defer up.mu.Unlock()
	if until := up.limitedUntilLocked(caller, time.Now()); !until.IsZero() {
		return &refusal{reason: reason429, retry: until}
	}
	return &refusal{reason: reason}
}

// statusKey is the context key of a call's HTTP status recorder.
type statusKey struct{}

// outcome tells Options.OnCall.
func (f *Federator) outcome(up *upstream, o Outcome) {
	if f.opts.OnCall != nil {
		f.opts.OnCall(up.cfg.Name, o)
	}
}
