package main

import (
	"context"
	"net"
	"testing"
	"time"
)

// A server's shutdown ("calls in flight finish, then usage is flushed a last
// time") does not wait for a call whose client left while its own cached load
// still runs for the flight: the engine is closed (final flush, the estimate
// billed) before that call is settled on what its load reported. The gateway
// waits for such calls (gateway TestShutdownWaitsForLoadsWhoseCallersLeft).
func TestShutdownWaitsForLoadsWhoseCallersLeft(t *testing.T) {
	b := newBlockingLLM(t, "    cache: {ttl: 10m}\n")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	callCtx, cancel := context.WithCancel(context.Background())
	done, callDone := b.serveAndCall(t, ctx, ln, ln.Addr().String(), callCtx)
	<-b.started
	cancel() // the client leaves; its load runs on for the flight
	<-callDone
	time.Sleep(300 * time.Millisecond) // notifications/cancelled reaches the server
	stop()                             // SIGTERM
	go func() {
		time.Sleep(500 * time.Millisecond)
		close(b.release) // the load ends, reporting 7, well within the shutdown grace
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	<-b.ended
	time.Sleep(200 * time.Millisecond) // the call settles, if anything is left to settle with
	rec := durableUsage(t, b.db)
	if rec.Used() != 7 {
		t.Fatalf("durable usage after shutdown: used=%d calls=%d; want 7, the cost the call's own load reported (the engine was closed, and the estimate 100 flushed, before the call was settled)", rec.Used(), rec.NetCalls())
	}
}
