package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/mcpgate/mcpgate/mcp"
)

// leaderWriter is the http.ResponseWriter a cache load relays the upstream's
// answer into. It always captures the status, headers and the call's
// JSON-RPC outcome. While its caller (the flight's leader: the caller whose
// load runs) is attached, a 2xx event stream is also relayed to that caller
// event by event: progress and server→client requests (sampling,
// elicitation) reach the client that can answer them. Any other answer
// reaches no one directly: the caller writes it with its own id, like the
// followers of the flight.
//
// The call's response event (and anything after it) is held back until the
// caller's flight has ended, its result stored: a client that had its
// answer before could otherwise send a write and then a read that joins
// this flight and gets the result from before the write.
//
// The load goes on for the flight when the caller leaves (it went away or
// cancelled): writes then only capture, and never fail, so the proxy keeps
// relaying into it. Safe for concurrent use by the load and the caller.
type leaderWriter struct {
	header http.Header // the load's own; copied to the caller's when streaming starts

	mu        sync.Mutex
	w         http.ResponseWriter // the caller's; nil once released or gone
	rc        *http.ResponseController
	status    int
	streaming bool // the answer is relayed to the caller
	result    json.RawMessage
	rpcErr    json.RawMessage
	reported  bool   // the load's relay.answered ran: the answer's event comes next
	held      []byte // the events from the response on, relayed by flushHeld

	done     chan struct{} // closed when the load's relay ended
	doneOnce sync.Once

	// running: the gateway cut the load's upstream request and nothing
	// could stop it there (stopUpstream); set before done is closed.
	running atomic.Bool
}

// newLeaderWriter relays to w; nil: a load with no caller, whose answer is
// only captured.
func newLeaderWriter(w http.ResponseWriter) *leaderWriter {
	return &leaderWriter{header: make(http.Header), w: w, rc: http.NewResponseController(w), done: make(chan struct{})}
}

func (l *leaderWriter) Header() http.Header { return l.header }

func (l *leaderWriter) WriteHeader(status int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writeHeaderLocked(status)
}

func (l *leaderWriter) writeHeaderLocked(status int) {
	if l.status != 0 {
		return
	}
	l.status = status
	if l.w == nil || status/100 != 2 || !mcp.IsEventStream(l.header.Get("Content-Type")) {
		return
	}
	h := l.w.Header()
	for k, v := range l.header {
		h[k] = v
	}
	// Sent before the outcome is known: it says miss even when the stream
	// ends in an error, which is not stored.
	h.Set("X-Mcp-Cache", "miss")
	l.w.WriteHeader(status)
	l.streaming = true
}

func (l *leaderWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writeHeaderLocked(http.StatusOK)
	if l.reported && l.streaming && l.w != nil {
		l.held = append(l.held, b...)
		return len(b), nil
	}
	if l.streaming && l.w != nil {
		if _, err := l.w.Write(b); err != nil {
			l.w = nil // the caller is gone; the flight is not
		}
	}
	return len(b), nil
}

// FlushError flushes to the caller while streaming (http.ResponseController
// finds it); it never fails, for the reason Write never does.
func (l *leaderWriter) FlushError() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.streaming && l.w != nil && !l.reported {
		if err := l.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			l.w = nil
		}
	}
	return nil
}

// report records the call's JSON-RPC outcome (the load's relay.answered).
func (l *leaderWriter) report(result, rpcErr json.RawMessage) {
	l.mu.Lock()
	l.result, l.rpcErr, l.reported = result, rpcErr, true
	l.mu.Unlock()
}

// flushHeld relays the held events to the caller, still attached.
func (l *leaderWriter) flushHeld() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.streaming || l.w == nil || len(l.held) == 0 {
		return
	}
	if _, err := l.w.Write(l.held); err == nil {
		_ = l.rc.Flush()
	}
	l.held = nil
}

// finish marks the load's relay as ended.
func (l *leaderWriter) finish() { l.doneOnce.Do(func() { close(l.done) }) }

// release gives the caller's writer back unless the answer is being
// streamed to it, and reports whether it is: then the caller must not write
// and should wait for done.
func (l *leaderWriter) release() (streaming bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.streaming {
		l.w = nil
	}
	return l.streaming
}

// detach stops all relaying to the caller: after it returns, the caller's
// writer is never touched again.
func (l *leaderWriter) detach() {
	l.mu.Lock()
	l.w = nil
	l.mu.Unlock()
}

// outcome is what the load relayed so far: its HTTP status and the call's
// result or error object.
func (l *leaderWriter) outcome() (status int, result, rpcErr json.RawMessage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.status, l.result, l.rpcErr
}
