package mcp

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// An upstream answering 401 or 403 refused mcpgate's own credentials (the
// client's token is never passed on): the client gets 502 naming the
// upstream, not a 401 or 403 it would take for its own token (and start
// its authorization again, to no avail). Other statuses pass as they are.
func TestUpstreamRefusingTheGatewayIsABadGateway(t *testing.T) {
	for _, c := range []struct {
		upstream, want int
	}{
		{http.StatusUnauthorized, http.StatusBadGateway},
		{http.StatusForbidden, http.StatusBadGateway},
		{http.StatusNotFound, http.StatusNotFound},
		{http.StatusOK, http.StatusOK},
	} {
		body := `{"jsonrpc":"2.0","id":7,"result":{}}`
		up := answerOf{status: c.upstream, ct: "application/json", body: []byte(body)}
		p, err := NewProxy(ProxyOptions{Upstream: "http://upstream.invalid/mcp", Client: &http.Client{Transport: up}})
		if err != nil {
			t.Fatal(err)
		}
		req := `{"jsonrpc":"2.0","id":7,"method":"ping"}`
		w := httptest.NewRecorder()
		x := p.Start(w, httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(req)), Forward{Body: []byte(req)})
		status, err := x.Finish()
		if w.Code != c.want || status != c.want {
			t.Errorf("upstream %d: client got %d (Finish %d), want %d", c.upstream, w.Code, status, c.want)
		}
		refused := c.want == http.StatusBadGateway
		if refused != errors.Is(err, ErrUpstreamRefused) || refused && !strings.Contains(w.Body.String(), "refused the gateway's credentials") {
			t.Errorf("upstream %d: err %v, body %s", c.upstream, err, w.Body)
		}
		if refused && !errors.Is(err, ErrUpstreamUnavailable) {
			t.Errorf("upstream %d: err %v does not wrap ErrUpstreamUnavailable", c.upstream, err)
		}
	}
}
