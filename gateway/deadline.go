package gateway

import (
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/mcpgate/mcpgate/mcp"
)

// protect bounds what one client can hold on the MCP endpoint, before
// anything else runs: every write to the client gets server.write_timeout
// (deadlineWriter), a POST's body must arrive within server.read_timeout
// (readBody lifts that deadline once it holds the body), and a request from
// a foreign Origin is refused with 403 (checkOrigin) before it is
// authenticated or forwarded. The settings are those of the config in force.
//
// A POST answered before its body was read (a 401, 403, 404 or 429 sent
// early) has the rest of its body read within drainGrace (drainUnread):
// net/http would read it (up to 256 KiB, to reuse the connection) before
// writing the answer, under server.read_timeout, and a client trickling
// the body in would hold the connection for all of it, uncounted by any
// tenant's cap. A body that does not arrive within drainGrace leaves the
// deadline in place: net/http's own read of the rest fails by it, the
// answer goes out and the connection closes.
func (g *Gateway) protect(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := g.rt.Load().cfg.Server
		dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: s.WriteTimeout}
		if r.Method == http.MethodPost && s.ReadTimeout > 0 {
			dw.readBy = time.Now().Add(s.ReadTimeout)
			_ = dw.rc.SetReadDeadline(dw.readBy)
		}
		defer drainUnread(dw, r)
		if err := checkOrigin(r, s.AllowedOrigins); err != nil {
			g.refuseOrigin(dw, r, err)
			return
		}
		next(dw, r)
		// net/http flushes what is still buffered after the handler
		// returns: that write gets its own deadline as well.
		dw.arm()
	}
}

// drainGrace is how long a POST answered before its body was read has to
// send the rest of it (see protect): what a client that sent its whole
// request needs, far less than a trickling one would take.
const drainGrace = 100 * time.Millisecond

// maxDrain is how much of an unread body drainUnread reads: net/http's own
// bound (it closes the connection rather than read more).
const maxDrain = 256 << 10

// drainUnread reads what is left of an early-answered POST's body within
// drainGrace (see protect). Drained, the connection stays open for the
// client's next request and its read deadline is lifted (net/http watches
// the idle connection with a read of its own from then on, which a passed
// deadline would fail, cancelling the next request); otherwise (the body
// is late, or over maxDrain) the deadline stays, net/http's own read of the
// rest ends by it at the latest, and the connection closes unless that read
// reached the body's end. A request without a body has nothing
// to drain (and net/http's read already watches its connection).
func drainUnread(dw *deadlineWriter, r *http.Request) {
	if dw.readBy.IsZero() || dw.bodyIn || r.Body == nil || r.Body == http.NoBody {
		return
	}
	_ = dw.rc.SetReadDeadline(time.Now().Add(drainGrace))
	if _, err := io.CopyN(io.Discard, r.Body, maxDrain+1); errors.Is(err, io.EOF) {
		_ = dw.rc.SetReadDeadline(time.Time{})
	}
}

// readBody reads a POST body (see mcp.ReadBody) under the read deadline
// protect armed, then lifts that deadline: once the body is in, net/http's
// background read watches the connection for the client going away, and a
// deadline expiring there would cancel the request, ending a long call or
// its stream. A body that did not arrive in time is a 408; the deadline
// stays on any failure, so that net/http's drain of the rest stays bounded.
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, *mcp.Error) {
	body, perr := mcp.ReadBody(r, max)
	dw := findDeadlineWriter(w)
	if perr != nil {
		if dw != nil && !dw.readBy.IsZero() && !time.Now().Before(dw.readBy) {
			w.Header().Set("Connection", "close")
			return nil, &mcp.Error{HTTPStatus: http.StatusRequestTimeout, Code: mcp.CodeInvalidRequest,
				Message: "request body not received within server.read_timeout"}
		}
		return nil, perr
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	if dw != nil {
		dw.bodyIn = true
	}
	return body, nil
}

// findDeadlineWriter returns the deadlineWriter protect put under w, through
// the writers later stages wrap it in (a session's, the event-id rewriter),
// or nil when there is none.
func findDeadlineWriter(w http.ResponseWriter) *deadlineWriter {
	for {
		switch x := w.(type) {
		case *deadlineWriter:
			return x
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return nil
		}
	}
}

// deadlineWriter gives each write to the client a deadline of its own:
// Write and Flush first move the connection's write deadline to now +
// timeout. A stream that keeps sending lives as long as it keeps moving (a
// deadline that passes between two writes does nothing, no write is
// waiting), while a write the client does not take within timeout fails,
// which ends the request and closes its connection. A zero timeout sets no
// deadline. Unwrap lets http.NewResponseController reach the server's
// writer (deadlines, flushing) through it. Like any ResponseWriter it is
// used by one goroutine at a time.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController // of the wrapped writer
	timeout time.Duration
	readBy  time.Time // the body's read deadline; zero: none
	bodyIn  bool      // readBody read the whole body
}

func (d *deadlineWriter) arm() {
	if d.timeout > 0 {
		_ = d.rc.SetWriteDeadline(time.Now().Add(d.timeout))
	}
}

// Write writes p under a fresh write deadline.
func (d *deadlineWriter) Write(p []byte) (int, error) {
	d.arm()
	return d.ResponseWriter.Write(p)
}

// Flush implements http.Flusher (errors are dropped; see FlushError).
func (d *deadlineWriter) Flush() { _ = d.FlushError() }

// FlushError sends what is buffered under a fresh write deadline; it is
// what http.ResponseController.Flush calls.
func (d *deadlineWriter) FlushError() error {
	d.arm()
	return d.rc.Flush()
}

// Unwrap returns the wrapped writer.
func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }
