package gateway

// Resources one caller can take from the HTTP server: the real server
// (HTTPServer over Listener, as cli/serve.go runs it) with short server.*
// timeouts, in front of a real go-sdk upstream.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	goruntime "runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// liveness bounds waits for something that must happen eventually; it is
// not a timing bound (the timeouts under test are 1-2s).
const liveness = 60 * time.Second

// serveReal serves gateway instance 0 of e as cli/serve.go does and returns
// its address.
func serveReal(t *testing.T, e *env) string {
	addr, _ := serveRealListener(t, e)
	return addr
}

// serveRealListener is serveReal also returning the gateway's listener.
func serveRealListener(t *testing.T, e *env) (string, *limitListener) {
	t.Helper()
	g := e.gws[0]
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := g.HTTPServer(log.New(io.Discard, "", 0))
	lln := g.Listener(ln).(*limitListener)
	go func() { _ = srv.Serve(lln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String(), lln
}

// gaugeValue reads a gauge's current value.
func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// rawConn is a client connection driven by hand.
type rawConn struct {
	net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &rawConn{Conn: c, br: bufio.NewReader(c)}
}

// healthz makes one keep-alive request; the connection then stays idle.
func (c *rawConn) healthz(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(liveness))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %d", resp.StatusCode)
	}
}

// waitEOF reads until the server closes the connection.
func (c *rawConn) waitEOF(t *testing.T, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(liveness))
	if _, err := io.Copy(io.Discard, c.br); err != nil {
		t.Fatalf("%s: connection not closed by the server: %v", what, err)
	}
}

// inReadBody counts goroutines inside mcp.ReadBody.
func inReadBody(buf []byte) int {
	n := goruntime.Stack(buf, true)
	return bytes.Count(buf[:n], []byte("mcp.ReadBody("))
}

// heapSampler records the peak HeapInuse (and how many bodies were being
// read at once) from start until finish. Its buffer is allocated by
// newHeapSampler, before the baseline is measured.
type heapSampler struct {
	buf          []byte
	stop         chan struct{}
	done         chan struct{}
	peak         uint64
	peakReadBody int
	peakG        int
	samples      int
}

func newHeapSampler() *heapSampler {
	return &heapSampler{buf: make([]byte, 4<<20), stop: make(chan struct{}), done: make(chan struct{})}
}

func (s *heapSampler) start() {
	go func() {
		defer close(s.done)
		for {
			var ms goruntime.MemStats
			goruntime.ReadMemStats(&ms)
			s.peak = max(s.peak, ms.HeapInuse)
			s.peakReadBody = max(s.peakReadBody, inReadBody(s.buf))
			s.peakG = max(s.peakG, goruntime.NumGoroutine())
			s.samples++
			select {
			case <-s.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
}

func (s *heapSampler) finish() { close(s.stop); <-s.done }

func heapInuse() uint64 {
	goruntime.GC()
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// A body declared and never sent holds no connection, on any route (no
// token needed): a request that is not a POST to the MCP endpoint must
// send it within server.read_timeout, and the server closes the connection
// once that has passed. Without this, net/http waited
// for the declared bytes after the handler answered, for ever, and
// max_connections such connections kept every client out.
func TestDeclaredBodyNeverSent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: "server: {read_timeout: 1s, idle_timeout: 1m}\n"})
	addr := serveReal(t, e)
	for _, tc := range []struct{ req string }{{"GET /mcp"}, {"DELETE /mcp"}, {"GET /healthz"}, {"POST /admin/reload"}} {
		c := dialRaw(t, addr)
		if _, err := io.WriteString(c, tc.req+" HTTP/1.1\r\nHost: gw\r\nContent-Length: 1000\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(liveness))
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			t.Fatalf("%s: no answer: %v", tc.req, err)
		}
		resp.Body.Close()
		c.waitEOF(t, tc.req+" with a body never sent")
	}
}

// 200 idle keep-alive connections and 60 that declare a 4 MiB body, send
// one byte and stall: the server closes every one, its goroutines return,
// the heap does not grow by the declared bodies, nothing reaches the
// upstream.
func TestStalledAndIdleConnectionsAreClosed(t *testing.T) {
	const idle, stalled, declared = 200, 60, 4 << 20
	e := newEnv(t, setup{
		Upstream: upstream.Options{Stateless: true, JSONResponse: true},
		Config:   "server: {read_timeout: 1s, idle_timeout: 2s}\n",
	})
	addr := serveReal(t, e)
	tok := token(t, "acme", "alice")
	sampler := newHeapSampler()
	baseG, baseHeap := goruntime.NumGoroutine(), heapInuse()

	conns := make([]*rawConn, 0, idle+stalled)
	for range idle {
		c := dialRaw(t, addr)
		c.healthz(t)
		conns = append(conns, c)
	}
	sampler.start()
	head := fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"Accept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n{", tok, declared)
	for range stalled {
		c := dialRaw(t, addr)
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	duringG := goruntime.NumGoroutine()
	for i, c := range conns[idle:] {
		_ = c.SetReadDeadline(time.Now().Add(liveness))
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			t.Fatalf("stalled connection %d: no answer: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("stalled connection %d: status %d, want 408", i, resp.StatusCode)
		}
		c.waitEOF(t, fmt.Sprintf("stalled connection %d", i))
	}
	sampler.finish()
	for i, c := range conns[:idle] {
		c.waitEOF(t, fmt.Sprintf("idle connection %d", i))
	}
	for _, c := range conns {
		_ = c.Close()
	}
	var afterG int
	eventually(t, liveness, "goroutines back near the baseline", func() bool {
		afterG = goruntime.NumGoroutine()
		return afterG <= baseG+5
	})
	delta := int64(sampler.peak) - int64(baseHeap)
	t.Logf("goroutines: before %d, during %d after the last connection opened (peak %d; %d connections), after %d",
		baseG, duringG, sampler.peakG, idle+stalled, afterG)
	t.Logf("heap in use: baseline %d KiB, peak %d KiB while %d bodies of %d bytes were declared (delta %d KiB; at most %d bodies in mcp.ReadBody at once, %d samples)",
		baseHeap>>10, sampler.peak>>10, stalled, declared, delta>>10, sampler.peakReadBody, sampler.samples)
	if n := len(e.requests()); n != 0 {
		t.Fatalf("%d requests reached the upstream", n)
	}
	// Far below stalled × declared (240 MiB): the buffer must follow the
	// bytes that arrived, not the Content-Length a client announced.
	if limit := int64(stalled * declared / 8); delta > limit {
		t.Fatalf("heap grew by %d KiB while the stalled bodies were open (limit %d KiB): mcp.ReadBody sizes its buffer from Content-Length", delta>>10, limit>>10)
	}
}

// addStreamingTools registers, on the upstream's SDK server, "ticker" (one
// progress event per interval, n times, then a result) and "flood" (64 KiB
// progress events until the call ends; ended is closed then).
func addStreamingTools(e *env, ended chan<- struct{}) {
	type tickIn struct {
		N  int `json:"n"`
		MS int `json:"ms"`
	}
	s := e.up.MCPServer()
	sdk.AddTool(s, &sdk.Tool{Name: "ticker"}, func(ctx context.Context, req *sdk.CallToolRequest, in tickIn) (*sdk.CallToolResult, any, error) {
		for i := range in.N {
			select {
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			case <-time.After(time.Duration(in.MS) * time.Millisecond):
			}
			if err := req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{
				ProgressToken: req.Params.GetProgressToken(), Progress: float64(i + 1), Total: float64(in.N),
			}); err != nil {
				return nil, nil, err
			}
		}
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "ticked"}}}, nil, nil
	})
	big := strings.Repeat("x", 64<<10)
	var once sync.Once
	sdk.AddTool(s, &sdk.Tool{Name: "flood"}, func(ctx context.Context, req *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, any, error) {
		defer once.Do(func() { close(ended) })
		for i := 0; ctx.Err() == nil; i++ {
			if err := req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{
				ProgressToken: req.Params.GetProgressToken(), Progress: float64(i), Message: big,
			}); err != nil {
				return nil, nil, err
			}
		}
		return nil, nil, ctx.Err()
	})
}

// A stream that keeps sending lives past write_timeout: the deadline is
// per write, not per response (a global http.Server.WriteTimeout would cut
// it after 1s).
func TestLongStreamOutlivesWriteTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: "server: {write_timeout: 1s, read_timeout: 1s}\n"})
	addStreamingTools(e, make(chan struct{}))
	addr := serveReal(t, e)
	var events atomic.Int64
	client := sdk.NewClient(&sdk.Implementation{Name: "resources-test", Version: "1"}, &sdk.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *sdk.ProgressNotificationClientRequest) { events.Add(1) },
	})
	ctx, cancel := context.WithTimeout(context.Background(), liveness)
	defer cancel()
	cs, err := client.Connect(ctx, transport("http://"+addr+"/mcp", bearer{token: token(t, "acme", "alice")}), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	const n, every = 15, 200 // 3s of events, three times write_timeout
	start := time.Now()
	p := &sdk.CallToolParams{Name: "ticker", Arguments: map[string]any{"n": n, "ms": every}}
	p.SetProgressToken("tick")
	res, err := cs.CallTool(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || len(res.Content) == 0 || res.Content[0].(*sdk.TextContent).Text != "ticked" {
		t.Fatalf("result %+v", res)
	}
	t.Logf("stream lasted %v with write_timeout 1s", time.Since(start).Round(time.Millisecond))
	// The client runs progress handlers asynchronously: the last ones may
	// be counted after CallTool returned.
	eventually(t, liveness, fmt.Sprintf("all %d progress events counted", n), func() bool { return events.Load() == n })
}

// A client that stops reading a stream is cut once a write waits longer
// than write_timeout: its connection closes and the upstream call ends.
func TestSlowReaderIsCut(t *testing.T) {
	t.Parallel()
	// Without a session, a call whose client is cut is still
	// read from the upstream for upstream.timeout (see outlivesClient):
	// this one streams for ever, so the gateway must close it then.
	e := newEnv(t, setup{
		Upstream:     upstream.Options{Stateless: true},
		UpstreamYAML: "  timeout: 2s\n",
		Config:       "server: {write_timeout: 1s}\n",
	})
	ended := make(chan struct{})
	addStreamingTools(e, ended)
	addr := serveReal(t, e)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The client reads nothing: the socket buffers fill (a few MiB), then
	// the gateway's writes wait.
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"flood","arguments":{},"_meta":{"progressToken":"f"}}}`
	fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"Accept: application/json, text/event-stream\r\nMcp-Protocol-Version: 2025-06-18\r\nContent-Length: %d\r\n\r\n%s",
		token(t, "acme", "alice"), len(body), body)
	open := e.gws[0].metrics.OpenConnections
	eventually(t, liveness, "the connection accepted", func() bool { return gaugeValue(t, open) == 1 })
	eventually(t, liveness, "the stalled reader's connection closed by the server", func() bool {
		return gaugeValue(t, open) == 0
	})
	select {
	case <-ended:
	case <-time.After(liveness):
		t.Fatal("the upstream call did not end after the client was cut")
	}
	// What was buffered drains, then EOF: the response never completed.
	_ = c.SetReadDeadline(time.Now().Add(liveness))
	data, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the cut stream: %v", err)
	}
	if strings.Contains(string(data), `"result"`) {
		t.Fatal("the flood call got a result")
	}
	t.Logf("slow reader cut; %d KiB were buffered on the way", len(data)>>10)
}

// With max_connections 5: while five connections wait idle between
// requests, a sixth client gets the slot of the one idle longest (closed);
// while five are busy, a sixth client is not served until one closes.
func TestConnectionCap(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: "server: {max_connections: 5}\n"})
	addr, ln := serveRealListener(t, e)
	open := e.gws[0].metrics.OpenConnections
	idle := make([]*rawConn, 5)
	for i := range idle {
		idle[i] = dialRaw(t, addr)
		idle[i].healthz(t)
		// the server marks a connection idle after the client has its
		// answer: wait, so that idle[0] is the one idle longest
		testenv.Eventually(t, liveness, "the connection marked idle", func() bool { return ln.idle.len() == i+1 })
	}
	if n := gaugeValue(t, open); n != 5 {
		t.Fatalf("mcpgate_open_connections = %v, want 5", n)
	}
	sixth := dialRaw(t, addr)
	sixth.healthz(t)
	idle[0].waitEOF(t, "the connection idle longest, at the cap")
	for _, c := range idle[1:] {
		c.healthz(t) // still open
	}
	if n := gaugeValue(t, open); n > 5 {
		t.Fatalf("mcpgate_open_connections = %v, over the cap", n)
	}
	for _, c := range append(idle[1:], sixth) {
		_ = c.Close()
	}
	testenv.Eventually(t, liveness, "every connection closed", func() bool { return gaugeValue(t, open) == 0 })

	// Five busy connections: each has sent half of a request's headers.
	busy := make([]*rawConn, 5)
	for i := range busy {
		busy[i] = dialRaw(t, addr)
		if _, err := io.WriteString(busy[i], "GET /healthz HTTP/1.1\r\nHost: gw\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, liveness, "five busy connections accepted", func() bool { return gaugeValue(t, open) == 5 })
	last := dialRaw(t, addr) // the kernel completes the handshake; the gateway does not serve it
	served := make(chan error, 1)
	go func() {
		if _, err := io.WriteString(last, "GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"); err != nil {
			served <- err
			return
		}
		_ = last.SetReadDeadline(time.Now().Add(liveness))
		resp, err := http.ReadResponse(last.br, nil)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		served <- err
	}()
	// A negative check: a slower machine only makes it likelier to hold.
	select {
	case err := <-served:
		t.Fatalf("sixth connection served while five were busy (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	if n := gaugeValue(t, open); n != 5 {
		t.Fatalf("mcpgate_open_connections = %v at the cap, want 5", n)
	}
	_ = busy[0].Close()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("sixth connection after one closed: %v", err)
		}
	case <-time.After(liveness):
		t.Fatal("sixth connection not served after one closed")
	}
	if n := gaugeValue(t, open); n > 5 {
		t.Fatalf("mcpgate_open_connections = %v, over the cap", n)
	}
}
