package mcp

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// recordingUpstream answers like answerOf and keeps the Content-Type each
// request reached it with.
type recordingUpstream struct {
	answerOf
	got *[]string
}

func (u recordingUpstream) RoundTrip(req *http.Request) (*http.Response, error) {
	*u.got = append(*u.got, req.Header.Get("Content-Type"))
	return u.answerOf.RoundTrip(req)
}

// The proxy reads bodies as UTF-8 both ways, so no charset crosses it: a
// POST reaches the upstream as plain application/json whatever the client
// declared (an upstream honouring charset=utf-7 would read "+AHQ-ools/call"
// as tools/call), and the client gets the upstream's JSON or event stream
// without its charset (a client honouring utf-7 would read a member the
// list filter never saw as "tools").
func TestNoCharsetCrossesTheProxy(t *testing.T) {
	const list = `{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"echo"}],"+AHQ-ools":[{"name":"secret"}]}}`
	for _, c := range []struct {
		clientCT, upstreamCT, wantCT string
		body                         string
	}{
		{"application/json; charset=utf-7", "application/json; charset=utf-7", "application/json", list},
		{"application/json;charset=UTF-16", "text/event-stream; charset=utf-7", "text/event-stream", "data: " + list + "\n\n"},
		{"text/plain", "application/json", "application/json", list},
	} {
		var got []string
		up := recordingUpstream{answerOf{status: 200, ct: c.upstreamCT, body: []byte(c.body)}, &got}
		p, err := NewProxy(ProxyOptions{Upstream: "http://upstream.invalid/mcp", Client: &http.Client{Transport: up}})
		if err != nil {
			t.Fatal(err)
		}
		req := `{"jsonrpc":"2.0","id":7,"method":"tools/list"}`
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(req))
		r.Header.Set("Content-Type", c.clientCT)
		w := httptest.NewRecorder()
		filter := Filter{List: ToolsList, Allow: func(name string) bool { return name != "secret" }}
		x := p.Start(w, r, Forward{Body: []byte(req), Filter: filter})
		x.Finish()
		if len(got) != 1 || got[0] != "application/json" {
			t.Errorf("client Content-Type %q reached the upstream as %q, want application/json", c.clientCT, got)
		}
		if ct := w.Header().Get("Content-Type"); ct != c.wantCT {
			t.Errorf("upstream Content-Type %q reached the client as %q, want %q", c.upstreamCT, ct, c.wantCT)
		}
	}
}

func TestCheckCharset(t *testing.T) {
	for ct, ok := range map[string]bool{
		"":                                 true,
		"application/json":                 true,
		"application/json; charset=utf-8":  true,
		"application/json; charset=UTF-8":  true,
		`application/json; charset="utf8"`: true,
		"text/plain":                       true, // not ours to judge: the upstream does
		"application/json; charset=utf-7":  false,
		"application/json; charset=utf-16": false,
		"application/json; charset=latin1": false,
		"application/json; charset":        false, // unparseable, names a charset
		"application/json; CHARSET=utf-7;": false,
	} {
		err := CheckCharset(http.Header{"Content-Type": {ct}})
		if (err == nil) != ok {
			t.Errorf("CheckCharset(%q) = %v, want ok %v", ct, err, ok)
		}
		if err != nil && err.HTTPStatus != http.StatusUnsupportedMediaType {
			t.Errorf("CheckCharset(%q): status %d, want 415", ct, err.HTTPStatus)
		}
	}
}

// An upstream's Cache-Control that would let a shared cache keep an answer
// to a request with Authorization (public, s-maxage, must-revalidate: RFC
// 9111 section 3.5 names these three) is replaced: every answer is the
// caller's own (a list filtered to its scopes). Others pass as they are
// (no-cache on streams).
func TestSharedCachingOfAnswersIsRefused(t *testing.T) {
	for upstream, want := range map[string]string{
		"public, max-age=3600":         "private, no-store",
		"max-age=60, S-MAXAGE=60":      "private, no-store",
		"max-age=600, must-revalidate": "private, no-store",
		"no-cache":                     "no-cache",
		"":                             "",
	} {
		a := answerOf{status: 200, ct: "application/json", body: []byte(`{"jsonrpc":"2.0","id":7,"result":{"tools":[]}}`)}
		tr := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := a.RoundTrip(req)
			if upstream != "" {
				resp.Header.Set("Cache-Control", upstream)
			}
			return resp, err
		})
		p, err := NewProxy(ProxyOptions{Upstream: "http://upstream.invalid/mcp", Client: &http.Client{Transport: tr}})
		if err != nil {
			t.Fatal(err)
		}
		req := `{"jsonrpc":"2.0","id":7,"method":"tools/list"}`
		w := httptest.NewRecorder()
		filter := Filter{List: ToolsList, Allow: func(string) bool { return true }}
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(req))
		r.Header.Set("Authorization", "Bearer caller-a")
		p.Start(w, r, Forward{Body: []byte(req), Filter: filter}).Finish()
		if got := w.Header().Get("Cache-Control"); got != want {
			t.Errorf("upstream Cache-Control %q reached the client as %q, want %q", upstream, got, want)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
