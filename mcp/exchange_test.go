package mcp

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// stepServer runs every POST through Start, Answer and Finish, parking
// between Answer and Finish until release is closed, and sends what Answer
// returned on answers.
type stepServer struct {
	proxy   *Proxy
	filter  Filter
	session func(string) string // nil: SetSessionID is not called
	release chan struct{}
	answers chan string
}

func newStepServer(t *testing.T, upstream string) (*stepServer, *httptest.Server) {
	t.Helper()
	p, err := NewProxy(ProxyOptions{Upstream: upstream})
	if err != nil {
		t.Fatal(err)
	}
	s := &stepServer{proxy: p, release: make(chan struct{}), answers: make(chan string, 1)}
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	t.Cleanup(s.free) // before hs.Close, which waits for parked handlers
	return s, hs
}

// free releases parked handlers, once.
func (s *stepServer) free() {
	select {
	case <-s.release:
	default:
		close(s.release)
	}
}

func (s *stepServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	x := s.proxy.Start(w, r, Forward{Body: body, Filter: s.filter})
	if s.session != nil {
		x.SetSessionID(s.session(x.SessionID()))
	}
	result, rpcErr, ok := x.Answer()
	if !ok {
		s.answers <- "none"
	} else {
		s.answers <- string(result) + string(rpcErr)
	}
	<-s.release
	x.Finish()
}

func TestExchangeHoldsJSONAnswerUntilFinish(t *testing.T) {
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(HeaderSessionID, "up-1")
		io.WriteString(w, `{"jsonrpc":"2.0","id":7,"result":{"content":[]}}`)
	})
	s, gs := newStepServer(t, up.URL)
	s.session = func(id string) string { return "bound(" + id + ")" }
	got := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, gs.URL, strings.NewReader(callEcho))
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- resp
	}()
	if a := <-s.answers; a != `{"content":[]}` {
		t.Fatalf("Answer() = %s", a)
	}
	// The caller holds the answer: the client must not have even the
	// headers (a JSON answer is written whole by Finish).
	select {
	case resp := <-got:
		t.Fatalf("client had a response (%d) before Finish", resp.StatusCode)
	case <-time.After(100 * time.Millisecond):
	}
	s.free()
	resp := <-got
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if string(body) != `{"jsonrpc":"2.0","id":7,"result":{"content":[]}}` {
		t.Fatalf("client got %s", body)
	}
	if id := resp.Header.Get(HeaderSessionID); id != "bound(up-1)" {
		t.Fatalf("client's session id %q, want the rewritten one", id)
	}
}

func TestExchangeRelaysEventsBeforeTheAnswer(t *testing.T) {
	// An SSE answer: the progress event before the response reaches the
	// client while the caller still holds the response; the response
	// reaches it only after Finish.
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\n\n")
		io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[]}}\n\n")
	})
	s, gs := newStepServer(t, up.URL)
	resp := post(t, gs.URL, callEcho, nil)
	if a := <-s.answers; a != `{"content":[]}` {
		t.Fatalf("Answer() = %s", a)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: ") {
				lines <- sc.Text()
			}
		}
		close(lines)
	}()
	if l := <-lines; !strings.Contains(l, "notifications/progress") {
		t.Fatalf("first event %q, want the progress notification", l)
	}
	select {
	case l := <-lines:
		t.Fatalf("client had %q before Finish", l)
	case <-time.After(100 * time.Millisecond):
	}
	s.free()
	if l := <-lines; !strings.Contains(l, `"id":7`) {
		t.Fatalf("after Finish the client got %q, want the response", l)
	}
}

func TestServeFiltersWithoutAnswer(t *testing.T) {
	// Serve (Start then Finish, nobody calling Answer) still filters a list
	// it must filter.
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"echo"},{"name":"secret"}]}}`)
	})
	p, err := NewProxy(ProxyOptions{Upstream: up.URL})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
	status, err := p.Serve(rec, req, Forward{Body: []byte(body), Filter: Filter{List: ToolsList, Allow: func(n string) bool { return n != "secret" }}})
	if err != nil || status != http.StatusOK {
		t.Fatalf("Serve = %d, %v", status, err)
	}
	if got := rec.Body.String(); strings.Contains(got, "secret") || !strings.Contains(got, "echo") {
		t.Fatalf("client got %s", got)
	}
}

func TestExchangeNotificationHasNoAnswer(t *testing.T) {
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
	})
	s, gs := newStepServer(t, up.URL)
	s.free()
	resp := post(t, gs.URL, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, nil)
	if a := <-s.answers; a != "none" {
		t.Fatalf("Answer() of a notification = %s", a)
	}
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("client got %d", resp.StatusCode)
	}
}

func TestExchangeCloseEndsTheUpstreamRequest(t *testing.T) {
	// A caller that gives up between Start and Finish closes the exchange:
	// the upstream request ends rather than hold a stream open.
	ended := make(chan struct{})
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(ended)
	})
	p, err := NewProxy(ProxyOptions{Upstream: up.URL})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(callEcho))
	x := p.Start(httptest.NewRecorder(), req, Forward{Body: []byte(callEcho)})
	x.Close()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream request still runs after Close")
	}
}

func TestFilteredListErrorAnswerPasses(t *testing.T) {
	// A JSON-RPC error answering a filtered list under an error status
	// reaches the client as the upstream sent it, even when its text holds
	// a \u escape (encoding/json writes < as \u003c): a 404 tells the
	// client to start a new session.
	const body = `{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"session \u003cabc\u003e not found"}}`
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, body)
	})
	p, err := NewProxy(ProxyOptions{Upstream: up.URL})
	if err != nil {
		t.Fatal(err)
	}
	list := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	rec := httptest.NewRecorder()
	status, _ := p.Serve(rec, httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(list)),
		Forward{Body: []byte(list), Filter: Filter{List: ToolsList, Allow: func(string) bool { return false }}})
	if status != http.StatusNotFound || rec.Body.String() != body {
		t.Fatalf("client got %d %s, want the upstream's 404", status, rec.Body)
	}
}
