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
// "application/json". An upstream answer whose media type is something else
// but whose Content-Type holds one of those strings is relayed by the proxy
// unscreened (copyBody), Content-Type included: the list another request of
// the client's would get, unfiltered, reaches it on this request's stream.
func TestSSETypeSubstringBypassesReplayFilters(t *testing.T) {
	const stream = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{\"tools\":[{\"name\":\"echo\"},{\"name\":\"secret\"}]}}\n\n" +
		"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"messages\":[]}}\n\n"
	for _, ct := range []string{
		`text/plain; x="text/event-stream"`,
		`application/octet-stream; profile="text/event-stream"`,
	} {
		p, err := NewProxy(ProxyOptions{Upstream: "http://upstream.invalid/mcp",
			Client: &http.Client{Transport: answerOf{status: 200, ct: ct, body: []byte(stream)}}})
		if err != nil {
			t.Fatal(err)
		}
		req := `{"jsonrpc":"2.0","id":7,"method":"prompts/get","params":{"name":"p"}}`
		w := httptest.NewRecorder()
		filter := Filter{List: ToolsList, Allow: func(name string) bool { return name != "secret" }}
		status, err := p.Serve(w, httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(req)),
			Forward{Body: []byte(req), ReplayFilters: []Filter{filter}})
		if got := w.Header().Get("Content-Type"); strings.Contains(got, "text/event-stream") && strings.Contains(w.Body.String(), "secret") {
			t.Errorf("Content-Type %q: status %d err %v; the client (reading the answer as an event stream: %q) got the unfiltered list:\n%s",
				ct, status, err, got, w.Body.String())
		}
	}
}

// The same with the JSON branch of that client, which also takes a JSON
// array (a batch) and handles each response in it.
func TestJSONTypeSubstringBypassesReplayFilters(t *testing.T) {
	const batch = `[{"jsonrpc":"2.0","id":8,"result":{"tools":[{"name":"echo"},{"name":"secret"}]}},` +
		`{"jsonrpc":"2.0","id":7,"result":{"messages":[]}}]`
	ct := `text/plain; x="application/json"`
	p, err := NewProxy(ProxyOptions{Upstream: "http://upstream.invalid/mcp",
		Client: &http.Client{Transport: answerOf{status: 200, ct: ct, body: []byte(batch)}}})
	if err != nil {
		t.Fatal(err)
	}
	req := `{"jsonrpc":"2.0","id":7,"method":"prompts/get","params":{"name":"p"}}`
	w := httptest.NewRecorder()
	filter := Filter{List: ToolsList, Allow: func(name string) bool { return name != "secret" }}
	status, err := p.Serve(w, httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(req)),
		Forward{Body: []byte(req), ReplayFilters: []Filter{filter}})
	if got := w.Header().Get("Content-Type"); strings.Contains(got, "application/json") && strings.Contains(w.Body.String(), "secret") {
		t.Errorf("status %d err %v; the client (reading the answer as JSON: %q) got the unfiltered list:\n%s", status, err, got, w.Body.String())
	}
}
