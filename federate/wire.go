package federate

import (
	"bytes"
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// drainWait bounds how long a call's answer waits for the notifications
// read before it to be relayed.
const drainWait = time.Second

// wireCount keeps a call's progress and log notifications ahead of its
// answer. The SDK client hands a response to the waiting call at once but
// queues notifications for a handler goroutine, so a progress notification
// the upstream sent just before its answer could reach the client after it
// (and be dropped by a client that stopped listening for that token). The
// transport counts the progress and log notifications it reads (seen), the
// client's handlers count those they relayed (relayed), and a call's end
// waits until relayed has caught up with what was seen when it returned.
type wireCount struct {
	seen    atomic.Int64
	relayed atomic.Int64
}

// drain waits (at most drainWait) until every notification seen so far is
// relayed.
func (w *wireCount) drain() {
	target := w.seen.Load()
	if w.relayed.Load() >= target {
		return
	}
	deadline := time.Now().Add(drainWait)
	for w.relayed.Load() < target {
		if time.Now().After(deadline) {
			// Miscounted (a line that only looked like a notification):
			// catch up, so that the next calls do not wait for it too.
			for r := w.relayed.Load(); r < target && !w.relayed.CompareAndSwap(r, target); r = w.relayed.Load() {
			}
			return
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// wireTable maps each upstream session to its wireCount.
type wireTable struct{ m sync.Map } // *mcp.ClientSession → *wireCount

func (t *wireTable) set(cs *mcp.ClientSession, w *wireCount) { t.m.Store(cs, w) }
func (t *wireTable) forget(cs *mcp.ClientSession)            { t.m.Delete(cs) }

// track registers w as cs's count until cs ends.
func (f *Federator) track(cs *mcp.ClientSession, w *wireCount) {
	f.wires.set(cs, w)
	f.spawn(func() {
		_ = cs.Wait()
		f.wires.forget(cs)
	})
}

func (t *wireTable) drain(cs *mcp.ClientSession) {
	if w, ok := t.m.Load(cs); ok {
		w.(*wireCount).drain()
	}
}

// counted is a reader of an upstream's messages (an SSE body, a stdio
// process's stdout) that counts the progress and log notifications going
// through it, line by line. Only a line's first maxCounted bytes are looked
// at: the SDKs encode a message's method before its params, and a long
// progress or log message (a big log payload) must still be counted, or
// its relay would be counted against another's.
type counted struct {
	r    io.Reader
	w    *wireCount
	line []byte // the current line's first maxCounted bytes
}

const maxCounted = 8 << 10

var (
	progressMethod = []byte(`"notifications/progress"`)
	logMethod      = []byte(`"notifications/message"`)
)

func (c *counted) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.scan(p[:n])
	return n, err
}

func (c *counted) scan(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			c.add(b)
			return
		}
		c.add(b[:i])
		if bytes.Contains(c.line, progressMethod) || bytes.Contains(c.line, logMethod) {
			c.w.seen.Add(1)
		}
		c.line = c.line[:0]
		b = b[i+1:]
	}
}

func (c *counted) add(b []byte) {
	if room := maxCounted - len(c.line); room > 0 {
		c.line = append(c.line, b[:min(len(b), room)]...)
	}
}

// countedBody is an HTTP response body read through counted.
type countedBody struct {
	counted
	io.Closer
}

// countRelayed is the client middleware that counts the notifications the
// handlers relayed (after they did).
func countRelayed(w *wireCount) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			if method == "notifications/progress" || method == "notifications/message" {
				w.relayed.Add(1)
			}
			return res, err
		}
	}
}
