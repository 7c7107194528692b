package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/policy"
)

// The in-process keep-alive ping that listenersKept posts for a client
// listening on its GET stream is the server's, not the tenant's: it is not
// charged under the tenant's method rules (a rule naming ping, or methods:
// ["*"]), as the gateway, which counts an open stream as use, charges
// nothing for it. A tenant allowed 2 pings an hour sends none of its own
// while it listens for 3 idle timeouts; its first own ping is admitted.
func TestKeepAlivePingIsNotChargedToTheTenant(t *testing.T) {
	t.Parallel()
	yaml := "auth:\n  jwt:\n    hs256_secret_env: " + testSecretEnv + "\n" +
		"usage:\n  store: sqlite:" + filepath.Join(t.TempDir(), "usage.db") + "\n  flush_interval: 1h\n" +
		"sessions:\n  idle_timeout: 1s\n" +
		"tiers:\n  free:\n    limits:\n      - {name: pings, per: tenant, methods: [ping], algorithm: fixed_window, limit: 2, period: 1h}\n"
	cfg, err := policy.ParseEmbedded("keepalive.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	s, err := newServer(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	hs := httptest.NewServer(s.handler())
	t.Cleanup(hs.Close)
	client := &http.Client{Transport: bearer{sign(t, "keepalive-co", "alice", "tools:*")}}
	post := func(session, body string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, hs.URL+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	resp, _ := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}`)
	id := resp.Header.Get("Mcp-Session-Id")
	if id == "" {
		t.Fatalf("initialize: %d", resp.StatusCode)
	}
	post(id, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	req, _ := http.NewRequest(http.MethodGet, hs.URL+"/mcp", nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	req.Header.Set("Mcp-Session-Id", id)
	get, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer get.Body.Close()
	time.Sleep(3 * time.Second) // listening, no request of its own
	_, body := post(id, `{"jsonrpc":"2.0","id":2,"method":"ping"}`)
	if strings.Contains(body, "-33029") {
		t.Fatalf("the tenant's first own ping (limit 2 an hour) was refused: the server's keep-alive pings were charged to it:\n%s", body)
	}
	if !strings.Contains(body, `"result"`) {
		t.Fatalf("the tenant's own ping after listening for 3 idle timeouts: %s", body)
	}
}
