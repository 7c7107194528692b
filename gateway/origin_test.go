package gateway

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/examples/upstream"
)

func TestCheckOrigin(t *testing.T) {
	t.Parallel()
	app := []string{"https://app.example.com"}
	for _, tc := range []struct {
		name    string
		host    string
		origins []string // Origin header values; nil: none
		allowed []string
		ok      bool
	}{
		{"no origin", "evil.example.com", nil, nil, true},
		{"same origin 127.0.0.1", "127.0.0.1:8080", []string{"http://127.0.0.1:8080"}, nil, true},
		{"same origin localhost", "localhost:8080", []string{"http://localhost:8080"}, nil, true},
		{"same origin case", "LocalHost:8080", []string{"http://LOCALHOST:8080"}, nil, true},
		{"same origin sub.localhost", "mcp.localhost:8080", []string{"http://mcp.localhost:8080"}, nil, true},
		{"same origin ipv6", "[::1]:8080", []string{"http://[::1]:8080"}, nil, true},
		{"default port in host", "localhost:80", []string{"http://localhost"}, nil, true},
		{"default port in origin", "localhost", []string{"http://localhost:80"}, nil, true},
		{"https default port", "127.0.0.1", []string{"https://127.0.0.1"}, nil, true},
		{"trailing slash", "localhost:8080", []string{"http://localhost:8080/"}, nil, true},
		// What dns-rebinding-protection sends: a page of evil.example.com
		// whose name now resolves to the gateway; Host and Origin agree.
		{"rebinding: same origin on a DNS name", "evil.example.com", []string{"http://evil.example.com"}, nil, false},
		{"rebinding with port", "evil.example.com:8080", []string{"http://evil.example.com:8080"}, nil, false},
		{"foreign origin on loopback", "127.0.0.1:8080", []string{"http://evil.example.com:8080"}, nil, false},
		{"other port", "localhost:8080", []string{"http://localhost:9999"}, nil, false},
		{"other loopback name", "127.0.0.1:8080", []string{"http://localhost:8080"}, nil, false},
		{"listed", "gw.example.com", []string{"https://app.example.com"}, app, true},
		{"listed, case and explicit port", "gw.example.com", []string{"HTTPS://App.Example.com:443"}, app, true},
		{"listed host, other scheme", "gw.example.com", []string{"http://app.example.com"}, app, false},
		{"listed host, other port", "gw.example.com", []string{"https://app.example.com:8443"}, app, false},
		{"listed with slash in config", "gw.example.com", []string{"https://app.example.com"}, []string{"https://app.example.com/"}, true},
		{"not listed", "gw.example.com", []string{"https://other.example.com"}, app, false},
		{"star", "gw.example.com", []string{"https://anything.example"}, []string{"*"}, true},
		{"star accepts null", "gw.example.com", []string{"null"}, []string{"*"}, true},
		{"null", "localhost:8080", []string{"null"}, nil, false},
		{"empty value", "localhost:8080", []string{""}, nil, false},
		{"path", "localhost:8080", []string{"http://localhost:8080/x"}, nil, false},
		{"query", "localhost:8080", []string{"http://localhost:8080?x"}, nil, false},
		{"user info", "localhost:8080", []string{"http://u@localhost:8080"}, nil, false},
		{"no scheme", "localhost:8080", []string{"//localhost:8080"}, nil, false},
		{"two values in one header", "localhost:8080", []string{"http://localhost:8080, http://evil.example.com"}, nil, false},
		{"duplicated header", "localhost:8080", []string{"http://localhost:8080", "http://localhost:8080"}, nil, false},
		{"duplicated header under star", "localhost:8080", []string{"http://a.example", "http://b.example"}, []string{"*"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "http://"+tc.host+"/mcp", nil)
			r.Host = tc.host
			for _, o := range tc.origins {
				r.Header.Add("Origin", o)
			}
			err := checkOrigin(r, tc.allowed)
			if tc.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.ok && !errors.Is(err, ErrForeignOrigin) {
				t.Fatalf("err = %v, want ErrForeignOrigin", err)
			}
		})
	}
}

// Through the gateway in front of a real go-sdk upstream: a foreign Origin
// gets 403 with a JSON-RPC error before authentication and reaches nothing;
// accepted ones are served, and Origin itself is never forwarded.
func TestOriginThroughGateway(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{
		Upstream: upstream.Options{Stateless: true, JSONResponse: true},
		Config:   "server:\n  allowed_origins: [\"https://app.example.com\"]\n",
	})
	tok := token(t, "acme", "alice")
	gwHost := strings.TrimPrefix(e.base[0], "http://") // 127.0.0.1:port
	for _, tc := range []struct {
		name, host string
		origins    []string
		tok        string
		want       int
	}{
		{"rebinding (conformance)", "evil.example.com", []string{"http://evil.example.com"}, tok, http.StatusForbidden},
		{"rebinding without token", "evil.example.com", []string{"http://evil.example.com"}, "", http.StatusForbidden},
		{"foreign", gwHost, []string{"https://evil.example.com"}, tok, http.StatusForbidden},
		{"null", gwHost, []string{"null"}, tok, http.StatusForbidden},
		{"malformed", gwHost, []string{"http://" + gwHost + "/path"}, tok, http.StatusForbidden},
		{"duplicated", gwHost, []string{"http://" + gwHost, "http://" + gwHost}, tok, http.StatusForbidden},
		{"none", gwHost, nil, tok, http.StatusOK},
		{"same origin", gwHost, []string{"http://" + gwHost}, tok, http.StatusOK},
		{"same origin localhost (conformance)", "localhost:" + gwHost[strings.LastIndexByte(gwHost, ':')+1:],
			[]string{"http://localhost:" + gwHost[strings.LastIndexByte(gwHost, ':')+1:]}, tok, http.StatusOK},
		{"listed", gwHost, []string{"https://app.example.com"}, tok, http.StatusOK},
	} {
		before := len(e.requests())
		req, err := http.NewRequest(http.MethodPost, e.mcpURL(0), strings.NewReader(callBody(1, "echo", map[string]any{"text": "x"})))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = tc.host
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tc.tok != "" {
			req.Header.Set("Authorization", "Bearer "+tc.tok)
		}
		for _, o := range tc.origins {
			req.Header.Add("Origin", o)
		}
		r, err := do(req)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != tc.want {
			t.Fatalf("%s: status %d, want %d: %s", tc.name, r.Status, tc.want, r.Body)
		}
		reached := len(e.requests()) - before
		if tc.want == http.StatusForbidden {
			if r.code() != CodeForbidden || r.Msg.JSONRPC != "2.0" {
				t.Fatalf("%s: body %s, want a JSON-RPC error %d", tc.name, r.Body, CodeForbidden)
			}
			if reached != 0 {
				t.Fatalf("%s: %d requests reached the upstream", tc.name, reached)
			}
			continue
		}
		if reached != 1 {
			t.Fatalf("%s: %d requests reached the upstream, want 1", tc.name, reached)
		}
		if o := e.requests()[before].Header.Values("Origin"); len(o) != 0 {
			t.Fatalf("%s: Origin %q forwarded upstream", tc.name, o)
		}
	}
}
