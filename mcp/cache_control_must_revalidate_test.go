package mcp

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// RFC 9111 section 3.5 names three response directives that let a shared
// cache keep and serve the answer to a request with Authorization:
// must-revalidate, public and s-maxage. copyResponseHeaders replaces only
// the last two: an upstream's "max-age=600, must-revalidate" reaches the
// client on a list trimmed to the caller's scopes, which a shared cache may
// then serve, fresh, to another caller.
func TestMustRevalidateLetsSharedCacheKeepAnswer(t *testing.T) {
	const upstream = "max-age=600, must-revalidate"
	a := answerOf{status: 200, ct: "application/json", body: []byte(`{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"echo"},{"name":"secret"}]}}`)}
	tr := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := a.RoundTrip(req)
		resp.Header.Set("Cache-Control", upstream)
		return resp, err
	})
	p, err := NewProxy(ProxyOptions{Upstream: "http://upstream.invalid/mcp", Client: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	req := `{"jsonrpc":"2.0","id":7,"method":"tools/list"}`
	w := httptest.NewRecorder()
	filter := Filter{List: ToolsList, Allow: func(n string) bool { return n != "secret" }}
	r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(req))
	r.Header.Set("Authorization", "Bearer caller-a")
	p.Start(w, r, Forward{Body: []byte(req), Filter: filter}).Finish()
	if got := w.Header().Get("Cache-Control"); strings.Contains(strings.ToLower(got), "must-revalidate") && !strings.Contains(got, "private") && !strings.Contains(got, "no-store") {
		t.Errorf("upstream Cache-Control %q reached the client as %q: a shared cache may keep the caller's filtered list (RFC 9111 3.5), want private, no-store", upstream, got)
	}
}
