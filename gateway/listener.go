package gateway

import (
	"container/list"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// limitListener caps the client connections open at once. While max are
// open, Accept waits for one to close: further clients wait in the kernel's
// accept queue, where they cost the gateway no goroutine and no buffer (and
// past the queue's length the kernel refuses them); the one client Accept
// took meanwhile waits with it. A connection gives its slot back when it is
// closed, once however often Close is called. The open count is kept in the
// gauge. It is safe for concurrent use.
//
// A keep-alive connection between two requests holds a slot while it
// serves no one: at the cap, Accept closes this listener's connection idle
// longest (known when its server's ConnState is trackIdle), so that idle
// connections, a hostile client's or many clients', cannot keep others out
// for idle_timeout.
type limitListener struct {
	net.Listener
	slots     chan struct{}
	open      prometheus.Gauge
	idle      idleConns
	done      chan struct{} // closed by Close: ends an Accept waiting for a slot
	closeOnce sync.Once
}

func newLimitListener(ln net.Listener, max int, open prometheus.Gauge) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, max), open: open, done: make(chan struct{})}
}

// Accept waits for a connection, then for a free slot (see waitSlot).
func (l *limitListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	select {
	case l.slots <- struct{}{}:
	default:
		if err := l.waitSlot(c); err != nil {
			return nil, err
		}
	}
	l.open.Inc()
	return &limitConn{Conn: c, release: l.release, idle: &l.idle}, nil
}

// idleRecheck is how often Accept, waiting at the cap, looks again for an
// idle connection to close: connections busy when the client came become
// idle long before idle_timeout closes them.
const idleRecheck = 50 * time.Millisecond

// waitSlot takes a slot for c at the cap: the slot of the connection idle
// longest, closed for it (its Close gives the slot back at once), or else
// the first slot given back.
func (l *limitListener) waitSlot(c net.Conn) error {
	tick := time.NewTicker(idleRecheck)
	defer tick.Stop()
	for {
		l.idle.closeOldest()
		select {
		case l.slots <- struct{}{}:
			return nil
		case <-l.done:
			_ = c.Close()
			return net.ErrClosed
		case <-tick.C:
		}
	}
}

func (l *limitListener) release() {
	l.open.Dec()
	<-l.slots
}

// Close closes the listener and ends an Accept waiting for a slot.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitConn gives its listener slot back on the first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
	idle    *idleConns    // its listener's
	at      *list.Element // its place in idle.order while idle; guarded by idle.mu
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// trackIdle is an http.Server.ConnState hook: it tells a limitListener's
// connections' state to that listener (others are not tracked).
func trackIdle(c net.Conn, st http.ConnState) {
	if lc, ok := c.(*limitConn); ok {
		lc.idle.track(lc, st)
	}
}

// idleConns tracks one listener's connections waiting for their next
// request, oldest first. Safe for concurrent use; the zero value is ready.
type idleConns struct {
	mu    sync.Mutex
	order list.List // of *limitConn, the longest idle at the front
}

// track records c's new state.
func (t *idleConns) track(c *limitConn, st http.ConnState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c.at != nil {
		t.order.Remove(c.at)
		c.at = nil
	}
	if st == http.StateIdle {
		c.at = t.order.PushBack(c)
	}
}

// closeOldest closes the connection idle longest, if any. A request that
// arrives on it at that moment fails as it would at idle_timeout; clients
// send again a request that met a keep-alive connection closing.
func (t *idleConns) closeOldest() {
	t.mu.Lock()
	var c *limitConn
	if e := t.order.Front(); e != nil {
		c = t.order.Remove(e).(*limitConn)
		c.at = nil
	}
	t.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// len is the number of connections tracked as idle.
func (t *idleConns) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.order.Len()
}
