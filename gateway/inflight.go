package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/mcp"
)

// cancelWait bounds how long a client's notifications/cancelled waits for
// the call it cancels to end (its slots released, its probe given back)
// before the notification goes on upstream.
const cancelWait = 3 * time.Second

// inflight registers the admitted tools/call requests being served, so that
// a client's notifications/cancelled ends its own call: the call gets no
// answer, its upstream request is cancelled, and it counts as no failure.
// Entries live exactly as long as their call: the registry holds no more
// than the calls in progress. Safe for concurrent use; the zero value is
// ready.
type inflight struct {
	mu    sync.Mutex
	calls map[callOwner][]*liveCall
}

// callOwner is whose calls an entry is: a notification cancels only calls
// of its own caller (tenant and subject) in its own session ("" without
// one), so that no one can cancel another's call by guessing its id.
type callOwner struct {
	tenant, subject, session string
}

func ownerOf(p auth.Principal, r *http.Request) callOwner {
	return callOwner{tenant: p.Tenant, subject: p.Subject, session: r.Header.Get(mcp.HeaderSessionID)}
}

// liveCall is one registered call.
type liveCall struct {
	id        json.RawMessage
	cancel    context.CancelCauseFunc
	done      chan struct{} // closed by release: the call's request has ended
	cancelled atomic.Bool   // a notifications/cancelled ended it
	// cached: the call is served through the cache, whose load goes on for
	// the other callers of its flight: a cancellation must not reach the
	// upstream, where it would end that load for all of them.
	cached atomic.Bool
	// outlives: the call's upstream request outlives its client (see
	// outlivesClient): a cancellation can reach it only through its client's
	// request, which it ends.
	outlives bool
	// cut: the gateway cut the call's upstream request before its answer
	// (cutUpstream): the upstream may still be running it.
	cut atomic.Bool
}

// ended reports whether the call's request has ended (release ran): a
// call still registered then is an orphan kept for its load.
func (c *liveCall) ended() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Cancelled reports whether a client's notifications/cancelled ended the
// call. A nil *liveCall is never cancelled.
func (c *liveCall) Cancelled() bool { return c != nil && c.cancelled.Load() }

// begin registers a call with id for o and returns its context, derived
// from ctx and cancelled with cause mcp.ErrCancelled when the client
// cancels the call. release must follow once the call's request has
// ended, and remove once its work is all done.
func (f *inflight) begin(ctx context.Context, o callOwner, id json.RawMessage, outlives bool) (context.Context, *liveCall) {
	ctx, cancel := context.WithCancelCause(ctx)
	c := &liveCall{id: id, cancel: cancel, done: make(chan struct{}), outlives: outlives}
	f.mu.Lock()
	if f.calls == nil {
		f.calls = make(map[callOwner][]*liveCall)
	}
	f.calls[o] = append(f.calls[o], c)
	f.mu.Unlock()
	return ctx, c
}

// release wakes a cancellation waiting for c: its request has ended. Call
// it once per call.
func (f *inflight) release(c *liveCall) {
	c.cancel(nil)
	close(c.done)
}

// remove forgets c: from then on a cancellation naming its id is not its.
func (f *inflight) remove(o callOwner, c *liveCall) {
	f.mu.Lock()
	list := f.calls[o]
	for i, x := range list {
		if x == c {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(f.calls, o)
	} else {
		f.calls[o] = list
	}
	f.mu.Unlock()
}

// cancel ends o's call with id, when exactly one matches (a client that
// reuses an id in flight gets neither cancelled), and waits until it ended
// or ctx is done. It returns the call, nil when none matched, and whether
// this was the call's first cancellation (a repeat waits for nothing).
func (f *inflight) cancel(ctx context.Context, o callOwner, id json.RawMessage) (c *liveCall, first bool) {
	f.mu.Lock()
	var match, orphan *liveCall
	n := 0
	for _, c := range f.calls[o] {
		if mcp.SameID(c.id, id) {
			if c.ended() {
				orphan = c // a live call with this id comes first
				continue
			}
			match, n = c, n+1
		}
	}
	if n == 0 && orphan != nil {
		match, n = orphan, 1
	}
	if n == 1 {
		first = !match.cancelled.Swap(true) // under mu: before end can run
	} else {
		match = nil
	}
	f.mu.Unlock()
	if match == nil || !first {
		return match, first
	}
	match.cancel(mcp.ErrCancelled)
	if match.outlives && !match.cached.Load() {
		return match, true // it ends when its upstream answers: nothing to wait for
	}
	select {
	case <-match.done:
	case <-ctx.Done():
	}
	return match, true
}

// size is the number of calls registered.
func (f *inflight) size() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, l := range f.calls {
		n += len(l)
	}
	return n
}

// serveCancellation ends the caller's call a notifications/cancelled
// names. Two things are decided apart. Whether it counts: not the first
// cancellation of a call of the caller's, which stops work; any other
// (a repeat, or one naming no call of the caller's) is governed like any
// notification. Whether it goes upstream: not for a cached call (its
// request belongs to the cache's flight, which goes on for its other
// callers) nor for one without a session (beyond the reach of a
// cancellation, see outlivesClient); those are answered 202 here.
func (g *Gateway) serveCancellation(x *exchange) {
	c, first := g.cancelCall(x.r, x.p, x.msg)
	class := methodClass(x.msg)
	if c == nil || !first {
		if _, ok := g.admitMethod(x, class); !ok {
			return
		}
	}
	if c != nil && (c.cached.Load() || c.outlives) {
		x.w.WriteHeader(http.StatusAccepted)
		return
	}
	g.forward(x.w, x.r, x.rt, x.fwd, class)
}

// cancelCall handles a client's notifications/cancelled before it is
// forwarded: the caller's call with that id in that session ends now. It
// returns that call, or nil when the caller has none with that id, and
// whether this was its first cancellation. A cancelled cached call's
// notification must not go upstream: the upstream request belongs to the
// cache's flight, which goes on for its other callers.
func (g *Gateway) cancelCall(r *http.Request, p auth.Principal, msg *mcp.Message) (c *liveCall, first bool) {
	if len(msg.CancelID) == 0 {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), cancelWait)
	defer cancel()
	return g.inflight.cancel(ctx, ownerOf(p, r), msg.CancelID)
}
