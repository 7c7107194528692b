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
// the tool's error).
func TestProxyStreamEndedWithoutResponseFails(t *testing.T) {
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n\n")
	})
	g, gs := newGateway(t, ProxyOptions{Upstream: up.URL})
	body := readAll(t, post(t, gs.URL, callEcho, nil))
	if !strings.Contains(body, `"id":7,"error"`) {
		t.Fatalf("client got %q, want the proxy's error event", body)
	}
	if s := g.next(t); !errors.Is(s.err, ErrUpstreamUnavailable) || s.reported != 1 {
		t.Fatalf("served %+v, want ErrUpstreamUnavailable", s)
	}
}
