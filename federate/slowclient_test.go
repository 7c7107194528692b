package federate_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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
