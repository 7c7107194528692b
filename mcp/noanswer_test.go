package mcp

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// A call's event stream that ends cleanly without its response got no
// answer, as a cut one did: the client gets the proxy's error event, and
// Serve reports the failure (a gateway settles the call as failed, not as
// the tool's error). So too when its events carry an id holding NUL: SSE
// clients ignore such an id (the SSE spec; the TypeScript SDK's
// eventsource-parser: value.includes("\0") || (id = value)), so the stream
// is not resumable for them.
func TestProxyStreamEndedWithoutResponseFails(t *testing.T) {
	const event = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n\n"
	for _, stream := range []string{event, "id: a\x00b\n" + event} {
		up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, stream)
		})
		g, gs := newGateway(t, ProxyOptions{Upstream: up.URL})
		body := readAll(t, post(t, gs.URL, callEcho, nil))
		if !strings.Contains(body, `"id":7,"error"`) {
			t.Fatalf("stream %q: client got %q, want the proxy's error event", stream, body)
		}
		if s := g.next(t); !errors.Is(s.err, ErrUpstreamUnavailable) || s.reported != 1 {
			t.Fatalf("stream %q: served %+v, want ErrUpstreamUnavailable", stream, s)
		}
	}
}
