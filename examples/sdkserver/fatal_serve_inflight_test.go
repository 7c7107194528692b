package main

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// failingListener's Accept fails, with an error net/http does not retry,
// once fail is called.
type failingListener struct {
	net.Listener
	fail chan struct{}
}

var errAcceptBroken = errors.New("accept: broken (test)")

func (l *failingListener) Accept() (net.Conn, error) {
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := l.Listener.Accept(); ch <- res{c, err} }()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-l.fail:
		return nil, errAcceptBroken
	}
}

// When the listener fails while a call is in flight, the engine's final
// flush still waits for the call to settle, as on the signal path: the
// store holds the cost the call reported (7), not its estimate (100).
// (Once, serve returned at once, with no srv.Shutdown and no
// settling.Wait, and run's deferred close flushed the estimate; the
// call's result then settled on a closed engine and was lost.)
func TestFatalServeErrorFlushesAfterCallsInFlightSettle(t *testing.T) {
	b := newBlockingLLM(t, "")
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &failingListener{Listener: inner, fail: make(chan struct{})}
	done, callDone := b.serveAndCall(t, context.Background(), ln, inner.Addr().String(), context.Background())
	<-b.started
	close(ln.fail)
	returned := false
	select {
	case err := <-done:
		returned = true
		t.Logf("serve returned (%v) with the call still in flight", err)
	case <-time.After(5 * time.Second):
	}
	close(b.release)
	<-callDone
	if !returned {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("serve did not return within 30s")
		}
	}
	rec := durableUsage(t, b.db)
	if rec.Used() != 7 {
		t.Fatalf("durable usage after a fatal serve error: used=%d; want 7, the cost the call reported (the engine was closed, and the estimate flushed, before the call settled)", rec.Used())
	}
}
