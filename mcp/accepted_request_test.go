package mcp

import (
	"net/http"
	"testing"
)

// MCP: a POST holding a request is answered with its response, as JSON or
// an event stream; 202 Accepted is for notifications and responses only,
// and SDK clients take it as "no body to read" (the TypeScript client
// returns at once), then wait for the call's response until their own
// timeout. The proxy refuses a request's 2xx JSON answer that is not its
// response (owesResponse), but relays a bare 202 to a tools/call as it is,
// and Serve reports 202 with no error: the gateway settles the call as OK.
func TestAcceptedAnswerToRequestIsRelayed(t *testing.T) {
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
	})
	g, gs := newGateway(t, ProxyOptions{Upstream: up.URL})
	resp := post(t, gs.URL, callEcho, nil)
	body := readAll(t, resp)
	s := g.next(t)
	if resp.StatusCode == http.StatusAccepted {
		t.Errorf("a tools/call answered 202 reached the client as %d %q (served %+v): it waits for a response that never comes; want 502",
			resp.StatusCode, body, s)
	}
}
