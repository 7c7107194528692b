package gateway

import (
	"net"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// limitListener caps the client connections open at once. While max are
// open, Accept waits for one to close: further clients wait in the kernel's
// accept queue, where they cost the gateway no goroutine and no buffer (and
// past the queue's length the kernel refuses them). A connection gives its
// slot back when it is closed, once however often Close is called. The open
// count is kept in the gauge. It is safe for concurrent use.
type limitListener struct {
	net.Listener
	slots     chan struct{}
	open      prometheus.Gauge
	done      chan struct{} // closed by Close: ends an Accept waiting for a slot
	closeOnce sync.Once
}

func newLimitListener(ln net.Listener, max int, open prometheus.Gauge) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, max), open: open, done: make(chan struct{})}
}

// Accept waits for a free slot, then for a connection.
func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	l.open.Inc()
	return &limitConn{Conn: c, release: l.release}, nil
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
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
