package mcp

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// A 2xx JSON answer to a request that is not its response (another id, a
// notification, nothing) would leave the client waiting for its own until
// its deadline: it gets the proxy's 502 with its id instead, whether or not
// the caller reads the answer. Notifications' answers are still relayed
// unread.
func TestProxyRefusesAnotherResponse(t *testing.T) {
	bodies := map[string]string{
		"other id":     `{"jsonrpc":"2.0","id":"other-7","result":{"content":[]}}`,
		"other number": `{"jsonrpc":"2.0","id":8,"error":{"code":-32603,"message":"x"}}`,
		"notification": `{"jsonrpc":"2.0","method":"notifications/message","params":{}}`,
		"empty":        ``,
	}
	for name, body := range bodies {
		for _, reads := range []bool{false, true} {
			t.Run(name+map[bool]string{false: " unread", true: " read"}[reads], func(t *testing.T) {
				up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "application/json")
					io.WriteString(w, body)
				})
				status, got, err := serveOnce(t, up.URL, callEcho, reads)
				var m struct {
					ID    json.RawMessage
					Error *struct{ Code int }
				}
				_ = json.Unmarshal([]byte(got), &m)
				if status != http.StatusBadGateway || string(m.ID) != "7" || m.Error == nil || m.Error.Code != CodeInternalError {
					t.Fatalf("client got %d %s, want 502 with a -32603 error for id 7", status, got)
				}
				if !errors.Is(err, ErrBadUpstreamResponse) {
					t.Fatalf("Serve: %v, want ErrBadUpstreamResponse", err)
				}
			})
		}
	}
	t.Run("own response", func(t *testing.T) {
		const own = `{"jsonrpc":"2.0","id":7,"result":{"content":[]}}`
		up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, own)
		})
		if status, got, err := serveOnce(t, up.URL, callEcho, false); status != http.StatusOK || got != own || err != nil {
			t.Fatalf("client got %d %s (%v), want the response as sent", status, got, err)
		}
	})
	t.Run("notification", func(t *testing.T) {
		up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, "{}")
		})
		const note = `{"jsonrpc":"2.0","method":"notifications/initialized"}`
		if status, got, err := serveOnce(t, up.URL, note, false); status != http.StatusAccepted || got != "{}" || err != nil {
			t.Fatalf("client got %d %s (%v), want the answer as sent", status, got, err)
		}
	})
}

// serveOnce posts body through a Proxy whose caller reads the answer
// (Exchange.Answer) or not (Serve), and returns what the client got and
// what Finish returned.
func serveOnce(t *testing.T, upstream, body string, reads bool) (int, string, error) {
	t.Helper()
	p, err := NewProxy(ProxyOptions{Upstream: upstream})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	gs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		x := p.Start(w, r, Forward{Body: b})
		if reads {
			x.Answer()
		}
		_, err := x.Finish()
		served <- err
	}))
	t.Cleanup(gs.Close)
	resp := post(t, gs.URL, body, nil)
	got := readAll(t, resp)
	return resp.StatusCode, got, <-served
}
