package gosdk_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/gosdk"
)

// callAndLeave calls tool (key "a") on cs and cancels the call once a
// slow handler of s started; it returns when the call has returned, the
// handler still running.
func callAndLeave(s *server, cs *mcp.ClientSession, tool string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := call(ctx, cs, tool, map[string]any{"key": "a"})
		done <- err
	}()
	<-s.started
	cancel()
	<-done
}

// a cached call whose caller cancels while its own load runs
// is settled at once: its concurrency slot is freed while the tool handler
// still runs for the cache flight (the loader's ctx is detached). The
// gateway holds the slot until the load ends (gateway/cache.go "orphan").
// So cancel-and-call-again runs any number of handlers at once under a
// concurrency limit of 1.
func TestCancelledCachedCallKeepsItsSlotUntilItsLoadEnds(t *testing.T) {
	s := newServer(t, false, `
tools:
  slow:
    cache: {ttl: 10m}
    limits:
      - {name: one_at_a_time, per: tenant_tool, algorithm: concurrency, limit: 1, period: 10m}
`, options{})
	release := make(chan struct{})
	defer close(release)
	s.setRelease(release)
	cs := s.connect(token(t, "orphan-co", "alice"))
	callAndLeave(s, cs, "slow")
	// The first handler still runs (it waits for release). Give the
	// server's notifications/cancelled time to arrive.
	time.Sleep(300 * time.Millisecond)
	running := make(chan error, 1)
	go func() {
		_, err := call(context.Background(), cs, "slow", map[string]any{"key": "b"})
		running <- err
	}()
	select {
	case <-s.started:
		t.Fatalf("a second slow handler started while the first (cancelled caller, load still running) holds the one_at_a_time slot: %d handlers running under limit 1", s.reached("slow"))
	case err := <-running:
		if d := denial(t, err); d.Rule != "one_at_a_time" {
			t.Fatalf("denial %+v", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no answer")
	}
}

// the same call's bill: the load ran for it and its result
// reports 7, but the call is settled on the estimate (100) as soon as the
// caller cancels, before the load ends. The gateway settles such a call
// when its load ends, on the load's result
// (gateway TestShutdownWaitsForLoadsWhoseCallersLeft).
func TestCancelledCachedCallIsBilledWhatItsLoadReported(t *testing.T) {
	s := newServer(t, false, `
tools:
  slowllm:
    cache: {ttl: 10m}
    cost: {estimate: 100, from_result: _meta.usage.tokens}
`, options{usage: true})
	release := make(chan struct{})
	s.setRelease(release)
	cs := s.connect(token(t, "bill-co", "alice"))
	callAndLeave(s, cs, "slowllm")
	time.Sleep(300 * time.Millisecond) // notifications/cancelled reaches the server
	close(release)                     // the load ends, its result reports 7
	// The load's result is now in the cache: a second call is a hit.
	if _, err := call(context.Background(), cs, "slowllm", map[string]any{"key": "a"}); err != nil {
		t.Fatal(err)
	}
	if n := s.reached("slowllm"); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if err := s.engine.Close(); err != nil {
		t.Fatal(err)
	}
	// call 1: the load ran for it, reported 7; call 2: a hit, the estimate 100.
	if rec := s.durable("bill-co"); rec.Used() != 107 || rec.NetCalls() != 2 {
		t.Fatalf("durable record used=%d calls=%d (%+v); want 107 (7 reported by the load the cancelled call ran + 100 for the hit)", rec.Used(), rec.NetCalls(), rec.Usage)
	}
}

// A cached tool's handler that does not return when its context ends (a
// busy computation, a call without ctx) keeps running after the cache
// abandons its load (load timeout + 1 s). The call is answered then, but
// settled only when the handler returns: its concurrency slot stays held,
// so a second call is refused under a concurrency limit of 1, as the same
// tool uncached holds its slot until its handler returns.
func TestCachedHandlerPastLoadTimeoutKeepsItsSlot(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var running, peak atomic.Int64
	started := make(chan struct{}, 8)
	s := newToolServer(t, `
upstream:
  url: http://127.0.0.1:1/unused
  timeout: 1s # the load deadline is then its floor, 10 s
tools:
  stuck:
    cache: {ttl: 10m}
    limits:
      - {name: one_at_a_time, per: tenant_tool, algorithm: concurrency, limit: 1, period: 10m}
`, func(srv *mcp.Server) {
		mcp.AddTool(srv, &mcp.Tool{Name: "stuck"}, func(_ context.Context, _ *mcp.CallToolRequest, in textIn) (*mcp.CallToolResult, any, error) {
			n := running.Add(1)
			defer running.Add(-1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			started <- struct{}{}
			<-release // ignores its context
			return text(in.Text), nil, nil
		})
	})
	cs := s.connect(t, token(t, "stuck-co", "alice"))
	ctx := context.Background()
	first := make(chan error, 1)
	go func() {
		_, err := call(ctx, cs, "stuck", map[string]any{"text": "a"})
		first <- err
	}()
	<-started
	err := <-first // the cache abandons the load (its deadline, never under 10 s, + 1 s); the handler still runs
	t.Logf("first call answered: %v (its handler is still running: %d)", err, running.Load())
	second := make(chan error, 1)
	go func() {
		_, err := call(ctx, cs, "stuck", map[string]any{"text": "b"})
		second <- err
	}()
	select {
	case <-started:
		t.Fatalf("a second handler started while the first still runs (running=%d, peak=%d) under a concurrency limit of 1: the first call's slot was freed when the cache abandoned its load", running.Load(), peak.Load())
	case err := <-second:
		if d := denial(t, err); d.Rule != "one_at_a_time" {
			t.Fatalf("denial %+v", d)
		}
	}
}

// Options.Settling counts a cached call whose caller left while its own
// load runs on until that load ends and the call is settled: a shutdown
// that waits for it before closing the engine bills the cost the load
// reported, not the estimate.
func TestSettlingWaitsForACallWhoseCallerLeft(t *testing.T) {
	var settling gosdk.Settling
	if err := settling.Wait(context.Background()); err != nil {
		t.Fatalf("Wait with nothing admitted: %v", err)
	}
	s := newServer(t, false, `
tools:
  slowllm:
    cache: {ttl: 10m}
    cost: {estimate: 100, from_result: _meta.usage.tokens}
`, options{usage: true, settling: &settling})
	release := make(chan struct{})
	s.setRelease(release)
	cs := s.connect(token(t, "settle-co", "alice"))
	callAndLeave(s, cs, "slowllm")
	// Whether or not the middleware has answered yet, the call is not
	// settled: its load's handler waits for release.
	gone, stop := context.WithCancel(context.Background())
	stop()
	if err := settling.Wait(gone); err == nil {
		t.Fatal("Wait returned nil while a call's handler still runs")
	}
	close(release)
	if err := settling.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.engine.Close(); err != nil {
		t.Fatal(err)
	}
	if rec := s.durable("settle-co"); rec.Used() != 7 || rec.NetCalls() != 1 {
		t.Fatalf("durable record used=%d calls=%d; want 7, the cost the call's own load reported", rec.Used(), rec.NetCalls())
	}
}
