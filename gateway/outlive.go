package gateway

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/mcpgate/mcpgate/mcp"
)

// outlivesClient reports whether a tools/call's upstream request must
// outlive its client: any without a session, whatever protocol it claims.
// Such a call cannot be stopped upstream once sent: a notifications/cancelled
// needs the call's session, and a closed request does not stop a tool that
// sends nothing (the Go SDK's stateless server runs it to its end, under
// MCP 2026-07-28 too unless StreamableHTTPOptions.PropagateRequestCancellation
// is set, which is off by default; and the version is only what the client
// claims). Were the call settled when its client went away or cancelled it,
// its concurrency slot would be free while the upstream still works: call,
// hang up, call again, and a limit of one runs many.
func outlivesClient(r *http.Request) bool {
	return r.Header.Get(mcp.HeaderSessionID) == ""
}

// errDrained ends the upstream request of a call whose client left more
// than its bound ago, or when the gateway shuts down (see detach). The
// upstream may still be running the call then (cutUpstream).
var errDrained = errors.New("gateway: the client of this call left and its upstream answer took too long")

// cutUpstream reports whether the gateway itself cut the upstream request
// r (forwarded, it returned err) before its answer: the idle timeout
// (upstream.timeout), upstream.max_duration, or the bound on a detached
// call's answer (errDrained). The upstream may still be running the call:
// it is to be cancelled in its session, and without one its slot must stay
// held (stopUpstream). A request that returned no error was answered in
// full (its response relayed; a stream left open and silent after it ends
// cleanly at the idle timeout): whatever bound fired afterwards, nothing of
// it still runs upstream.
func cutUpstream(r *http.Request, err error) bool {
	if err == nil {
		return false
	}
	return errors.Is(err, mcp.ErrUpstreamTimeout) || errors.Is(context.Cause(r.Context()), errDrained)
}

// forwardCall forwards call, a tools/call (not through the cache), and
// returns the HTTP status written to the client (see forwardHeld). A call
// whose upstream request the gateway cut is marked so (liveCall.cut).
func (g *Gateway) forwardCall(w http.ResponseWriter, r *http.Request, rt *runtime, fwd relay, call *liveCall) int {
	status, cut := g.forwardHeld(w, r, rt, fwd, "tools/call", call.outlives)
	if cut {
		call.cut.Store(true)
	}
	return status
}

// forwardHeld forwards a request whose ticket holds concurrency slots
// until it is settled (a tools/call, or another request under its
// method's rules), and returns the HTTP status written to the client and
// whether the gateway cut the upstream request (cutUpstream). A request
// that must outlive its client (outlives, see outlivesClient) is forwarded
// detached: it returns when the upstream has answered, with
// mcp.StatusClientClosedRequest when the client left before. Settle it
// after stopUpstream.
func (g *Gateway) forwardHeld(w http.ResponseWriter, r *http.Request, rt *runtime, fwd relay, class string, outlives bool) (status int, cut bool) {
	if !outlives {
		return g.forwardCut(w, r, rt, fwd, class)
	}
	if r.Context().Err() != nil {
		// Gone before anything was sent: nothing runs upstream to hold
		// the slot for.
		noteLeft(r.Context())
		writeNothing(w)
		return mcp.StatusClientClosedRequest, false
	}
	gw, dr := g.detach(w, r, rt.cfg.Upstream.Timeout)
	status, cut = g.forwardCut(gw, dr, rt, fwd, class)
	if gw.end() {
		status = mcp.StatusClientClosedRequest // not the upstream's failure
		noteLeft(r.Context())
	}
	return status, cut
}

// detach returns the writer and request to forward a call that must outlive
// its client with: the upstream request keeps going when the client hangs
// up, cancels the call or stops reading (a write fails), and what comes
// afterwards is read and dropped, so that the call is settled (its slot
// freed) only when the upstream has answered. From the moment the client
// left, the upstream has bound to answer (a silent tool is cut sooner by
// the proxy's idle timeout; a streaming one would otherwise be read for
// ever), and a shutdown ends the wait at once (nobody is waiting for the
// answer, and the shutdown would wait for it). Then the request is closed,
// and the call's slot stays held until its lease lapses (the upstream may
// still be running it: cutUpstream, stopUpstream).
// The writer's end must be called once the call has been forwarded.
func (g *Gateway) detach(w http.ResponseWriter, r *http.Request, bound time.Duration) (*goneWriter, *http.Request) {
	client := r.Context()
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(client))
	gw := &goneWriter{ResponseWriter: w, left: client.Done(), told: make(chan struct{}), cancel: cancel, bound: bound, streams: &g.streams}
	gw.stop = context.AfterFunc(client, func() {
		gw.why = leaving(client)
		close(gw.told)
		gw.leave()
	})
	return gw, r.WithContext(ctx)
}

// cancelledWhileDetached reports whether w is a detached call's writer
// whose client cancelled the call: its upstream answered all the same. It
// is asked before the writer's end (which could stop the leave callback
// that tells why the client left).
func cancelledWhileDetached(w http.ResponseWriter) bool {
	gw, ok := w.(*goneWriter)
	if !ok {
		return false
	}
	select {
	case <-gw.left:
		<-gw.told // the callback started when left closed, or end stopped it
		return gw.why == mcp.ErrCancelled
	default:
		return false
	}
}

// writeNothing answers a call whose client left before its answer started
// with 202 and no body (MCP: a cancelled request gets no response).
func writeNothing(w http.ResponseWriter) {
	h := w.Header()
	h.Del("Content-Type")
	h.Set("Content-Length", "0")
	w.WriteHeader(http.StatusAccepted)
}

// goneWriter relays to the client until it goes away or cancels the call
// (client ends) or a write to it fails, and then drops what is written.
// The headers written through it reach the client with the status only:
// once the client has left, they are dropped with the body (a
// Content-Length set for a body that never comes would make a client that
// still reads wait for it). Its writes come from one goroutine; leave may
// be called from any.
type goneWriter struct {
	http.ResponseWriter
	left    <-chan struct{}         // closed when the client left or cancelled the call (its request context's Done)
	told    chan struct{}           // closed once why is set, by the callback left starts
	why     error                   // leaving's answer: mcp.ErrCancelled or mcp.ErrClientGone
	cancel  context.CancelCauseFunc // ends the upstream request
	bound   time.Duration           // how long the upstream has once the client left
	streams *streamSet              // where the wait is ended on shutdown
	stop    func() bool             // unregisters leave from client

	once   sync.Once
	timer  *time.Timer // set under once
	remove func()      // set under once

	header  http.Header // what the upstream's answer sets
	gone    bool        // the client got its last byte; only the writing goroutine
	started bool        // a status went to the client
}

// leave starts the bound on the upstream's answer, once the client has
// left.
func (g *goneWriter) leave() { g.once.Do(g.arm) }

func (g *goneWriter) arm() {
	g.timer = time.AfterFunc(g.bound, func() { g.cancel(errDrained) })
	g.remove = g.streams.add(func() { g.cancel(errDrained) })
}

// end releases what detach started, after the call was forwarded. It
// reports whether the client left, and answers with 202 and no body one
// that left before its answer started.
func (g *goneWriter) end() (left bool) {
	if g.stop() {
		close(g.told) // the leave callback will not run: why stays nil
	}
	g.once.Do(func() {}) // after this, timer and remove are set for good
	if g.timer != nil {
		g.timer.Stop()
		g.remove()
	}
	g.cancel(nil)
	// A client that leaves once its whole answer was written has not
	// left the call: every write after its leaving finds it gone.
	left = g.gone || !g.started && g.clientLeft()
	if left && !g.started {
		writeNothing(g.ResponseWriter)
	}
	return left
}

// clientLeft reports whether the client has left or cancelled the call.
func (g *goneWriter) clientLeft() bool {
	select {
	case <-g.left:
		return true
	default:
		return false
	}
}

func (g *goneWriter) alive() bool {
	if !g.gone && g.clientLeft() {
		g.gone = true
	}
	return !g.gone
}

func (g *goneWriter) fail() {
	g.gone = true
	g.leave()
}

func (g *goneWriter) Header() http.Header {
	if g.header == nil {
		g.header = make(http.Header)
	}
	return g.header
}

// start sends the headers the answer set with its status.
func (g *goneWriter) start() {
	if g.started {
		return
	}
	g.started = true
	h := g.ResponseWriter.Header()
	for k, v := range g.header {
		h[k] = v
	}
}

func (g *goneWriter) WriteHeader(code int) {
	if g.alive() {
		g.start()
		g.ResponseWriter.WriteHeader(code)
	}
}

func (g *goneWriter) Write(b []byte) (int, error) {
	if g.alive() {
		g.start()
		if _, err := g.ResponseWriter.Write(b); err != nil {
			g.fail()
		}
	}
	return len(b), nil
}

// FlushError is what http.ResponseController's Flush calls.
func (g *goneWriter) FlushError() error {
	if g.alive() {
		g.start()
		if err := http.NewResponseController(g.ResponseWriter).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			g.fail()
		}
	}
	return nil
}

// Unwrap lets http.ResponseController reach the connection (write
// deadlines).
func (g *goneWriter) Unwrap() http.ResponseWriter { return g.ResponseWriter }
