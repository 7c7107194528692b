package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/policy"
)

// apply parses extra as setup.Config (the upstream and auth sections of e)
// and applies it to instance 0, as a reload does.
func (e *env) apply(s setup) {
	e.t.Helper()
	cfg, err := policy.Parse("reload.yaml", []byte(e.configYAML(s)))
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.gws[0].Apply(cfg, authFor(e.t, cfg, nil)); err != nil {
		e.t.Fatal(err)
	}
}

// The admin token changes with SetAdminToken (a reload calls it): the old
// token is refused from the next request on, the new one accepted, and ""
// turns the admin API off.
func TestReloadAdminToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: adminConfig})
	url := e.base[0] + "/admin/breakers"
	status := func(tok string) int { return adminReq(t, http.MethodGet, url, "Bearer "+tok).Status }
	if got := status(testAdmin); got != http.StatusOK {
		t.Fatalf("the start token: %d", got)
	}
	e.gws[0].SetAdminToken("rotated-admin-token")
	if got := status(testAdmin); got != http.StatusUnauthorized {
		t.Fatalf("the old token after the change: %d, want 401", got)
	}
	if got := status("rotated-admin-token"); got != http.StatusOK {
		t.Fatalf("the new token: %d, want 200", got)
	}
	e.gws[0].SetAdminToken("")
	for _, tok := range []string{testAdmin, "rotated-admin-token", ""} {
		if got := status(tok); got != http.StatusUnauthorized {
			t.Fatalf("token %q with the admin API off: %d, want 401", tok, got)
		}
	}
}

// webhookConfig opens the breaker on the second identical call.
const webhookConfig = `
breaker:
  identical_calls: {count: 2, within: 1m}
  alert_webhook: %s
`

// A reload moves breaker alerts to the new breaker.alert_webhook, and one
// that removes it stops them. The alerter delivers in order, so once an
// event reaches a webhook every event sent before it has been dealt with:
// the checks of what did not arrive wait for nothing.
func TestReloadAlertWebhook(t *testing.T) {
	t.Parallel()
	first, second := newHook(t, 0, false), newHook(t, 0, false)
	e := newEnv(t, setup{Config: fmt.Sprintf(webhookConfig, first.srv.URL), Upstream: upstream.Options{Stateless: true, JSONResponse: true}})
	open := func(subject string) string {
		tok := token(t, "acme", subject)
		for i := range 3 {
			e.callRaw(0, tok, i, "echo", map[string]any{"text": "again"})
		}
		return keyspace.Breaker("acme", "subject:"+subject)
	}
	events := func(h *hook) int { h.mu.Lock(); defer h.mu.Unlock(); return len(h.events) }

	k1 := open("before")
	eventually(t, 10*time.Second, "the first webhook's event", func() bool { evs, _ := first.eventsFor(k1); return len(evs) == 1 })

	e.apply(setup{Upstream: upstream.Options{Stateless: true, JSONResponse: true}, Config: fmt.Sprintf(webhookConfig, second.srv.URL)})
	k2 := open("moved")
	eventually(t, 10*time.Second, "the second webhook's event", func() bool { evs, _ := second.eventsFor(k2); return len(evs) == 1 })
	if n := events(first); n != 1 {
		t.Fatalf("the old webhook got %d events, want only the one before the reload", n)
	}

	e.apply(setup{Upstream: upstream.Options{Stateless: true, JSONResponse: true}, Config: fmt.Sprintf(webhookConfig, `""`)})
	k3 := open("off")
	e.apply(setup{Upstream: upstream.Options{Stateless: true, JSONResponse: true}, Config: fmt.Sprintf(webhookConfig, second.srv.URL)})
	k4 := open("back")
	eventually(t, 10*time.Second, "the event after the webhook came back", func() bool { evs, _ := second.eventsFor(k4); return len(evs) == 1 })
	if evs, _ := second.eventsFor(k3); len(evs) != 0 || events(first) != 1 {
		t.Fatalf("an event was delivered while no webhook was configured: %+v", evs)
	}
}

// server.allowed_origins, read_timeout and write_timeout are read per
// request: a reload applies them to the next request.
func TestReloadAllowedOrigins(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true, JSONResponse: true}})
	tok := token(t, "acme", "alice")
	hdr := http.Header{"Origin": {"https://app.example.com"}}
	body := callBody(1, "echo", map[string]any{"text": "hi"})
	if r := post(t, e.mcpURL(0), tok, body, hdr); r.Status != http.StatusForbidden {
		t.Fatalf("a foreign Origin before the reload: %d, want 403", r.Status)
	}
	e.apply(setup{Config: "server: {allowed_origins: [\"https://app.example.com\"]}\n"})
	if r := post(t, e.mcpURL(0), tok, body, hdr); r.Status != http.StatusOK {
		t.Fatalf("the Origin allowed by the reload: %d %s", r.Status, r.Body)
	}
}

// server.read_timeout is read per request too: after a reload from an hour
// to 300ms, a POST whose body stalls gets its 408 within the liveness
// bound (under the old setting it would wait the hour).
func TestReloadReadTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: "server: {read_timeout: 1h, idle_timeout: 1m}\n"})
	addr := serveReal(t, e)
	e.apply(setup{Config: "server: {read_timeout: 300ms, idle_timeout: 1m}\n"})
	c := dialRaw(t, addr)
	head := fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"Accept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{", token(t, "acme", "alice"))
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(liveness))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("stalled body after the reload: no answer within %v: %v", liveness, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("stalled body after the reload: status %d, want 408", resp.StatusCode)
	}
}

// A reload that changes settings read at start only logs one warning per
// changed field, and none for the fields that follow reloads; the config
// in force keeps the old values of the first, and has the new of the others.
func TestReloadWarnsAboutStartOnlySettings(t *testing.T) {
	t.Parallel()
	var logs syncLog
	e := newEnv(t, setup{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	e.apply(setup{Config: `
store: {timeout: 40ms, on_error: closed}
usage: {flush_interval: 3s}
server: {idle_timeout: 1m, write_timeout: 5s}
breaker: {alert_webhook: "http://127.0.0.1:1/hook"}
`})
	re := regexp.MustCompile(`restart mcpgate to apply it" field=(\S+)`)
	var warned []string
	for _, m := range re.FindAllStringSubmatch(logs.String(), -1) {
		warned = append(warned, m[1])
	}
	slices.Sort(warned)
	if want := []string{"server.idle_timeout", "store.timeout", "usage.flush_interval"}; !slices.Equal(warned, want) {
		t.Fatalf("warned about %v, want %v; logs:\n%s", warned, want, logs.String())
	}
	c := e.gws[0].Config()
	if c.Store.Timeout != policy.DefaultStoreTimeout || c.Usage.FlushInterval != policy.DefaultFlushInterval || c.Server.IdleTimeout != policy.DefaultIdleTimeout {
		t.Errorf("in force after the reload: store.timeout %v, usage.flush_interval %v, server.idle_timeout %v; want the defaults it started with",
			c.Store.Timeout, c.Usage.FlushInterval, c.Server.IdleTimeout)
	}
	if c.Store.OnError != policy.FailClosed || c.Server.WriteTimeout != 5*time.Second {
		t.Errorf("in force after the reload: store.on_error %v, server.write_timeout %v; want the file's", c.Store.OnError, c.Server.WriteTimeout)
	}
}

// The reload column of docs/config.md says "restart" for exactly the
// settings Apply keeps (startOnlyFields) and what lies under them.
func TestConfigDocRestartColumn(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	startOnly := map[string]bool{}
	for _, f := range startOnlyFields {
		startOnly[f.name] = true
	}
	under := func(p string) bool {
		for n := range startOnly {
			if p == n || strings.HasPrefix(p, n+".") || strings.HasPrefix(p, n+"[") {
				return true
			}
			// A list whose servers are kept (upstreams: each one's name,
			// url, command, ...) needs a restart as a whole.
			if strings.HasPrefix(n, p+"[]") {
				return true
			}
		}
		return false
	}
	documented := map[string]bool{}
	cell := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(string(doc), "\n") {
		cells := strings.Split(strings.ReplaceAll(line, `\|`, "\x00"), "|") // \| is a | inside a cell
		if len(cells) < 7 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue // not a field row: | field | type | default | reload | meaning |
		}
		reload := strings.TrimSpace(cells[4])
		for _, m := range cell.FindAllStringSubmatch(cells[1], -1) {
			p := m[1]
			switch {
			case reload != "live" && reload != "restart":
				t.Errorf("%s: reload column %q, want live or restart", p, reload)
			case reload == "restart" && !under(p):
				t.Errorf("%s is documented as needing a restart, but a reload applies it", p)
			case reload == "live" && under(p):
				t.Errorf("%s is documented as live, but a reload keeps it (startOnlyFields)", p)
			}
			documented[p] = reload == "restart"
		}
	}
	for n := range startOnly {
		if !documented[n] {
			t.Errorf("%s is read at start only, but docs/config.md does not say it needs a restart", n)
		}
	}
}

// streamMsg is one JSON-RPC message of an event stream.
type streamMsg struct {
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

// syncLog is a log sink safe for concurrent writers.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// holdUpstream is a go-sdk server (sessions, SSE) whose tool hold sends a
// progress notification every 20ms until release is closed, then answers
// "released". AddTool on srv sends notifications/tools/list_changed on each
// session's GET stream.
type holdUpstream struct {
	srv     *sdk.Server
	url     string
	release chan struct{}
	sent    atomic.Int64
}

func newHoldUpstream(t *testing.T) *holdUpstream {
	t.Helper()
	u := &holdUpstream{release: make(chan struct{})}
	u.srv = sdk.NewServer(&sdk.Implementation{Name: "hold", Version: "1"}, nil)
	sdk.AddTool(u.srv, &sdk.Tool{Name: "hold"}, func(ctx context.Context, req *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, any, error) {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 1; ; i++ {
			select {
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			case <-u.release:
				return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "released"}}}, nil, nil
			case <-tick.C:
			}
			if err := req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{
				ProgressToken: req.Params.GetProgressToken(), Progress: float64(i),
			}); err != nil {
				return nil, nil, err
			}
			u.sent.Store(int64(i))
		}
	})
	hs := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return u.srv }, nil))
	t.Cleanup(hs.Close)
	u.url = hs.URL
	return u
}

// openStream sends a request whose answer is an event stream and returns
// its events, one message (the data) each, as they arrive; the channel is
// closed when the stream ends.
func openStream(t *testing.T, ctx context.Context, method, url, tok, sid, body string) <-chan streamMsg {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	} else {
		req.Header.Set("Accept", "text/event-stream")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body.Close()
		t.Fatalf("%s: %d %s, want an event stream", method, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	out := make(chan streamMsg, 1024)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data:"); ok {
				var m streamMsg
				if json.Unmarshal([]byte(strings.TrimSpace(data)), &m) == nil {
					out <- m
				}
			}
		}
	}()
	return out
}

// next returns the next message of stream satisfying want, failing the test
// if the stream ends first.
func next(t *testing.T, ctx context.Context, stream <-chan streamMsg, what string, want func(streamMsg) bool) streamMsg {
	t.Helper()
	for {
		select {
		case m, ok := <-stream:
			if !ok {
				t.Fatalf("the stream ended while waiting for %s", what)
			}
			if want(m) {
				return m
			}
		case <-ctx.Done():
			t.Fatalf("no %s: %v", what, ctx.Err())
		}
	}
}

// A reload (POST /admin/reload) while a session's GET stream is open and a
// streaming tools/call is in flight drops neither: both go on in the same
// HTTP responses (raw clients, which never reconnect), the call's progress
// sent after the reload arrives and so does its result, and the GET stream
// then carries a notification the upstream sends after the reload.
func TestReloadKeepsStreams(t *testing.T) {
	t.Parallel()
	u := newHoldUpstream(t)
	limits := func(n int) string {
		return fmt.Sprintf(`tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: %d, period: 1h}
`, n)
	}
	var e *env
	e = newEnv(t, setup{UpstreamURL: u.url, UpstreamYAML: "  timeout: 5s\n", Config: limits(100),
		Reload: func(context.Context) error {
			cfg, err := policy.Parse("reload.yaml", []byte(e.configYAML(setup{UpstreamURL: u.url, UpstreamYAML: "  timeout: 7s\n", Config: limits(200)})))
			if err != nil {
				return err
			}
			return e.gws[0].Apply(cfg, authFor(t, cfg, nil))
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tok := token(t, "acme", "alice")
	init := post(t, e.mcpURL(0), tok, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"reload-test","version":"1"}}}`, nil)
	sid := init.Header.Get("Mcp-Session-Id")
	if init.Status != http.StatusOK || sid == "" {
		t.Fatalf("initialize: %d %s", init.Status, init.Body)
	}
	hdr := http.Header{"Mcp-Session-Id": {sid}}
	if r := post(t, e.mcpURL(0), tok, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, hdr); r.Status != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %d %s", r.Status, r.Body)
	}
	getStream := openStream(t, ctx, http.MethodGet, e.mcpURL(0), tok, sid, "")
	call := openStream(t, ctx, http.MethodPost, e.mcpURL(0), tok, sid,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"hold","arguments":{},"_meta":{"progressToken":"p"}}}`)
	isProgress := func(m streamMsg) bool { return strings.Contains(string(m.Params), `"progressToken":"p"`) }
	next(t, ctx, call, "progress before the reload", isProgress)

	if r := adminReq(t, http.MethodPost, e.base[0]+"/admin/reload", "Bearer "+testAdmin); r.Status != http.StatusOK {
		t.Fatalf("reload: %d %s", r.Status, r.Body)
	}
	if got := e.gws[0].Config().Tiers["free"].Limits[0].Limit; got != 200 {
		t.Fatalf("the reload did not apply: limit %d", got)
	}
	after := u.sent.Load()
	next(t, ctx, call, "progress sent after the reload", func(m streamMsg) bool {
		var p struct{ Progress float64 }
		return isProgress(m) && json.Unmarshal(m.Params, &p) == nil && int64(p.Progress) > after
	})
	close(u.release)
	res := next(t, ctx, call, "the call's result", func(m streamMsg) bool { return m.Result != nil || m.Error != nil })
	if !strings.Contains(string(res.Result), "released") {
		t.Fatalf("the call's answer after the reload: %s %s", res.Result, res.Error)
	}

	sdk.AddTool(u.srv, &sdk.Tool{Name: "late"}, func(context.Context, *sdk.CallToolRequest, struct{}) (*sdk.CallToolResult, any, error) {
		return &sdk.CallToolResult{}, nil, nil
	})
	next(t, ctx, getStream, "tools/list_changed on the GET stream opened before the reload", func(m streamMsg) bool {
		return m.Method == "notifications/tools/list_changed"
	})
}

// A stalled body in a session gets its 408 too: the session stage wraps the
// client's writer, and readBody must still find the read deadline under it.
func TestStalledBodyInASessionIs408(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: "server: {read_timeout: 300ms, idle_timeout: 1m}\n"})
	addr := serveReal(t, e)
	alice, id := aliceSession(t, e)
	c := dialRaw(t, addr)
	head := fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nMcp-Session-Id: %s\r\nMcp-Protocol-Version: 2025-06-18\r\n"+
		"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{", alice, id)
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(liveness))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("stalled body in a session: no answer within %v: %v", liveness, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("stalled body in a session: status %d, want 408", resp.StatusCode)
	}
}
