package mcp

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// answerOf is an upstream that answers every request with one canned
// response, without a network.
type answerOf struct {
	status int
	ct     string
	body   []byte
}

func (a answerOf) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: a.status, Header: http.Header{"Content-Type": {a.ct}},
		Body: io.NopCloser(bytes.NewReader(a.body)), Request: req}, nil
}

// fuzzProxy returns a Proxy whose upstream answers every request with
// body: an event stream when sse, else JSON, under one of five statuses
// picked by status. With status's bit 0x40 set, the Content-Type carries a
// parameter, a malformed one for an event stream (clients still read the
// type).
func fuzzProxy(t *testing.T, sse bool, status uint8, body []byte) *Proxy {
	statuses := []int{200, 202, 400, 404, 500}
	a := answerOf{status: statuses[int(status)%len(statuses)], ct: "application/json", body: body}
	switch {
	case sse && status&0x40 != 0:
		a.ct = "text/event-stream; x"
	case sse:
		a.ct = "text/event-stream"
	case status&0x40 != 0:
		a.ct = "application/json; charset=utf-8"
	}
	p, err := NewProxy(ProxyOptions{Upstream: "http://upstream.invalid/mcp", Client: &http.Client{Transport: a}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// FuzzExchangeFilteredList: whatever an upstream answers a filtered
// tools/list with (any status, JSON or SSE, any bytes), the exchange ends
// without panicking, Answer's filtered result never lists the hidden tool,
// and nothing written to the client can be read, by a lenient client
// (encoding/json: member names in any case, the last duplicate winning),
// as a response listing it. With status's high bit set, the request is a
// GET instead (a resumed stream, on which the upstream may replay any
// stored answer: only ReplayFilters screen it).
func FuzzExchangeFilteredList(f *testing.F) {
	const listed = `{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"echo"},{"name":"secret"}]}}`
	for _, s := range []struct {
		sse    bool
		status uint8
		body   string
	}{
		{false, 0, listed},
		{true, 0, "event: message\ndata: " + listed + "\n\n"},
		{false, 2, listed},
		{false, 2, `{"jsonrpc":"2.0","id":8,"result":{"tools":[{"name":"secret"}]}}`},
		{true, 0, "data: {\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{\"TOOLS\":[{\"name\":\"secret\"}]}}\n\ndata: " + listed + "\n\n"},
		{false, 0, `{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"echo"}],"Tools":[{"name":"secret"}]}}`},
		{true, 3, "data: [" + listed + "]\n\n"},
		{false, 1, ""},
		{true, 0x80, "id: s_1\ndata: " + listed + "\n\n"},
		{true, 0x80, "event: x\ndata: " + listed + "\n\n"},
		{false, 0x80, listed},
		// What a client reads differently from a naive splitter: a bare
		// CR ends a line, a leading BOM is dropped, encoding/json folds
		// ſ to s and the Kelvin sign to k.
		{true, 0, "id: 1\rdata: " + listed + "\r\r"},
		{true, 0, "\xef\xbb\xbfdata: " + listed + "\n\n"},
		{true, 0x80, ": c\rdata: " + strings.Replace(listed, `"id":7`, `"id":8`, 1) + "\r\r\n\n"},
		{false, 0, "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"tools\":[{\"name\":\"echo\"}],\"tool\u017f\":[{\"name\":\"secret\"}]}}"},
		{false, 0x80, "{\"jsonrpc\":\"2.0\",\"id\":8,\"re\u017fult\":{\"tools\":[{\"name\":\"secret\"}]}}"},
		{false, 3, "{\"jsonrpc\":\"2.0\",\"id\":9,\"re\u017fult\":{\"tools\":[{\"name\":\"secret\"}]}}"},
		{true, 0x80, "data: {\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{\"tool\u017f\":[{\"name\":\"secret\"}]}}\n\n"},
		// Lines some clients end where the spec does not (see clientEvents).
		{true, 0, "id: 1\u2028data: " + listed + "\n\n"},
		{true, 0x80, ": c\u0085data: " + listed + "\n\n"},
		{true, 0, "event: x\fdata: " + listed + "\n\n"},
		{true, 0, "\u00ef\u00bb\u00bfdata: " + listed + "\n\n"},
		{true, 0, "\xef\xbb\xbf\u00ef\u00bb\u00bfdata: " + listed + "\n\n"},
		// An event stream whose Content-Type has a malformed parameter.
		{true, 0x41, "data: {\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{\"tools\":[{\"name\":\"secret\"}]}}\n\ndata: " + listed + "\n\n"},
		{true, 0xc1, "id: s_1\ndata: " + listed + "\n\n"},
	} {
		f.Add(s.sse, s.status, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, sse bool, status uint8, body []byte) {
		p := fuzzProxy(t, sse, status&0x7f, body)
		allow := func(name string) bool { return name != "secret" }
		filter := Filter{List: ToolsList, Allow: allow}
		req := `{"jsonrpc":"2.0","id":7,"method":"tools/list"}`
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(req))
		if status&0x80 != 0 {
			r = httptest.NewRequest(http.MethodGet, "/mcp", nil)
		}
		w := httptest.NewRecorder()
		x := p.Start(w, r, Forward{Body: []byte(req), Filter: filter, ReplayFilters: []Filter{filter}})
		if result, _, ok := x.Answer(); ok && result != nil && listsSecret(result) {
			t.Fatalf("Answer's filtered result lists the hidden tool: %s", result)
		}
		x.Finish()
		out := w.Body.Bytes()
		if !readsAsEventStream(w.Header()) {
			if responseListsSecret(out) {
				t.Fatalf("the client got the hidden tool (HTTP %d): %s", w.Code, out)
			}
			return
		}
		for client, events := range clientEvents {
			for _, ev := range events(out) {
				if responseListsSecret([]byte(ev.data)) {
					t.Fatalf("a %s client reads an event listing the hidden tool: %q in %q", client, ev.data, out)
				}
			}
		}
	})
}

// clientEvents are the ways real clients split an event stream into
// events: the SSE spec's, and two that differ from it.
var clientEvents = map[string]func([]byte) []specEvent{
	"spec-following": specEvents,
	// The Python SDK's client with httpx-sse before 0.4.2 reads lines
	// through httpx's aiter_lines, which splits like str.splitlines: also
	// at VT, FF, FS, GS, RS, NEL, U+2028 and U+2029.
	"Python (httpx-sse 0.4.1)": func(b []byte) []specEvent {
		return specEvents([]byte(splitlinesBreaks.Replace(string(b))))
	},
	// The TypeScript SDK's client decodes the bytes (dropping a BOM), then
	// eventsource-parser also drops a leading U+00EF U+00BB U+00BF (it
	// compares the decoded string's char codes with the BOM's bytes).
	"TypeScript SDK": func(b []byte) []specEvent {
		s := strings.TrimPrefix(string(b), "\ufeff")
		return specEvents([]byte(strings.TrimPrefix(s, "\u00ef\u00bb\u00bf")))
	},
}

var splitlinesBreaks = strings.NewReplacer("\v", "\n", "\f", "\n", "\x1c", "\n", "\x1d", "\n", "\x1e", "\n",
	"\u0085", "\n", "\u2028", "\n", "\u2029", "\n")

// readsAsEventStream reports whether a lenient client reads an answer with
// header h as an event stream: the TypeScript SDK's client looks for
// text/event-stream anywhere in the Content-Type.
func readsAsEventStream(h http.Header) bool {
	return strings.Contains(strings.ToLower(h.Get("Content-Type")), "text/event-stream")
}

// specEvent is an event as the SSE spec's parser dispatches it.
type specEvent struct{ name, data string }

// specEvents parses b as a client following the SSE spec does, whatever
// the proxy's own reader makes of it: a leading BOM dropped, lines ended by
// CRLF, LF or a bare CR, data lines joined with LF, an event dispatched
// at a blank line when it has data, an unterminated last event discarded.
// Every event is returned, whatever its name.
func specEvents(b []byte) []specEvent {
	s := strings.TrimPrefix(string(b), "\xef\xbb\xbf")
	var out []specEvent
	var name string
	var data []string
	for len(s) > 0 {
		i := strings.IndexAny(s, "\r\n")
		if i < 0 {
			break // unterminated: discarded
		}
		line := s[:i]
		if s[i] == '\r' && i+1 < len(s) && s[i+1] == '\n' {
			i++
		}
		s = s[i+1:]
		if line == "" {
			if data != nil {
				out = append(out, specEvent{name, strings.Join(data, "\n")})
			}
			name, data = "", nil
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "data":
			data = append(data, value)
		case "event":
			name = value
		}
	}
	return out
}

// responseListsSecret reports whether data, read as encoding/json reads
// it, is a response (or a batch holding one) whose result lists a tool
// named "secret".
func responseListsSecret(data []byte) bool {
	var one struct{ Result json.RawMessage }
	if json.Unmarshal(data, &one) == nil && listsSecret(one.Result) {
		return true
	}
	var batch []struct{ Result json.RawMessage }
	if json.Unmarshal(data, &batch) == nil {
		for _, m := range batch {
			if listsSecret(m.Result) {
				return true
			}
		}
	}
	return false
}

func listsSecret(result json.RawMessage) bool {
	var r struct{ Tools []struct{ Name string } }
	if json.Unmarshal(result, &r) != nil {
		return false
	}
	for _, tool := range r.Tools {
		if tool.Name == "secret" {
			return true
		}
	}
	return false
}

// FuzzExchangeCall: whatever an upstream answers a tools/call with, the
// exchange ends without panicking; Answer, when it reports, gives a result
// or an error object, never both or neither; and a client whose answer is
// a 2xx event stream that the upstream cannot let it resume (no event ids)
// gets a response to its call on it: it is never left waiting.
func FuzzExchangeCall(f *testing.F) {
	for _, s := range []struct {
		sse    bool
		status uint8
		body   string
	}{
		{false, 0, `{"jsonrpc":"2.0","id":7,"result":{"content":[]}}`},
		{true, 0, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[]}}\n\n"},
		{true, 0, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n"},
		{true, 0, "id: s_1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n"},
		{true, 0, "data: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":\n\n"},
		{true, 0, "event: error\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\n\n"},
		{false, 4, "upstream broke"},
		{true, 0x41, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n"},
	} {
		f.Add(s.sse, s.status, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, sse bool, status uint8, body []byte) {
		p := fuzzProxy(t, sse, status, body)
		w := httptest.NewRecorder()
		x := p.Start(w, httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(callEcho)), Forward{Body: []byte(callEcho)})
		if result, rpcErr, ok := x.Answer(); ok && (result == nil) == (rpcErr == nil) {
			t.Fatalf("Answer reported result %q and error %q", result, rpcErr)
		}
		x.Finish()
		if w.Code/100 != 2 || !readsAsEventStream(w.Header()) || resumable(body) {
			return // an error status ends the call for the client; a resumable stream may be resumed
		}
		for _, ev := range specEvents(w.Body.Bytes()) {
			if ev.name != "" && ev.name != "message" {
				continue
			}
			if m, err := Parse([]byte(ev.data)); err == nil && m.Kind == Response && SameID(m.ID, json.RawMessage("7")) {
				return
			}
		}
		t.Fatalf("no response to the call on the stream the client got: %q", w.Body.Bytes())
	})
}

// resumable reports whether an upstream's event stream carries an event
// id before it ends or breaks (the client could then resume it).
func resumable(body []byte) bool {
	events := newEventReader(bytes.NewReader(body), DefaultMaxEventBytes)
	for {
		ev, err := events.next()
		if err != nil {
			return false
		}
		if ev.hasID {
			return true
		}
	}
}
