package mcp

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// An upstream that answers a call on an event stream and then leaves the
// stream open and silent has cut nothing when the idle timeout ends the
// relay: Finish reports the answer's status with no error (a gateway would
// take ErrUpstreamTimeout for a call still running upstream), and the
// client gets no error event after its response.
func TestAnsweredStreamIdleEndIsClean(t *testing.T) {
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[]}}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	g, gs := newGateway(t, ProxyOptions{Upstream: up.URL, Timeout: 50 * time.Millisecond})
	resp := post(t, gs.URL, callEcho, nil)
	body := readAll(t, resp)
	s := g.next(t)
	if s.status != http.StatusOK || s.err != nil || s.reported != 1 || s.result == nil {
		t.Errorf("served %+v, want 200, no error, the result reported", s)
	}
	if strings.Count(body, "data:") != 1 || strings.Contains(body, "error") {
		t.Errorf("client got %q, want the response event alone", body)
	}
}
