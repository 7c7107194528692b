package mcp

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// An event id holding a NUL is ignored by SSE clients (the SSE spec; the
// TypeScript SDK's eventsource-parser: value.includes("\0") || (id = value)),
// so the stream is not resumable for them. The proxy counts any non-empty id
// (sseEvent.hasID): a call's stream that ends without its response is then
// left unanswered (no error event), and the client waits until its own
// timeout, while Serve reports success.
func TestNULEventIDLeavesCallUnanswered(t *testing.T) {
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "id: a\x00b\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n\n")
	})
	g, gs := newGateway(t, ProxyOptions{Upstream: up.URL})
	body := readAll(t, post(t, gs.URL, callEcho, nil))
	s := g.next(t)
	if !strings.Contains(body, `"id":7,"error"`) {
		t.Errorf("client got %q (served %+v): no error event, although no client can resume from an id holding NUL", body, s)
	}
}
