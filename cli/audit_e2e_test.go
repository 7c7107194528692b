package cli

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/examples/upstream"
)

// The audit log through the real binary, rotated as logrotate does it:
// rename the file, SIGHUP, and the next lines go to a new file; SIGTERM
// writes the lines still buffered before the process exits.
func TestAuditRotateWithSIGHUP(t *testing.T) {
	dir := t.TempDir()
	bin := buildMcpgate(t, dir)
	up := httptest.NewServer(upstream.New(&upstream.Options{Stateless: true, JSONResponse: true}).Handler())
	t.Cleanup(up.Close)
	logPath := filepath.Join(dir, "audit.jsonl")
	cfg := filepath.Join(dir, "mcpgate.yaml")
	yaml := fmt.Sprintf("listen: 127.0.0.1:0\nupstream: {url: %s/mcp}\nusage: {store: \"sqlite:%s\"}\n"+
		"auth: {jwt: {hs256_secret_env: E2E_SECRET}}\naudit: {file: %q}\n", up.URL, filepath.Join(dir, "usage.db"), logPath)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	token, err := auth.SignHS256([]byte(e2eSecret), map[string]any{"tenant_id": "acme", "sub": "agent", "scope": "tools:*", "exp": time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	p := startServe(t, bin, cfg)
	call := func(id int) {
		t.Helper()
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`, id)
		req, _ := http.NewRequest(http.MethodPost, "http://"+p.addr+"/mcp", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", "2025-06-18")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("call %d: %d", id, resp.StatusCode)
		}
	}
	call(1)
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The reopen comes before the reload in the SIGHUP handler.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.stderr.String(), "config reloaded") {
		if time.Now().After(deadline) {
			t.Fatalf("no reload after SIGHUP:\n%s", p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	call(2)
	call(3)
	p.signal(t, syscall.SIGTERM)
	rotated, err := os.ReadFile(logPath + ".1")
	if err != nil {
		t.Fatal(err)
	}
	current, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(rotated, []byte("\n")); n != 1 || !bytes.Contains(rotated, []byte(`"decision":"admitted"`)) {
		t.Errorf("rotated file has %d lines:\n%s", n, rotated)
	}
	if n := bytes.Count(current, []byte("\n")); n != 2 {
		t.Errorf("new file has %d lines, want 2:\n%s\nstderr:\n%s", n, current, p.stderr.String())
	}
}

// An audit file that cannot be opened stops serve at start, naming it.
func TestAuditFileUnopenable(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "missing", "audit.jsonl")
	cfg := filepath.Join(dir, "mcpgate.yaml")
	yaml := fmt.Sprintf("listen: 127.0.0.1:0\nupstream: {url: http://127.0.0.1:1/mcp}\nusage: {store: \"sqlite:%s\"}\n"+
		"auth: {jwt: {hs256_secret_env: E2E_SECRET}}\naudit: {file: %q}\n", filepath.Join(dir, "usage.db"), logPath)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("E2E_SECRET", e2eSecret)
	code, _, stderr := run(t, "serve", "--config", cfg)
	if code == 0 || !strings.Contains(stderr, "audit.file") || !strings.Contains(stderr, logPath) {
		t.Errorf("exit %d, stderr:\n%s", code, stderr)
	}
}
