package mcp

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// multiTypeAnswer answers 200 with the Content-Type values ct.
type multiTypeAnswer struct {
	ct   []string
	body string
}

func (a multiTypeAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := answerOf{status: 200, body: []byte(a.body)}.RoundTrip(req)
	resp.Header["Content-Type"] = a.ct
	return resp, err
}

// A request's 2xx answer whose Content-Type only holds the JSON or event
// stream type (in any letter case, in any of several values, as a prefix)
// is refused with 502 and the request's id: the proxy would not screen it,
// a client matching by substring or prefix would read it.
func TestLookalikeTypeAnswerToRequestRefused(t *testing.T) {
	const body = `{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"secret"}]}}`
	for _, ct := range [][]string{
		{`text/plain; x="text/event-stream"`},
		{`text/plain; x="application/json"`},
		{`TEXT/PLAIN; X="Text/Event-Stream"`},
		{`application/jsonx`},
		{"text/plain", "text/event-stream"},
	} {
		p, err := NewProxy(ProxyOptions{Upstream: "http://upstream.invalid/mcp",
			Client: &http.Client{Transport: multiTypeAnswer{ct: ct, body: body}}})
		if err != nil {
			t.Fatal(err)
		}
		req := `{"jsonrpc":"2.0","id":7,"method":"prompts/get","params":{"name":"p"}}`
		w := httptest.NewRecorder()
		x := p.Start(w, httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(req)), Forward{Body: []byte(req)})
		_, rpcErr, ok := x.Answer()
		status, err := x.Finish()
		if status != http.StatusBadGateway || !errors.Is(err, ErrBadUpstreamResponse) || !ok || rpcErr == nil {
			t.Errorf("Content-Type %q: Finish %d %v, Answer %s %v; want 502, ErrBadUpstreamResponse, an error reported", ct, status, err, rpcErr, ok)
		}
		var got struct{ ID json.RawMessage }
		if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || string(got.ID) != "7" || strings.Contains(w.Body.String(), "secret") {
			t.Errorf("Content-Type %q: client got %d %q, want the 502 error with id 7", ct, w.Code, w.Body.String())
		}
	}
}

// An answer the proxy relays unscreened as another type never reaches the
// client with a Content-Type it could read as JSON or an event stream: a
// notification's, and a GET's answer when nothing screens it.
func TestLookalikeTypeNeverForwarded(t *testing.T) {
	const body = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{\"tools\":[]}}\n\n"
	for _, method := range []string{http.MethodPost, http.MethodGet} {
		for _, ct := range [][]string{{`text/plain; x="text/event-stream"`}, {"text/plain", "application/json"}} {
			p, err := NewProxy(ProxyOptions{Upstream: "http://upstream.invalid/mcp",
				Client: &http.Client{Transport: multiTypeAnswer{ct: ct, body: body}}})
			if err != nil {
				t.Fatal(err)
			}
			msg := `{"jsonrpc":"2.0","method":"notifications/initialized"}`
			w := httptest.NewRecorder()
			status, err := p.Serve(w, httptest.NewRequest(method, "/mcp", strings.NewReader(msg)), Forward{Body: []byte(msg)})
			if got := w.Header().Values("Content-Type"); status != 200 || err != nil || len(got) != 1 || got[0] != "application/octet-stream" {
				t.Errorf("%s, Content-Type %q: served %d %v with Content-Type %q, want 200 as application/octet-stream", method, ct, status, err, got)
			}
		}
	}
}

// A request's 2xx answer that is neither JSON nor an event stream (an
// empty 202 or 204, plain text) is refused with 502 and the request's id:
// relayed, it leaves the client waiting for its response or failing (MCP:
// 202 Accepted is for notifications and responses only; SDK clients take
// it as "no body to read", the TypeScript client returns at once, then wait
// for the call's response until their own timeout).
func TestUntypedAnswerToRequestRefused(t *testing.T) {
	for _, a := range []answerOf{{status: 202}, {status: 204}, {status: 200, ct: "text/plain", body: []byte("ok")}} {
		p, err := NewProxy(ProxyOptions{Upstream: "http://upstream.invalid/mcp", Client: &http.Client{Transport: a}})
		if err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		status, err := p.Serve(w, httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(callEcho)), Forward{Body: []byte(callEcho)})
		if status != http.StatusBadGateway || !errors.Is(err, ErrBadUpstreamResponse) || w.Code != http.StatusBadGateway || !strings.Contains(w.Body.String(), `"id":7`) {
			t.Errorf("HTTP %d %q: served %d %v, client got %d %q; want the 502 with id 7", a.status, a.ct, status, err, w.Code, w.Body.String())
		}
	}
	// A notification's 202 is what MCP asks for.
	p, _ := NewProxy(ProxyOptions{Upstream: "http://upstream.invalid/mcp", Client: &http.Client{Transport: answerOf{status: 202}}})
	const note = `{"jsonrpc":"2.0","method":"notifications/initialized"}`
	if status, err := p.Serve(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(note)), Forward{Body: []byte(note)}); status != 202 || err != nil {
		t.Errorf("a notification's 202: served %d %v", status, err)
	}
}
