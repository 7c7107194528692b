package mcp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// These tests drive the proxy against small hand-written upstreams, to force
// behaviours a well-behaved SDK server never shows on demand (a stall
// between two events, a stream cut short, a malformed tools/list). The SDK
// end-to-end tests are in sdk_test.go.

// served records what one Serve call returned and reported.
type served struct {
	status   int
	err      error
	reported int
	result   json.RawMessage
	rpcErr   json.RawMessage
}

// gateway is a minimal gateway: ReadBody, Parse, CheckHeaders, then Serve.
type gateway struct {
	proxy  *Proxy
	allow  func(string) bool // Forward.AllowTool
	filter Filter
	replay []Filter // Forward.ReplayFilters
	header http.Header

	mu   sync.Mutex
	logs []*served
	done chan *served
}

func newGateway(t *testing.T, opts ProxyOptions) (*gateway, *httptest.Server) {
	t.Helper()
	p, err := NewProxy(opts)
	if err != nil {
		t.Fatal(err)
	}
	g := &gateway{proxy: p, done: make(chan *served, 100)}
	hs := httptest.NewServer(g)
	t.Cleanup(hs.Close)
	return g, hs
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := &served{}
	f := Forward{Header: g.header, AllowTool: g.allow, Filter: g.filter, ReplayFilters: g.replay}
	if r.Method == http.MethodPost {
		body, e := ReadBody(r, 1<<20)
		if e != nil {
			e.Respond(w)
			return
		}
		m, err := Parse(body)
		if err != nil {
			err.(*Error).Respond(w)
			return
		}
		if e := CheckHeaders(r, m); e != nil {
			e.Respond(w)
			return
		}
		f.Body, f.Msg = body, m
	}
	x := g.proxy.Start(w, r, f)
	if r.Method == http.MethodPost {
		if result, rpcErr, ok := x.Answer(); ok {
			s.reported++
			s.result = append(json.RawMessage(nil), result...)
			s.rpcErr = append(json.RawMessage(nil), rpcErr...)
		}
	}
	s.status, s.err = x.Finish()
	g.mu.Lock()
	g.logs = append(g.logs, s)
	g.mu.Unlock()
	g.done <- s
}

// last waits for the next finished Serve call.
func (g *gateway) next(t *testing.T) *served {
	t.Helper()
	select {
	case s := <-g.done:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
		return nil
	}
}

func post(t *testing.T, url, body string, header http.Header) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func fakeUpstream(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the body as a real server does: net/http notices a closed
		// connection (and cancels r.Context) only once the body is consumed.
		_, _ = io.ReadAll(r.Body)
		h(w, r)
	}))
	t.Cleanup(hs.Close)
	return hs
}

func writeEvent(w http.ResponseWriter, data string) {
	fmt.Fprintf(w, "event: message\ndata: %s\n\n", data)
	w.(http.Flusher).Flush()
}

const callEcho = `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}`

func TestNewProxyValidates(t *testing.T) {
	for _, u := range []string{"", "localhost:8080", "ftp://x/mcp", "http://", "://x"} {
		if _, err := NewProxy(ProxyOptions{Upstream: u}); err == nil {
			t.Errorf("NewProxy(%q) accepted", u)
		}
	}
	if _, err := NewProxy(ProxyOptions{Upstream: "http://x/mcp", MaxEventBytes: -1}); err == nil {
		t.Error("negative MaxEventBytes accepted")
	}
	if _, err := NewProxy(ProxyOptions{Upstream: "https://x:8443/mcp"}); err != nil {
		t.Error(err)
	}
}

func TestProxyStreamsEventByEvent(t *testing.T) {
	release := make(chan struct{})
	sentSecond := make(chan struct{})
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		writeEvent(w, `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}`)
		select {
		case <-release:
		case <-time.After(5 * time.Second):
		}
		close(sentSecond)
		writeEvent(w, `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"hi"}]}}`)
	})
	g, gs := newGateway(t, ProxyOptions{Upstream: up.URL})
	resp := post(t, gs.URL, callEcho, nil)
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	if resp.Header.Get("X-Accel-Buffering") != "no" {
		t.Fatalf("X-Accel-Buffering %q", resp.Header.Get("X-Accel-Buffering"))
	}
	br := bufio.NewReader(resp.Body)
	first := make(chan string, 1)
	go func() { first <- readEventBlock(br) }()
	select {
	case ev := <-first:
		if !strings.Contains(ev, "notifications/progress") {
			t.Fatalf("first event %q", ev)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("first event not relayed while the upstream holds the second")
	}
	select {
	case <-sentSecond:
		t.Fatal("the upstream sent the second event before the client saw the first")
	default:
	}
	close(release)
	if ev := readEventBlock(br); !strings.Contains(ev, `"id":7`) {
		t.Fatalf("second event %q", ev)
	}
	s := g.next(t)
	if s.err != nil || s.status != 200 || s.reported != 1 || !strings.Contains(string(s.result), `"text":"hi"`) {
		t.Fatalf("served %+v", s)
	}
}

func readEventBlock(br *bufio.Reader) string {
	var b strings.Builder
	for {
		line, err := br.ReadString('\n')
		b.WriteString(line)
		if err != nil || line == "\n" {
			return b.String()
		}
	}
}

func TestProxyHeaders(t *testing.T) {
	var got http.Header
	var gotMethod string
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		got, gotMethod = r.Header.Clone(), r.Method
		w.Header().Set("Mcp-Session-Id", "sess-1")
		w.Header().Set("Set-Cookie", "upstream=1")
		w.Header().Set("WWW-Authenticate", `Bearer realm="upstream"`)
		w.Header().Set("X-Internal", "secret")
		w.WriteHeader(http.StatusAccepted)
	})
	g, gs := newGateway(t, ProxyOptions{Upstream: up.URL, Headers: http.Header{"X-Upstream-Key": {"k1"}}})
	g.header = http.Header{"X-Mcp-Tenant": {"t1"}, "X-Mcp-Subject": {"alice"}}

	clientHeaders := http.Header{
		"Authorization":        {"Bearer client-token"},
		"Cookie":               {"sid=client"},
		"X-Mcp-Tenant":         {"evil"},
		"X-Forwarded-For":      {"1.2.3.4"},
		"Proxy-Authorization":  {"Basic x"},
		"Mcp-Session-Id":       {"sess-1"},
		"Mcp-Protocol-Version": {"2026-07-28"},
		"Mcp-Method":           {"notifications/initialized"},
		"Mcp-Param-Region":     {"eu"},
		"Traceparent":          {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		"User-Agent":           {"agent/1"},
	}
	resp := post(t, gs.URL, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, clientHeaders)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if gotMethod != http.MethodPost {
		t.Fatalf("upstream method %s", gotMethod)
	}
	for _, h := range []string{"Authorization", "Cookie", "X-Forwarded-For", "Proxy-Authorization"} {
		if v := got.Values(h); len(v) > 0 {
			t.Errorf("upstream received %s: %q", h, v)
		}
	}
	want := map[string]string{
		"X-Upstream-Key": "k1", "X-Mcp-Tenant": "t1", "X-Mcp-Subject": "alice", "Mcp-Session-Id": "sess-1",
		"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "notifications/initialized", "Mcp-Param-Region": "eu",
		"Traceparent": clientHeaders.Get("Traceparent"), "User-Agent": "agent/1", "Content-Type": "application/json",
		"Accept": "application/json, text/event-stream",
	}
	for k, v := range want {
		if vs := got.Values(k); len(vs) != 1 || vs[0] != v {
			t.Errorf("upstream %s = %q, want %q", k, vs, v)
		}
	}
	if resp.Header.Get("Mcp-Session-Id") != "sess-1" {
		t.Errorf("client did not get Mcp-Session-Id")
	}
	for _, h := range []string{"Set-Cookie", "Www-Authenticate", "X-Internal"} {
		if v := resp.Header.Get(h); v != "" {
			t.Errorf("client received upstream %s: %q", h, v)
		}
	}
	if s := g.next(t); s.status != http.StatusAccepted || s.err != nil || s.reported != 0 {
		t.Fatalf("served %+v", s)
	}

	// An upstream credential in ProxyOptions.Headers replaces the client's.
	g2, gs2 := newGateway(t, ProxyOptions{Upstream: up.URL, Headers: http.Header{"Authorization": {"Bearer upstream-cred"}}})
	post(t, gs2.URL, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, http.Header{"Authorization": {"Bearer client-token"}})
	g2.next(t)
	if v := got.Values("Authorization"); len(v) != 1 || v[0] != "Bearer upstream-cred" {
		t.Fatalf("upstream Authorization %q", v)
	}
}

func TestProxyUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	g, gs := newGateway(t, ProxyOptions{Upstream: "http://" + addr + "/mcp"})
	resp := post(t, gs.URL, callEcho, nil)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	m, err := Parse([]byte(body))
	if err != nil || m.Kind != Response || string(m.ID) != "7" ||
		!strings.Contains(string(m.Error), `"code":-32603`) || !strings.Contains(string(m.Error), "unavailable") {
		t.Fatalf("body %s (%v)", body, err)
	}
	s := g.next(t)
	if !errors.Is(s.err, ErrUpstreamUnavailable) || s.status != 502 || s.reported != 1 || !strings.Contains(string(s.rpcErr), "unavailable") {
		t.Fatalf("served %+v", s)
	}
}

func TestProxyTimeout(t *testing.T) {
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("X-Test"), "stream") {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			writeEvent(w, `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}`)
		}
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	g, gs := newGateway(t, ProxyOptions{Upstream: up.URL, Timeout: 150 * time.Millisecond})

	start := time.Now()
	resp := post(t, gs.URL, callEcho, nil)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(body, `"id":7`) || !strings.Contains(body, "-32603") {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	if time.Since(start) > 3*time.Second {
		t.Fatal("timeout not applied")
	}
	if s := g.next(t); !errors.Is(s.err, ErrUpstreamTimeout) || s.reported != 1 {
		t.Fatalf("served %+v", s)
	}

	// Mid-stream: the client gets the first event, then an error response
	// for its call.
	g.header = http.Header{"X-Test": {"stream"}}
	resp = post(t, gs.URL, callEcho, nil)
	body = readAll(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(body, "notifications/progress") || !strings.Contains(body, `"id":7,"error":{"code":-32603,"message":"upstream MCP server timed out"}`) {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	if s := g.next(t); !errors.Is(s.err, ErrUpstreamTimeout) || s.reported != 1 {
		t.Fatalf("served %+v", s)
	}
}

func TestProxyClientDisconnectCancelsUpstream(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			arrived := make(chan struct{})
			cancelled := make(chan struct{})
			up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if stream {
					w.Header().Set("Content-Type", "text/event-stream")
					w.WriteHeader(http.StatusOK)
					writeEvent(w, `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}`)
				}
				close(arrived)
				select {
				case <-r.Context().Done():
					close(cancelled)
				case <-time.After(10 * time.Second):
				}
			})
			g, gs := newGateway(t, ProxyOptions{Upstream: up.URL, Timeout: -1})
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gs.URL, strings.NewReader(callEcho))
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			<-arrived
			cancel()
			select {
			case <-cancelled:
			case <-time.After(5 * time.Second):
				t.Fatal("upstream request not cancelled when the client went away")
			}
			if s := g.next(t); !errors.Is(s.err, ErrClientGone) || s.reported != 0 {
				t.Fatalf("served %+v", s)
			}
		})
	}
}

func TestProxyAnswer(t *testing.T) {
	tests := []struct {
		name       string
		ct, body   string
		status     int
		wantResult string
		wantErr    string
	}{
		{"result", "application/json", `{"jsonrpc":"2.0","id":7,"result":{"content":[],"_meta":{"usage":{"tokens":5}}}}`, 200, `{"content":[],"_meta":{"usage":{"tokens":5}}}`, ""},
		{"rpc error", "application/json", `{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"bad"}}`, 200, "", `{"code":-32602,"message":"bad"}`},
		{"rpc error with 400", "application/json", `{"jsonrpc":"2.0","id":7,"error":{"code":-32020,"message":"mismatch"}}`, 400, "", `{"code":-32020,"message":"mismatch"}`},
		{"other id with 400", "application/json", `{"jsonrpc":"2.0","id":8,"result":{}}`, 400, "", `without a JSON-RPC response`},                                                           // a 2xx is refused: TestProxyRefusesAnotherResponse
		{"result with 500", "application/json", `{"jsonrpc":"2.0","id":7,"result":{"content":[],"_meta":{"usage":{"tokens":900}}}}`, 500, "", `"upstream answered HTTP 500 with a result"`}, // relayed, but clients never read it
		{"plain 404", "text/plain", "session not found\n", 404, "", `"upstream answered HTTP 404 without a JSON-RPC response"`},
		{"sse without answer", "text/event-stream", "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n\n", 200, "", "ended the stream without a response"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tt.ct)
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			})
			g, gs := newGateway(t, ProxyOptions{Upstream: up.URL})
			resp := post(t, gs.URL, callEcho, nil)
			body := readAll(t, resp)
			if resp.StatusCode != tt.status || !strings.HasPrefix(body, tt.body) {
				t.Fatalf("client got %d %q", resp.StatusCode, body)
			}
			s := g.next(t)
			if s.reported != 1 || string(s.result) != tt.wantResult || !strings.Contains(string(s.rpcErr), tt.wantErr) {
				t.Fatalf("Answer() = %s, %s, %d reports", s.result, s.rpcErr, s.reported)
			}
		})
	}
}

func TestProxyResumableStreamNotAnswered(t *testing.T) {
	// A stream that carried event ids can be resumed by the client with GET +
	// Last-Event-ID: the proxy must not invent an answer.
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "id: s1_0\ndata:\n\n")
	})
	g, gs := newGateway(t, ProxyOptions{Upstream: up.URL})
	body := readAll(t, post(t, gs.URL, callEcho, nil))
	if body != "id: s1_0\ndata:\n\n" {
		t.Fatalf("body %q", body)
	}
	if s := g.next(t); s.reported != 0 || s.err != nil {
		t.Fatalf("served %+v", s)
	}
}

func TestProxyGetAndDelete(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.Header.Get("Mcp-Session-Id")+" "+r.Header.Get("Last-Event-ID"))
		mu.Unlock()
		switch r.Method {
		case http.MethodGet:
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			io.WriteString(w, ": ok\n\n")
			w.(http.Flusher).Flush()
			writeEvent(w, `{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`)
		case http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	g, gs := newGateway(t, ProxyOptions{Upstream: up.URL, Timeout: time.Second})

	req, _ := http.NewRequest(http.MethodGet, gs.URL, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", "s9")
	req.Header.Set("Last-Event-ID", "s9_3")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	resp.Body.Close()
	if resp.StatusCode != 200 || body != ": ok\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n\n" {
		t.Fatalf("GET %d %q", resp.StatusCode, body)
	}
	if s := g.next(t); s.status != 200 || s.err != nil {
		t.Fatalf("served %+v", s)
	}

	req, _ = http.NewRequest(http.MethodDelete, gs.URL, nil)
	req.Header.Set("Mcp-Session-Id", "s9")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE %d", resp.StatusCode)
	}
	g.next(t)

	req, _ = http.NewRequest(http.MethodPut, gs.URL, nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, POST, DELETE" {
		t.Fatalf("PUT %d", resp.StatusCode)
	}
	g.next(t)

	mu.Lock()
	defer mu.Unlock()
	if want := []string{"GET s9 s9_3", "DELETE s9 "}; strings.Join(seen, "|") != strings.Join(want, "|") {
		t.Fatalf("upstream saw %q, want %q", seen, want)
	}
}

func TestProxyLimits(t *testing.T) {
	big := `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"` + strings.Repeat("x", 2000) + `"}]}}`
	for _, sse := range []bool{false, true} {
		up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			if sse {
				w.Header().Set("Content-Type", "text/event-stream")
				writeEvent(w, big)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, big)
		})
		g, gs := newGateway(t, ProxyOptions{Upstream: up.URL, MaxResponseBytes: 1000, MaxEventBytes: 1000})
		body := readAll(t, post(t, gs.URL, callEcho, nil))
		if strings.Contains(body, "xxxx") || !strings.Contains(body, `"id":7`) {
			t.Fatalf("sse=%v body %.200s", sse, body)
		}
		if s := g.next(t); !errors.Is(s.err, ErrBadUpstreamResponse) || s.reported != 1 {
			t.Fatalf("sse=%v served %+v", sse, s)
		}
	}
}

func TestProxyParsesWhenMsgNil(t *testing.T) {
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) { t.Error("upstream reached") })
	p, err := NewProxy(ProxyOptions{Upstream: up.URL})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	status, err := p.Serve(rec, httptest.NewRequest(http.MethodPost, "/mcp", nil), Forward{Body: []byte(`[1]`)})
	var e *Error
	if status != 400 || !errors.As(err, &e) || e.Code != CodeInvalidRequest || rec.Code != 400 {
		t.Fatalf("status %d err %v rec %d", status, err, rec.Code)
	}
}

func TestMediaType(t *testing.T) {
	for v, want := range map[string]string{
		"application/json":                   "application/json",
		"application/json; charset=utf-8":    "application/json",
		"Text/Event-Stream":                  "text/event-stream",
		"text/event-stream; charset=utf-8":   "text/event-stream",
		"text/event-stream; x":               "text/event-stream", // a malformed parameter still names the type
		"text/event-stream;;charset=\"utf-8": "text/event-stream",
		"":                                   "",
		"text/":                              "",
		"/json":                              "",
	} {
		if got := mediaType(v); got != want {
			t.Errorf("mediaType(%q) = %q, want %q", v, got, want)
		}
	}
}
