package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/gosdk"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/setup"
	"github.com/mcpgate/mcpgate/usage"
)

const (
	testSecret    = "sdkserver-test-secret-0123456789abcdef" // >= 32 bytes
	testSecretEnv = "MCPGATE_SDKSERVER_TEST_SECRET"
)

// The secret is set once for the package: t.Setenv cannot be used by
// parallel tests.
func TestMain(m *testing.M) {
	os.Setenv(testSecretEnv, testSecret)
	os.Exit(m.Run())
}

func sign(t testing.TB, tenant, sub, scope string) string {
	t.Helper()
	tok, err := auth.SignHS256([]byte(testSecret), map[string]any{
		"tenant_id": tenant, "sub": sub, "scope": scope, "exp": time.Now().Add(time.Hour).Unix(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// connect opens a go-sdk client session to url with tok, without retries
// (a retried POST would blur exact counts).
func connect(t *testing.T, url, tok string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "sdkserver-test", Version: "1"}, nil)
	tr := &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearer{tok}}, MaxRetries: -1}
	cs, err := client.Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func callText(ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any) (string, error) {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return "", err
	}
	if res.IsError || len(res.Content) != 1 {
		return "", errors.New("unexpected result")
	}
	return res.Content[0].(*mcp.TextContent).Text, nil
}

func code(err error) int64 {
	var e *jsonrpc.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// The command end to end: a config without upstream, echo and count over
// Streamable HTTP with bearer tokens, scopes, a tenant limit, and on
// shutdown (ctx ending, as SIGINT does) the final usage flush.
func TestRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := filepath.Join(dir, "usage.db")
	cfgPath := filepath.Join(dir, "sdkserver.yaml")
	cfg := `auth:
  jwt:
    hs256_secret_env: ` + testSecretEnv + `
usage:
  store: sqlite:` + db + `
  flush_interval: 1h
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: 3, period: 1h}
`
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var logs testenv.SyncBuffer
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--config", cfgPath, "--listen", "127.0.0.1:0"}, &logs, func(addr string) { addrc <- addr })
	}()
	var url string
	select {
	case addr := <-addrc:
		url = "http://" + addr + "/mcp"
	case err := <-done:
		t.Fatalf("run ended before serving: %v\n%s", err, logs.String())
	}

	resp, err := http.Post(url, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: %d, want 401", resp.StatusCode)
	}

	all := connect(t, url, sign(t, "acme", "alice", "tools:*"))
	if got, err := callText(ctx, all, "echo", map[string]any{"text": "hello"}); err != nil || got != "hello" {
		t.Fatalf("echo = %q, %v", got, err)
	}
	if got, err := callText(ctx, all, "count", nil); err != nil || got != "2" {
		t.Fatalf("count = %q, %v; want 2 (echo, then this call)", got, err)
	}

	echoOnly := connect(t, url, sign(t, "acme", "bob", "tools:echo"))
	list, err := echoOnly.ListTools(ctx, nil)
	if err != nil || len(list.Tools) != 1 || list.Tools[0].Name != "echo" {
		t.Fatalf("tools/list with scope tools:echo = %+v, %v; want echo alone", list, err)
	}
	if _, err := callText(ctx, echoOnly, "count", nil); code(err) != gosdk.CodeForbidden {
		t.Fatalf("count outside the scopes: %v, want code %d", err, gosdk.CodeForbidden)
	}
	// The refused call was not charged: one call of the tenant's three is left.
	if got, err := callText(ctx, echoOnly, "echo", map[string]any{"text": "bob"}); err != nil || got != "bob" {
		t.Fatalf("third call = %q, %v", got, err)
	}
	if _, err := callText(ctx, all, "count", nil); code(err) != gosdk.CodeRateLimited {
		t.Fatalf("fourth call: %v, want code %d", err, gosdk.CodeRateLimited)
	}

	stop() // as SIGINT or SIGTERM
	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, logs.String())
	}
	st, err := setup.OpenUsageStore(context.Background(), "sqlite:"+db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, ok, err := st.Get(context.Background(), "acme", usage.Period(time.Now()))
	if err != nil || !ok || rec.Used() != 3 || rec.NetCalls() != 3 {
		t.Fatalf("durable usage after shutdown = %+v, %v, %v; want the 3 admitted calls (the final flush)", rec, ok, err)
	}
	if !strings.Contains(logs.String(), "created the usage table") {
		t.Errorf("the log does not say the usage table was created:\n%s", logs.String())
	}
}

// Bad invocations and configs are reported, naming what is wrong.
func TestRunErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	withUpstreamNoURL := write("a.yaml", "upstream: {timeout: 1s}\nauth: {jwt: {hs256_secret_env: "+testSecretEnv+"}}\n")
	unsetSecret := write("b.yaml", "auth: {jwt: {hs256_secret_env: MCPGATE_SDKSERVER_UNSET_SECRET}}\n")
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--config FILE is required"},
		{[]string{"--config", withUpstreamNoURL}, "upstream.url: required"},
		{[]string{"--config", unsetSecret}, "auth.jwt.hs256_secret_env: environment variable MCPGATE_SDKSERVER_UNSET_SECRET is not set or empty"},
		{[]string{"--config", filepath.Join(dir, "missing.yaml")}, "no such file"},
		{[]string{"--config", withUpstreamNoURL, "--log-level", "loud"}, "--log-level"},
	} {
		var out testenv.SyncBuffer
		err := run(context.Background(), c.args, &out, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("run %q = %v, want an error containing %q", c.args, err, c.want)
		}
	}
}

// idleSession starts a server whose sessions.idle_timeout is 1s (and
// whose config ends with tiers, "" for none) and opens a session on it: the
// server, its URL, a client authenticated on it, the session id, and post,
// which sends a message in a session ("" for none) and reads its answer.
func idleSession(t *testing.T, tiers string) (s *server, url string, client *http.Client, id string, post func(session, body string) (*http.Response, string)) {
	t.Helper()
	yaml := "auth:\n  jwt:\n    hs256_secret_env: " + testSecretEnv + "\n" +
		"usage:\n  store: sqlite:" + filepath.Join(t.TempDir(), "usage.db") + "\n  flush_interval: 1h\n" +
		"sessions:\n  idle_timeout: 1s\n" + tiers
	cfg, err := policy.ParseEmbedded("idle.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	s, err = newServer(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	hs := httptest.NewServer(s.handler())
	t.Cleanup(hs.Close)
	client = &http.Client{Transport: bearer{sign(t, "idle-co", "alice", "tools:*")}}
	post = func(session, body string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, hs.URL+"/mcp", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
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
	id = resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || id == "" {
		t.Fatalf("initialize: %d, session %q", resp.StatusCode, id)
	}
	post(id, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if n := sessionCount(s); n != 1 {
		t.Fatalf("%d sessions after initialize, want 1", n)
	}
	return s, hs.URL + "/mcp", client, id, post
}

// listen opens the client's GET stream in session id at url.
func listen(t *testing.T, client *http.Client, url, id string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	req.Header.Set("Mcp-Session-Id", id)
	get, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return get
}

func sessionCount(s *server) int {
	n := 0
	for range s.mcp.Sessions() {
		n++
	}
	return n
}

// A session its client abandons (no DELETE: the client crashed, or just
// exited) ends once unused for sessions.idle_timeout, as the gateway ends
// it: without the handler's SessionTimeout every abandoned session (its
// ServerSession, transport and goroutines) stayed for the life of the
// process.
func TestAbandonedSessionEnds(t *testing.T) {
	t.Parallel()
	s, _, _, id, post := idleSession(t, "")
	// Abandoned: no request, no DELETE. Polled without a request (one
	// would keep the session in use); the bound is the test's, far past
	// the idle timeout.
	for deadline := time.Now().Add(30 * time.Second); sessionCount(s) != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a session unused for 30s under sessions.idle_timeout 1s is still open")
		}
	}
	if resp, _ := post(id, `{"jsonrpc":"2.0","id":2,"method":"ping"}`); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a request in the ended session: %d, want 404", resp.StatusCode)
	}
}

// A client listening on its GET stream (waiting for notifications) uses
// its session, as the gateway counts it: the session outlives the idle
// timeout (the SDK's SessionTimeout counts POSTs only, and ended it).
func TestListeningSessionIsKept(t *testing.T) {
	t.Parallel()
	s, url, client, id, post := idleSession(t, "")
	get := listen(t, client, url, id)
	defer get.Body.Close()
	if get.StatusCode != http.StatusOK {
		t.Fatalf("GET stream: %d", get.StatusCode)
	}
	time.Sleep(3 * time.Second) // listening for three idle timeouts, no POST
	if n := sessionCount(s); n != 1 {
		t.Fatalf("%d sessions after 3s of listening under idle_timeout 1s, want the listener's", n)
	}
	if resp, _ := post(id, `{"jsonrpc":"2.0","id":2,"method":"ping"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("a request of the listening client: %d, want its session kept", resp.StatusCode)
	}
}
