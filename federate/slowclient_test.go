package federate_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
)

// A client that stops reading its event stream holds up no other client.
// On a stdio upstream every client shares one upstream session, whose
// notifications the SDK hands to one goroutine in order: if that goroutine
// wrote to the stalled client itself, every other client's progress and
// log messages would wait behind it (and their answers with them). Here
// the slow client's call floods it with progress it never reads; another
// client's calls on the same upstream still get their progress ahead of
// each answer, and what the slow client's outbox cannot hold is dropped
// and counted.
func TestSlowClientStallsNoOne(t *testing.T) {
	var dropped atomic.Int64
	f, err := federate.New(context.Background(), federate.Options{
		Logger: slog.New(slog.DiscardHandler),
		Upstreams: []federate.Upstream{
			{Name: "c", Command: stdioCommand(t), Env: map[string]string{stdioEnv: "c"}, Prefix: "c__"},
		},
		OnDropped: func(method string) {
			if method == "notifications/progress" {
				dropped.Add(1)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	// Small socket buffers: a client that stops reading blocks the
	// server's writes after a few KiB rather than megabytes.
	ts := httptest.NewUnstartedServer(f.Handler())
	ts.Listener = smallSendBuffers{ts.Listener}
	ts.Start()
	t.Cleanup(ts.Close)

	slow := &rawClient{t: t, url: ts.URL}
	initialize(slow)
	marker := filepath.Join(t.TempDir(), "flooded")
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(4 << 10)
		}
		return c, err
	}}
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"c__flood","arguments":{"count":400,"text":%q},"_meta":{"progressToken":"flood"}}}`, marker)
	req, _ := http.NewRequest(http.MethodPost, ts.URL, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	req.Header.Set("Mcp-Session-Id", slow.session)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	// The slow client hangs up before the server closes (cleanups run
	// last first): the writes blocked on it fail then.
	t.Cleanup(func() {
		resp.Body.Close()
		tr.CloseIdleConnections()
	})
	// Every flood notification has left the upstream before the other
	// client's calls: theirs come after them on the shared session.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(marker); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			t.Fatalf("the flood did not finish: %v", err)
		}
	}

	fast := &rawClient{t: t, url: ts.URL}
	initialize(fast)
	for i := range 5 {
		events := fast.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"c__burst","_meta":{"progressToken":"t%d"}}}`, i+1, i))
		if got := eventKinds(events); got != "progress,progress,progress,result" {
			t.Fatalf("call %d of the other client, with the slow client stalled: events %s, want 3 progress then the result", i, got)
		}
	}
	if dropped.Load() == 0 {
		t.Error("no notification of the stalled client was dropped: its outbox is unbounded")
	}
}

func initialize(c *rawClient) {
	c.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	c.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
}

// eventKinds names the events of an answer in order: progress or result.
func eventKinds(events []string) string {
	var kinds []string
	for _, ev := range events {
		switch {
		case strings.Contains(ev, `"notifications/progress"`):
			kinds = append(kinds, "progress")
		case strings.Contains(ev, `"result"`):
			kinds = append(kinds, "result")
		}
	}
	return strings.Join(kinds, ",")
}

// smallSendBuffers gives each accepted connection a small socket send
// buffer.
type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4 << 10)
	}
	return c, err
}

// One client's upstream session connecting slowly holds up no other
// client's answer. Tenant A's first call to an HTTP upstream opens A's own
// session there, whose initialize the upstream holds (until gate opens);
// meanwhile tenant B's call gets a broken answer (a 200 that is no
// JSON-RPC), which ends B's own session: forgetting it must not wait on
// A's session, locked while it connects. B's answer arrives while A's
// initialize is still held.
func TestSlowConnectStallsNoOtherClient(t *testing.T) {
	var holdInit atomic.Bool
	held, gate := make(chan struct{}), make(chan struct{})
	var heldOnce sync.Once
	a := startHTTPUpstream(t, "a", func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(b))
			if r.Method == http.MethodPost && bytes.Contains(b, []byte(`"initialize"`)) && holdInit.Load() {
				heldOnce.Do(func() { close(held) })
				<-gate
			}
			if r.Method == http.MethodPost && bytes.Contains(b, []byte(`"bad"`)) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, "no")
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	released := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(released)
	_, url := serve(t, federate.Options{Upstreams: []federate.Upstream{{Name: "a", URL: a.URL(), Prefix: "a__"}}})
	tenantA := connect(t, url, newClient("tenant-a", nil))
	tenantB := connect(t, url, newClient("tenant-b", nil))
	if got, _ := callText(t, tenantB, "a__echo", map[string]any{"text": "1"}); got != "a: 1" { // B's own session
		t.Fatalf("B: %q", got)
	}
	holdInit.Store(true)
	aDone := make(chan struct{})
	go func() {
		defer close(aDone)
		_, _ = tenantA.CallTool(context.Background(), &mcp.CallToolParams{Name: "a__echo", Arguments: map[string]any{"text": "x"}})
	}()
	<-held // A's session is connecting
	bDone := make(chan error, 1)
	go func() {
		_, err := tenantB.CallTool(context.Background(), &mcp.CallToolParams{Name: "a__echo", Arguments: map[string]any{"text": "bad"}})
		bDone <- err
	}()
	select {
	case err := <-bDone:
		t.Logf("B's broken call: %v", err)
	case <-time.After(waitLong):
		t.Error("B's answer (its own session broken) waited for tenant A's session to connect")
	}
	released()
	<-aDone
}
