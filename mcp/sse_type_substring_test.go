package mcp

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The TypeScript SDK's client reads a POST's answer as an event stream when
// its Content-Type merely contains "text/event-stream"
// (contentType?.includes('text/event-stream')), and as JSON when it contains
// "application/json" (taking a JSON array, a batch, and handling each
// response in it). An upstream answer whose media type is something else
// but whose Content-Type holds one of those strings is not relayed
// unscreened (copyBody), Content-Type included: the list another request of
// the client's would get, unfiltered, would reach it on this request's
// answer.
func TestTypeSubstringDoesNotBypassReplayFilters(t *testing.T) {
	const stream = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{\"tools\":[{\"name\":\"echo\"},{\"name\":\"secret\"}]}}\n\n" +
		"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"messages\":[]}}\n\n"
	const batch = `[{"jsonrpc":"2.0","id":8,"result":{"tools":[{"name":"echo"},{"name":"secret"}]}},` +
		`{"jsonrpc":"2.0","id":7,"result":{"messages":[]}}]`
	for _, tt := range []struct {
		ct, body string
		readAs   string // the type the client reads the answer as
	}{
		{`text/plain; x="text/event-stream"`, stream, "text/event-stream"},
		{`application/octet-stream; profile="text/event-stream"`, stream, "text/event-stream"},
		{`text/plain; x="application/json"`, batch, "application/json"},
	} {
		p, err := NewProxy(ProxyOptions{Upstream: "http://upstream.invalid/mcp",
			Client: &http.Client{Transport: answerOf{status: 200, ct: tt.ct, body: []byte(tt.body)}}})
		if err != nil {
			t.Fatal(err)
		}
		req := `{"jsonrpc":"2.0","id":7,"method":"prompts/get","params":{"name":"p"}}`
		w := httptest.NewRecorder()
		filter := Filter{List: ToolsList, Allow: func(name string) bool { return name != "secret" }}
		status, err := p.Serve(w, httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(req)),
			Forward{Body: []byte(req), ReplayFilters: []Filter{filter}})
		if got := w.Header().Get("Content-Type"); strings.Contains(got, tt.readAs) && strings.Contains(w.Body.String(), "secret") {
			t.Errorf("Content-Type %q: status %d err %v; the client (reading the answer as %s: %q) got the unfiltered list:\n%s",
				tt.ct, status, err, tt.readAs, got, w.Body.String())
		}
	}
}
