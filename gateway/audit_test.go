package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/audit"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/policy"
)

// auditLine is one decoded line; fields absent from the line are zero.
type auditLine struct {
	Time      time.Time       `json:"time"`
	RequestID string          `json:"request_id"`
	Tenant    string          `json:"tenant"`
	Subject   string          `json:"subject"`
	Method    string          `json:"method"`
	Tool      string          `json:"tool"`
	Prompt    string          `json:"prompt"`
	Decision  string          `json:"decision"`
	Scope     string          `json:"scope"`
	Rule      string          `json:"rule"`
	Cost      *int64          `json:"cost"`
	LatencyMS *float64        `json:"latency_ms"`
	Status    int             `json:"status"`
	Upstream  string          `json:"upstream"`
	Cache     string          `json:"cache"`
	Arguments json.RawMessage `json:"arguments"`
}

// auditConfig limits every tool to 2 calls per tenant, caches search, and
// turns the breaker on (so that the gateway reads tool results).
func auditConfig(path string, extra string) string {
	return fmt.Sprintf(`
audit:
  file: %q
%s
tiers:
  free:
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 2, period: 1h}
tools:
  search:
    cache: {ttl: 10m}
breaker:
  consecutive_failures: 100
`, path, extra)
}

// auditLines flushes g's audit log and decodes the file at path; every
// line must be one JSON object.
func auditLines(t *testing.T, g *Gateway, path string) ([]auditLine, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.audit.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []auditLine
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var l auditLine
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		if err := dec.Decode(&l); err != nil || dec.More() {
			t.Fatalf("line %q is not one JSON object: %v", sc.Bytes(), err)
		}
		out = append(out, l)
	}
	return out, data
}

// find returns the lines of method (and tool, when not "").
func find(lines []auditLine, method, tool string) []auditLine {
	var out []auditLine
	for _, l := range lines {
		if l.Method == method && (tool == "" || l.Tool == tool) {
			out = append(out, l)
		}
	}
	return out
}

// End to end with a real go-sdk client and upstream: admitted, tool
// error, denied (429), forbidden (403), cached hit and other methods each
// give one line with the decision, rule, cost, status and upstream
// outcome; neither the token nor the arguments are written.
func TestAuditEndToEnd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	e := newEnv(t, setup{Config: auditConfig(path, ""), Upstream: upstream.Options{Stateless: true, JSONResponse: true}})
	tok := token(t, "acme", "alice")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs := connect(t, e.mcpURL(0), tok, "2025-06-18") // with initialize
	for range 2 {
		if _, err := callTool(ctx, cs, "echo", map[string]any{"text": "secret-argument"}); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := callTool(ctx, cs, "fail", nil); err != nil || !res.IsError {
		t.Fatalf("fail: %v %v", res, err)
	}
	for range 2 {
		if _, err := callTool(ctx, cs, "search", map[string]any{"query": "q"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.GetPrompt(ctx, &sdk.GetPromptParams{Name: "summarize", Arguments: map[string]string{"text": "x"}}); err != nil {
		t.Fatal(err)
	}
	// Under MCP 2026-07-28 the upstream refuses an unknown prompt with HTTP
	// 400; under 2025-06-18 an unknown tool is a JSON-RPC error.
	if _, err := connect(t, e.mcpURL(0), tok, "").GetPrompt(ctx, &sdk.GetPromptParams{Name: "greet"}); err == nil {
		t.Fatal("unknown prompt: no error")
	}
	if _, err := callTool(ctx, cs, "nope", nil); err == nil {
		t.Fatal("unknown tool: no error")
	}
	hdr := http.Header{"X-Request-Id": {"client-chosen-id"}}
	if r := post(t, e.mcpURL(0), tok, callBody(7, "echo", map[string]any{"text": "secret-argument"}), hdr); r.Status != http.StatusTooManyRequests {
		t.Fatalf("third echo: %d %s", r.Status, r.Body)
	}
	narrow := sign(t, claims("acme", "bob", "tools:echo"))
	if r := post(t, e.mcpURL(0), narrow, callBody(8, "search", nil), nil); r.Status != http.StatusForbidden {
		t.Fatalf("out of scope: %d %s", r.Status, r.Body)
	}

	lines, data := auditLines(t, e.gws[0], path)
	for _, l := range lines {
		if l.Time.IsZero() || l.RequestID == "" || l.Tenant != "acme" || l.Cost == nil || l.LatencyMS == nil || *l.LatencyMS < 0 {
			t.Errorf("incomplete line: %+v", l)
		}
		if l.Method == "" || strings.HasPrefix(l.Method, "notifications/") {
			t.Errorf("line for a notification or response: %+v", l)
		}
	}
	if bytes.Contains(data, []byte(tok)) || bytes.Contains(data, []byte(narrow)) || bytes.Contains(data, []byte("Bearer")) {
		t.Error("a token was written to the audit log")
	}
	if bytes.Contains(data, []byte("secret-argument")) || bytes.Contains(data, []byte(`"arguments"`)) {
		t.Errorf("arguments written without include_arguments:\n%s", data)
	}

	if l := find(lines, "initialize", ""); len(l) != 1 || l[0].Decision != "admitted" || l[0].Upstream != "ok" || l[0].Status != 200 || *l[0].Cost != 0 {
		t.Errorf("initialize: %+v", l)
	}
	echo := find(lines, "tools/call", "echo")
	if len(echo) != 3 {
		t.Fatalf("echo lines: %+v", echo)
	}
	for _, l := range echo[:2] {
		if l.Decision != "admitted" || l.Rule != "per_tool" || *l.Cost != 1 || l.Status != 200 || l.Upstream != "ok" || l.Subject != "alice" {
			t.Errorf("admitted echo: %+v", l)
		}
	}
	if d := echo[2]; d.Decision != "denied" || d.Scope != "tenant_tool" || d.Rule != "per_tool" || *d.Cost != 0 ||
		d.Status != 429 || d.Upstream != "" || d.RequestID != "client-chosen-id" {
		t.Errorf("denied echo: %+v", d)
	}
	if f := find(lines, "tools/call", "nope"); len(f) != 1 || f[0].Decision != "admitted" || f[0].Upstream != "rpc_error" {
		t.Errorf("nope: %+v", f)
	}
	if f := find(lines, "tools/call", "fail"); len(f) != 1 || f[0].Decision != "admitted" || f[0].Upstream != "tool_error" {
		t.Errorf("fail: %+v", f)
	}
	s := find(lines, "tools/call", "search")
	if len(s) != 3 {
		t.Fatalf("search lines: %+v", s)
	}
	if s[0].Decision != "admitted" || s[0].Cache != "miss" || s[0].Upstream != "ok" || *s[0].Cost != 1 {
		t.Errorf("search miss: %+v", s[0])
	}
	if s[1].Decision != "cached" || s[1].Cache != "hit" || s[1].Upstream != "" || *s[1].Cost != 1 || s[1].Status != 200 {
		t.Errorf("search hit: %+v", s[1])
	}
	if f := s[2]; f.Decision != "forbidden" || f.Scope != "scope" || f.Subject != "bob" || f.Status != 403 || *f.Cost != 0 {
		t.Errorf("forbidden search: %+v", f)
	}
	p := find(lines, "prompts/get", "")
	if len(p) != 2 || p[0].Prompt != "summarize" || p[0].Decision != "admitted" || p[0].Rule == "" || p[0].Upstream != "ok" {
		t.Fatalf("prompts/get: %+v", p)
	}
	if p[1].Prompt != "greet" || p[1].Decision != "admitted" || p[1].Status != 400 || p[1].Upstream != "http_400" {
		t.Errorf("unknown prompt: %+v", p[1])
	}
}

// include_arguments writes a tools/call's arguments (never the token).
func TestAuditIncludeArguments(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	e := newEnv(t, setup{Config: auditConfig(path, "  include_arguments: true"), Upstream: upstream.Options{Stateless: true, JSONResponse: true}})
	tok := token(t, "acme", "alice")
	if r := e.callRaw(0, tok, 1, "echo", map[string]any{"text": "line1\nline2 \"quoted\""}); r.Status != 200 {
		t.Fatalf("echo: %d %s", r.Status, r.Body)
	}
	lines, data := auditLines(t, e.gws[0], path)
	if len(lines) != 1 {
		t.Fatalf("lines: %s", data)
	}
	var args map[string]string
	if err := json.Unmarshal(lines[0].Arguments, &args); err != nil || args["text"] != "line1\nline2 \"quoted\"" {
		t.Errorf("arguments %s: %v", lines[0].Arguments, err)
	}
	if bytes.Contains(data, []byte(tok)) {
		t.Error("token written")
	}
}

// Log rotation: the file is renamed, POST /admin/reload reopens it (even
// without a reload function, even when the reload fails), and new lines go
// to a new file at the path.
func TestAuditReopenAfterRename(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	e := newEnv(t, setup{Config: auditConfig(path, ""), Upstream: upstream.Options{Stateless: true, JSONResponse: true}})
	tok := token(t, "acme", "alice")
	if r := e.callRaw(0, tok, 1, "echo", map[string]any{"text": "before"}); r.Status != 200 {
		t.Fatalf("echo: %d", r.Status)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	// The line may still be queued: it belongs to the old file, which is
	// what Reopen guarantees (it writes the queue first).
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, e.base[0]+"/admin/reload", nil)
	req.Header.Set("Authorization", "Bearer "+testAdmin)
	if r, err := do(req); err != nil || r.Status != http.StatusNotImplemented {
		t.Fatalf("reload: %v %v", r, err)
	}
	if r := e.callRaw(0, tok, 2, "echo", map[string]any{"text": "after"}); r.Status != 200 {
		t.Fatalf("echo: %d", r.Status)
	}
	cur, _ := auditLines(t, e.gws[0], path)
	old, _ := auditLines(t, e.gws[0], path+".1")
	if len(old) != 1 || len(cur) != 1 || old[0].RequestID == cur[0].RequestID {
		t.Errorf("rotated %+v, new %+v", old, cur)
	}
}

// An audit file that cannot be opened is an error at start.
func TestAuditOpenFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no-such-dir", "audit.jsonl")
	cfg, err := policy.Parse("m.yaml", []byte("upstream: {url: http://127.0.0.1:1/mcp}\nauth: {jwt: {hs256_secret_env: S}}\naudit: {file: "+path+"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(t.Context(), Options{Config: cfg, Auth: authFor(t, cfg, nil), Logger: quietLogger()})
	if err == nil {
		g.Close()
		t.Fatal("New succeeded with an audit file that cannot be opened")
	}
	if !strings.Contains(err.Error(), "audit.file") || !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name audit.file and the path", err)
	}
}

// Hostile tenant ids, subjects and tool names still make one valid JSON
// line per call. (Auth refuses tenants with control characters or invalid
// UTF-8, which decodes to U+FFFD, and the parser bodies with invalid UTF-8:
// those calls are never governed; the audit package's own test covers such
// strings too.)
func TestAuditHostileNames(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	e := newEnv(t, setup{Config: auditConfig(path, ""), Upstream: upstream.Options{Stateless: true, JSONResponse: true}})
	names := []string{"a\nb", "a\r\nb", `q"uo\te`, "}\n{\"decision\":\"admitted\"", "nul\x00", "\u2028sep", "</script>", "bad\xffutf8"}
	plain := token(t, "acme", "alice")
	governed, tenants := 0, 0
	for i, n := range names {
		// the name as a tool: JSON-escaped in the body (invalid UTF-8 raw)
		body := strings.Replace(callBody(i, "x", nil), `"name":"x"`, `"name":`+jsonString(n), 1)
		switch r := post(t, e.mcpURL(0), plain, body, nil); {
		case r.Status == http.StatusBadRequest && strings.ToValidUTF8(n, "") != n:
		case r.Status == http.StatusBadRequest || r.Status == http.StatusUnauthorized:
			t.Errorf("tool %q: %d %s", n, r.Status, r.Body)
		default:
			governed++
		}
		// the name as tenant and subject
		if r := post(t, e.mcpURL(0), sign(t, claims(n, n, "tools:*")), callBody(i, "echo", nil), nil); r.Status != http.StatusUnauthorized {
			governed++
			tenants++
		}
	}
	lines, data := auditLines(t, e.gws[0], path)
	if tenants < 3 || governed < len(names)-1+tenants {
		t.Errorf("only %d calls governed (%d hostile tenants)", governed, tenants)
	}
	if len(lines) != governed || bytes.Count(data, []byte("\n")) != governed {
		t.Fatalf("%d calls governed, %d lines:\n%s", governed, len(lines), data)
	}
	seen := map[string]bool{}
	for _, l := range lines {
		if l.Decision == "" || l.Tenant == "" {
			t.Errorf("line %+v", l)
		}
		seen[l.Tool], seen[l.Tenant] = true, true
	}
	for _, n := range names[:len(names)-1] {
		if !seen[n] {
			t.Errorf("%q not written back exactly", n)
		}
	}
}

// jsonString writes s as a JSON string, keeping invalid UTF-8 bytes raw
// (json.Marshal would replace them).
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	if strings.ToValidUTF8(s, "") == s {
		return string(b)
	}
	return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"`
}

// Lost lines are counted in mcpgate_audit_dropped_total (here: a line
// logged after Close, which wrote the buffered ones and closed the file).
func TestAuditDroppedMetric(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	e := newEnv(t, setup{Config: auditConfig(path, ""), Upstream: upstream.Options{Stateless: true, JSONResponse: true}})
	if r := e.callRaw(0, token(t, "acme", "alice"), 1, "echo", map[string]any{"text": "x"}); r.Status != 200 {
		t.Fatalf("echo: %d", r.Status)
	}
	if v, ok := scrape(t, e.base[0])["mcpgate_audit_dropped_total"]; !ok || v != 0 {
		t.Fatalf("mcpgate_audit_dropped_total = %v (exported: %v), want 0", v, ok)
	}
	if err := e.gws[0].Close(); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(path); err != nil || bytes.Count(data, []byte("\n")) != 1 {
		t.Fatalf("after Close: %q %v", data, err)
	}
	e.gws[0].audit.Log(audit.Record{Decision: "admitted"})
	if v := scrape(t, e.base[0])["mcpgate_audit_dropped_total"]; v != 1 {
		t.Errorf("mcpgate_audit_dropped_total = %v, want 1", v)
	}
}

// The audit line of a call refused because the store is down under
// on_error: closed says unavailable (503), and the line of a call its
// client cancelled (notifications/cancelled) says the upstream outcome
// cancelled: both paths end in the same settled-then-audited order as an
// admitted call.
func TestAuditUnavailableAndCancelled(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	redis := testenv.StartRedis(t, nil)
	e := newEnv(t, setup{Redis: redis, Upstream: upstream.Options{Stateless: true, JSONResponse: true}, Config: fmt.Sprintf(`
audit: {file: %q}
store: {redis: "@@REDIS@@", timeout: 2s}
tiers:
  free:
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 100, period: 1h}
tools:
  search: {on_error: closed}
`, path)})
	tok := token(t, "acme", "alice")

	// Cancelled: a slow call, then the client's notifications/cancelled.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs := connect(t, e.mcpURL(0), tok, "2025-06-18")
	callCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := callTool(callCtx, cs, "slow", map[string]any{"ms": 5000})
		done <- err
	}()
	eventually(t, 10*time.Second, "the slow call to reach the upstream", func() bool { return e.up.Calls("slow") == 1 })
	stop() // the SDK client sends notifications/cancelled
	<-done

	redis.Kill()
	if r := e.callRaw(0, tok, 9, "search", map[string]any{"query": "q"}); r.Status != http.StatusServiceUnavailable {
		t.Fatalf("closed tool with Redis down: %d %s", r.Status, r.Body)
	}

	var slow, search *auditLine
	eventually(t, 10*time.Second, "both audit lines", func() bool {
		lines, _ := auditLines(t, e.gws[0], path)
		slow, search = nil, nil
		for i := range lines {
			switch lines[i].Tool {
			case "slow":
				slow = &lines[i]
			case "search":
				search = &lines[i]
			}
		}
		return slow != nil && search != nil
	})
	if slow.Decision != "admitted" || slow.Upstream != "cancelled" {
		t.Errorf("cancelled call's line: decision %q upstream %q, want admitted / cancelled", slow.Decision, slow.Upstream)
	}
	if search.Decision != "unavailable" || search.Status != http.StatusServiceUnavailable {
		t.Errorf("unavailable call's line: decision %q status %d, want unavailable / 503", search.Decision, search.Status)
	}
}

// A name as long as the body limit allows costs a refused caller nothing,
// so the audit line keeps at most audit.MaxField bytes of it (a 1 MiB tool
// name outside the caller's scopes wrote 1 MiB per 403 before).
func TestAuditLongNames(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	e := newEnv(t, setup{Config: auditConfig(path, ""), Upstream: upstream.Options{Stateless: true, JSONResponse: true}})
	name := strings.Repeat("n", 1<<20)
	for i := range 3 {
		if r := e.callRaw(0, sign(t, claims("acme", "alice", "tools:echo")), i, name, nil); r.Status != http.StatusForbidden {
			t.Fatalf("call %d: %d %s", i, r.Status, r.Body[:min(len(r.Body), 200)])
		}
	}
	lines, data := auditLines(t, e.gws[0], path)
	if len(lines) != 3 || len(data) > 3*(audit.MaxField+1024) {
		t.Fatalf("%d lines, %d bytes for 3 calls", len(lines), len(data))
	}
	for _, l := range lines {
		if l.Decision != "forbidden" || len(l.Tool) > audit.MaxField || !strings.HasPrefix(l.Tool, "nnnn") || !strings.HasSuffix(l.Tool, "…") {
			t.Errorf("line: decision %s, tool of %d bytes", l.Decision, len(l.Tool))
		}
	}
}

// The line of a call whose cost comes from its result records the cost
// charged in the end, the estimate corrected to what the tool reported
// (more or less than the estimate), not the estimate.
func TestAuditCorrectedCost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	e := newEnv(t, setup{Usage: openUsageDB(t, ""), Upstream: upstream.Options{Stateless: true, JSONResponse: true}, Config: fmt.Sprintf(`
audit:
  file: %q
tools:
  llm_complete: {cost: {estimate: 150, from_result: _meta.usage.tokens}}
`, path)})
	tok := token(t, "acme", "alice")
	reported := []int64{42, 300, 150}
	for i, n := range reported {
		if r := post(t, e.mcpURL(0), tok, callBody(i, "llm_complete", map[string]any{"prompt": "p", "tokens": n}), nil); r.Status != http.StatusOK {
			t.Fatalf("call %d: %d %s", i, r.Status, r.Body)
		}
	}
	lines, _ := auditLines(t, e.gws[0], path)
	calls := find(lines, "tools/call", "llm_complete")
	if len(calls) != len(reported) {
		t.Fatalf("%d lines for llm_complete, want %d", len(calls), len(reported))
	}
	for i, l := range calls {
		if l.Cost == nil || *l.Cost != reported[i] || l.Decision != "admitted" {
			t.Errorf("line %d: %+v (cost %v), want admitted at the reported cost %d", i, l, l.Cost, reported[i])
		}
	}
}
