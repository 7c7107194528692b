package gateway

import (
	"context"
	"net"
	"net/http"
	"sync"
)

// pipeListener is a net.Listener whose connections are in-memory pipes
// (net.Pipe) made by its dial: the gateway reaches the federation without a
// socket, so no other process can, and no TCP hop is paid.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

// dial returns the client end of a new pipe whose server end Accept
// returns.
func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
	case <-ctx.Done():
	}
	client.Close()
	server.Close()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, net.ErrClosed
}

// transport returns an HTTP transport whose every connection is a pipe to
// l, whatever the URL's host.
func (l *pipeListener) transport() *http.Transport {
	return &http.Transport{DialContext: l.dial, MaxIdleConns: 256, MaxIdleConnsPerHost: 256, ForceAttemptHTTP2: false}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "federation" }
