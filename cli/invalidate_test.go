package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/examples/upstream"
)

// searchCall makes a raw tools/call of search and returns its X-Mcp-Cache.
func searchCall(t *testing.T, addr, token, query string) string {
	t.Helper()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","arguments":{"query":%q}}}`, query)
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/mcp", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-06-18")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"result"`) {
		t.Fatalf("search %q: %d %s", query, resp.StatusCode, b)
	}
	return resp.Header.Get("X-Mcp-Cache")
}

// mcpgate invalidate, against a gateway run by mcpgate serve, drops the
// tagged entries of one tenant; it reads the address and the admin token's
// variable from the gateway's config, or takes them as flags.
func TestInvalidateAgainstARunningGateway(t *testing.T) {
	up := upstream.New(&upstream.Options{Stateless: true, JSONResponse: true})
	upSrv := httptest.NewServer(up.Handler())
	defer upSrv.Close()

	secret := strings.Repeat("s", 32)
	t.Setenv("CLI_INV_SECRET", secret)
	t.Setenv("CLI_INV_ADMIN", "the-admin-token")
	t.Setenv("CLI_INV_WRONG", "not-the-admin-token")
	t.Setenv("CLI_INV_EMPTY", "")
	dir := t.TempDir()
	config := func(listen string) string {
		return fmt.Sprintf(`listen: %s
upstream: {url: %s/mcp}
usage: {store: "sqlite:%s"}
auth:
  jwt: {hs256_secret_env: CLI_INV_SECRET}
  admin_token_env: CLI_INV_ADMIN
tools:
  search:
    cache: {ttl: 10m, tags: ["product:{{args.query}}"]}
`, listen, upSrv.URL, filepath.Join(dir, "usage.db"))
	}
	served := filepath.Join(dir, "serve.yaml")
	if err := os.WriteFile(served, []byte(config("127.0.0.1:0")), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := run(t, "usage", "init", "--config", served); code != 0 {
		t.Fatalf("usage init: exit %d: %s", code, errOut)
	}
	addr := startMain(t, io.Discard, "serve", "--config", served)
	// The operator's copy of the config names the address the gateway
	// listens on.
	path := filepath.Join(dir, "mcpgate.yaml")
	if err := os.WriteFile(path, []byte(config(addr)), 0o600); err != nil {
		t.Fatal(err)
	}

	acme, err := auth.SignHS256([]byte(secret), map[string]any{"tenant_id": "acme", "sub": "u", "scope": "tools:*", "exp": time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	globex, err := auth.SignHS256([]byte(secret), map[string]any{"tenant_id": "globex", "sub": "g", "scope": "tools:*", "exp": time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	expect := func(tok, query, want string) {
		t.Helper()
		if got := searchCall(t, addr, tok, query); got != want {
			t.Fatalf("search %q: X-Mcp-Cache %q, want %q", query, got, want)
		}
	}
	invalidated := func(out string) int {
		t.Helper()
		var v struct {
			Invalidated int `json:"invalidated"`
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("invalidate printed %q: %v", out, err)
		}
		return v.Invalidated
	}

	expect(acme, "42", "miss")
	expect(acme, "42", "hit")
	expect(acme, "43", "miss")
	expect(globex, "42", "miss")

	code, out, errOut := run(t, "invalidate", "--config", path, "--tenant", "acme", "--tag", "product:42")
	if code != 0 || invalidated(out) != 1 {
		t.Fatalf("invalidate --config: exit %d, stdout %q, stderr %q; want 0 and 1 invalidated", code, out, errOut)
	}
	expect(acme, "42", "miss")
	expect(acme, "43", "hit")
	expect(globex, "42", "hit") // another tenant's entry is untouched

	// --url and --token-env instead of a config; several tags.
	code, out, errOut = run(t, "invalidate", "--url", "http://"+addr+"/", "--token-env", "CLI_INV_ADMIN",
		"--tenant", "acme", "--tag", "product:42", "--tag", "product:43")
	if code != 0 || invalidated(out) != 2 {
		t.Fatalf("invalidate --url: exit %d, stdout %q, stderr %q; want 0 and 2 invalidated", code, out, errOut)
	}
	expect(acme, "42", "miss")
	expect(acme, "43", "miss")
	if got := up.Calls("search"); got != 6 {
		t.Fatalf("upstream saw %d search calls, want 6", got)
	}

	// Failures: a wrong or empty token, missing flags.
	code, _, errOut = run(t, "invalidate", "--config", path, "--token-env", "CLI_INV_WRONG", "--tenant", "acme", "--tag", "product:42")
	if code != 1 || !strings.Contains(errOut, "401") {
		t.Fatalf("wrong token: exit %d, stderr %q; want 1 naming the 401", code, errOut)
	}
	expect(acme, "42", "hit") // nothing was dropped
	code, _, errOut = run(t, "invalidate", "--config", path, "--token-env", "CLI_INV_EMPTY", "--tenant", "acme", "--tag", "x")
	if code != 1 || !strings.Contains(errOut, "CLI_INV_EMPTY") {
		t.Fatalf("empty token: exit %d, stderr %q; want 1 naming the variable", code, errOut)
	}
	for _, args := range [][]string{
		{"invalidate", "--config", path, "--tag", "x"},
		{"invalidate", "--config", path, "--tenant", "acme"},
		{"invalidate", "--tenant", "acme", "--tag", "x"},
		{"invalidate", "--config", path, "--tenant", "acme", "--tag", "x", "extra"},
	} {
		if code, _, errOut := run(t, args...); code != 2 {
			t.Errorf("mcpgate %v: exit %d (%s), want 2", args, code, errOut)
		}
	}
}
