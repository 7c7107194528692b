package gosdk_test

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// A client cannot pass its own ping off as the server's keep-alive
// (gosdk.KeepAlive): the header KeepAlive marks its ping with, sent by a
// client with any value, leaves the ping governed and charged.
func TestClientPingWithTheKeepAliveHeaderIsCharged(t *testing.T) {
	t.Parallel()
	s := newServer(t, false, `
tiers:
  free:
    limits:
      - {name: pings, per: tenant, methods: [ping], algorithm: fixed_window, limit: 1, period: 1h}
`, options{})
	tok := token(t, "forged-keepalive-co", "alice")
	cs := s.connect(tok)
	var body string
	for i := range 2 {
		req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(`{"jsonrpc":"2.0","id":`+strconv.Itoa(i+1)+`,"method":"ping"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", cs.InitializeResult().ProtocolVersion)
		req.Header.Set("Mcp-Session-Id", cs.ID())
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Mcpgate-Keep-Alive", "guessed")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
	}
	if !strings.Contains(body, "-33029") {
		t.Fatalf("a client's second ping (limit 1 an hour) with the keep-alive header: %s", body)
	}
}
