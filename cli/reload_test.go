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

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jws"
	"github.com/mcpgate/mcpgate/examples/upstream"
)

// A reload re-reads auth.admin_token_env: after a reload that names
// another variable, the old token is refused and the new one accepted; one
// that removes it turns the admin API off.
func TestServeReloadsTheAdminToken(t *testing.T) {
	up := upstream.New(&upstream.Options{Stateless: true, JSONResponse: true})
	upSrv := httptest.NewServer(up.Handler())
	defer upSrv.Close()
	t.Setenv("CLI_RELOAD_SECRET", strings.Repeat("k", 32))
	t.Setenv("CLI_RELOAD_ADMIN_A", "token-a")
	t.Setenv("CLI_RELOAD_ADMIN_B", "token-b")
	dir := t.TempDir()
	config := func(adminLine string) string {
		return fmt.Sprintf(`listen: 127.0.0.1:0
upstream: {url: %s/mcp}
usage: {store: "sqlite:%s"}
auth:
  jwt: {hs256_secret_env: CLI_RELOAD_SECRET}
%s`, upSrv.URL, filepath.Join(dir, "usage.db"), adminLine)
	}
	path := filepath.Join(dir, "mcpgate.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(config("  admin_token_env: CLI_RELOAD_ADMIN_A\n"))
	addr := startMain(t, io.Discard, "serve", "--config", path)
	admin := func(method, path, tok string) int {
		req, _ := http.NewRequest(method, "http://"+addr+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := admin(http.MethodGet, "/admin/breakers", "token-a"); got != http.StatusOK {
		t.Fatalf("token-a at start: %d", got)
	}
	write(config("  admin_token_env: CLI_RELOAD_ADMIN_B\n"))
	if got := admin(http.MethodPost, "/admin/reload", "token-a"); got != http.StatusOK {
		t.Fatalf("reload: %d", got)
	}
	if got := admin(http.MethodGet, "/admin/breakers", "token-a"); got != http.StatusUnauthorized {
		t.Fatalf("token-a after the reload: %d, want 401", got)
	}
	if got := admin(http.MethodGet, "/admin/breakers", "token-b"); got != http.StatusOK {
		t.Fatalf("token-b after the reload: %d, want 200", got)
	}
	write(config(""))
	if got := admin(http.MethodPost, "/admin/reload", "token-b"); got != http.StatusOK {
		t.Fatalf("second reload: %d", got)
	}
	if got := admin(http.MethodGet, "/admin/breakers", "token-b"); got != http.StatusUnauthorized {
		t.Fatalf("token-b after a reload without admin_token_env: %d, want 401", got)
	}
}

// A reload that leaves a JWKS URL's settings as they were keeps the
// authenticator, with the key set it holds: while the identity provider
// is down, a reload of other settings is applied (it was refused: a new
// authenticator fetches the set first) and tokens still verify.
func TestServeReloadKeepsAJWKSURLAuthenticator(t *testing.T) {
	up := upstream.New(&upstream.Options{Stateless: true, JSONResponse: true})
	upSrv := httptest.NewServer(up.Handler())
	defer upSrv.Close()
	idp := newJWKSIdP(t)
	defer idp.Close()
	claims, _ := json.Marshal(map[string]any{"tenant_id": "acme", "sub": "alice", "scope": "tools:*", "exp": time.Now().Add(time.Hour).Unix()})
	token, err := jws.Sign(claims, jws.WithKey(jwa.ES256(), idp.signer))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("CLI_RELOAD_ADMIN_A", "token-a")
	t.Setenv("CLI_RELOAD_ADMIN_B", "token-b")
	dir := t.TempDir()
	path := filepath.Join(dir, "mcpgate.yaml")
	write := func(admin string) {
		cfg := fmt.Sprintf("listen: 127.0.0.1:0\nupstream: {url: %s/mcp}\nusage: {store: \"sqlite:%s\"}\nauth:\n  jwt: {jwks_url: %s/jwks}\n  admin_token_env: %s\n",
			upSrv.URL, filepath.Join(dir, "usage.db"), idp.URL, admin)
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("CLI_RELOAD_ADMIN_A")
	addr := startMain(t, io.Discard, "serve", "--config", path)
	if r := callEcho(t, addr, string(token)); r.StatusCode != http.StatusOK {
		t.Fatalf("a call before the reload: %d", r.StatusCode)
	}
	idp.down.Store(true)
	write("CLI_RELOAD_ADMIN_B")
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/admin/reload", nil)
	req.Header.Set("Authorization", "Bearer token-a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("reload while the identity provider is down: %d %s", resp.StatusCode, msg)
	}
	if r := callEcho(t, addr, string(token)); r.StatusCode != http.StatusOK {
		t.Fatalf("a call after the reload: %d", r.StatusCode)
	}
}
