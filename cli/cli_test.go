package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"net/http/httptest"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Main(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestCheckAcceptsTheContractExample(t *testing.T) {
	// Accepted whether or not the secret variable is set (unset: a warning).
	t.Setenv("MCPGATE_JWT_SECRET", "")
	code, out, errOut := run(t, "check", "--config", "../policy/testdata/mcpgate.example.yaml")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	if !strings.Contains(out, ": ok") {
		t.Fatalf("stdout %q does not say ok", out)
	}
	// an unset ${VAR} in upstream.headers is a warning naming its line
	if os.Getenv("UPSTREAM_TOKEN") == "" && !strings.Contains(errOut, "warning: ") {
		t.Fatalf("stderr has no warning for the unset UPSTREAM_TOKEN:\n%s", errOut)
	}
}

// -h is help asked for and given: exit 0 (as for mcpgate --help), with each
// command's flags on stderr; a bad flag is still bad usage.
func TestHelpExitsZero(t *testing.T) {
	if code, _, _ := run(t, "--help"); code != 0 {
		t.Fatalf("mcpgate --help: exit %d", code)
	}
	for _, c := range commands() {
		code, _, errOut := run(t, c.name, "-h")
		if code != 0 || !strings.Contains(errOut, "mcpgate "+c.name) || !strings.Contains(errOut, "Usage") {
			t.Errorf("mcpgate %s -h: exit %d, stderr %q; want 0 and its flags", c.name, code, errOut)
		}
	}
	if code, _, _ := run(t, "check", "--no-such-flag"); code != 2 {
		t.Errorf("an unknown flag: exit %d, want 2", code)
	}
}

func TestCheckAcceptsTheDocumentedExample(t *testing.T) {
	if code, _, errOut := run(t, "check", "--config", "../examples/mcpgate.example.yaml"); code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
}

// --embedded validates the config of a server embedding the engine, which
// may leave upstream out; without it such a file is refused.
func TestCheckEmbedded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "embedded.yaml")
	t.Setenv("CLI_TEST_JWT_SECRET", "cli-test-secret-0123456789abcdef0123")
	if err := os.WriteFile(path, []byte("auth:\n  jwt:\n    hs256_secret_env: CLI_TEST_JWT_SECRET\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := run(t, "check", "--config", path, "--embedded"); code != 0 || !strings.Contains(out, ": ok") {
		t.Fatalf("check --embedded: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, _, errOut := run(t, "check", "--config", path); code != 1 || !strings.Contains(errOut, "upstream.url: required") {
		t.Fatalf("check without --embedded: exit %d, stderr %q; want upstream.url required", code, errOut)
	}
}

func TestCheckReportsFileLineFieldProblem(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	cfg := "listen: 127.0.0.1:8080\nupstream:\n  url: http://127.0.0.1:9000/mcp\nauth:\n  jwt:\n    hs256_secret_env: S\nstore:\n  redsi: x\n  on_error: sometimes\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run(t, "check", "--config", path)
	if code != 1 {
		t.Fatalf("exit %d, want 1; stderr:\n%s", code, errOut)
	}
	for _, want := range []string{path + ":8: store.redsi: ", path + ":9: store.on_error: "} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
}

// check fails, naming the file and the field, on an auth key file serve
// could not use, and warns of an unset secret variable (the environment
// check runs in need not be serve's, as for upstream header variables);
// it fetches no JWKS URL.
func TestCheckRefusesAnUnusableKeySource(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("CLI_TEST_JWT_SECRET", "cli-test-secret-0123456789abcdef0123")
	idp := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("check fetched the JWKS URL")
	}))
	defer idp.Close()
	for _, c := range []struct {
		name, source, want, warn string // want "" means ok
	}{
		{"secret set", "hs256_secret_env: CLI_TEST_JWT_SECRET", "", ""},
		{"secret unset", "hs256_secret_env: CLI_TEST_SURELY_UNSET", "", "environment variable CLI_TEST_SURELY_UNSET is not set"},
		{"missing PEM file", "public_key_file: " + filepath.Join(dir, "missing.pem"), "auth: reading public key file", ""},
		{"missing JWKS file", "jwks_file: " + filepath.Join(dir, "missing.json"), "auth: reading JWKS file", ""},
		{"JWKS URL", "jwks_url: " + idp.URL + "/jwks", "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_")+".yaml")
			cfg := "upstream:\n  url: http://127.0.0.1:9000/mcp\nauth:\n  jwt:\n    " + c.source + "\n"
			if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			code, out, errOut := run(t, "check", "--config", path)
			switch {
			case c.want == "" && (code != 0 || !strings.Contains(out, ": ok")):
				t.Fatalf("exit %d, stdout %q, stderr %q; want ok", code, out, errOut)
			case c.warn != "" && (!strings.Contains(errOut, "warning: "+path+": auth.jwt.hs256_secret_env: ") || !strings.Contains(errOut, c.warn)):
				t.Fatalf("stderr %q; want a warning %q", errOut, c.warn)
			case c.want != "" && (code != 1 || !strings.Contains(errOut, path+": "+c.want) || strings.Contains(errOut, "auth: auth:")):
				t.Fatalf("exit %d, stderr %q; want exit 1 and %q", code, errOut, path+": "+c.want)
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{}, {"nope"}, {"check"}, {"serve"}, {"check", "--config", "x", "extra"}} {
		if code, _, _ := run(t, args...); code != 2 {
			t.Errorf("mcpgate %v: exit %d, want 2", args, code)
		}
	}
	if code, _, errOut := run(t, "check", "--config", "/does/not/exist.yaml"); code != 1 {
		t.Errorf("missing file: exit %d, want 1 (%s)", code, errOut)
	}
	if code, out, _ := run(t, "version"); code != 0 || !strings.HasPrefix(out, "mcpgate ") {
		t.Errorf("version: exit %d, output %q", code, out)
	}
}

var listening = regexp.MustCompile(`msg="mcpgate listening" addr=(\S+)`)

// startMain runs Main in the background and returns the gateway's address.
func startMain(t *testing.T, stdout io.Writer, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stderr := &testenv.SyncBuffer{}
	done := make(chan int, 1)
	go func() { done <- Main(ctx, args, stdout, stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("mcpgate did not stop after its context ended")
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m := listening.FindStringSubmatch(stderr.String()); m != nil {
			return m[1]
		}
		select {
		case code := <-done:
			t.Fatalf("mcpgate exited with %d:\n%s", code, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("mcpgate did not start:\n%s", stderr.String())
	return ""
}

func callEcho(t *testing.T, addr, token string) *http.Response {
	t.Helper()
	return callMCP(t, addr, token, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}`)
}

// callMCP posts one JSON-RPC request to the gateway at addr.
func callMCP(t *testing.T, addr, token, body string) *http.Response {
	t.Helper()
	resp, err := http.DefaultClient.Do(mcpRequest(context.Background(), addr, token, body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// mcpRequest is the POST of one JSON-RPC request to the gateway at addr.
func mcpRequest(ctx context.Context, addr, token, body string) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/mcp", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-06-18")
	return req
}

func TestServeEnforcesAndReloads(t *testing.T) {
	up := upstream.New(&upstream.Options{Stateless: true, JSONResponse: true})
	upSrv := httptest.NewServer(up.Handler())
	defer upSrv.Close()

	secret := strings.Repeat("k", 32)
	t.Setenv("CLI_TEST_SECRET", secret)
	t.Setenv("CLI_TEST_ADMIN", "admin-token")
	dir := t.TempDir()
	db := filepath.Join(dir, "usage.db")
	config := func(limit int) string {
		return fmt.Sprintf(`listen: 127.0.0.1:0
upstream: {url: %s/mcp}
usage: {store: "sqlite:%s"}
auth:
  jwt: {hs256_secret_env: CLI_TEST_SECRET}
  admin_token_env: CLI_TEST_ADMIN
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: %d, period: 1h}
`, upSrv.URL, db, limit)
	}
	path := filepath.Join(dir, "mcpgate.yaml")
	if err := os.WriteFile(path, []byte(config(3)), 0o600); err != nil {
		t.Fatal(err)
	}
	// No usage init: serve creates the SQLite schema itself.
	addr := startMain(t, io.Discard, "serve", "--config", path)
	token, err := auth.SignHS256([]byte(secret), map[string]any{"tenant_id": "t1", "sub": "u", "scope": "tools:*", "exp": time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 4; i++ {
		resp := callEcho(t, addr, token)
		want := http.StatusOK
		if i == 4 {
			want = http.StatusTooManyRequests
		}
		if resp.StatusCode != want {
			t.Fatalf("call %d: status %d, want %d", i, resp.StatusCode, want)
		}
	}
	if got := up.Calls("echo"); got != 3 {
		t.Fatalf("upstream saw %d calls, want 3", got)
	}

	// Reload through the admin API with a higher limit: the counter is kept,
	// so exactly 2 more calls fit.
	if err := os.WriteFile(path, []byte(config(5)), 0o600); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/admin/reload", nil)
	req.Header.Set("Authorization", "Bearer admin-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("reload: status %d", resp.StatusCode)
	}
	admitted := 0
	for range 4 {
		if callEcho(t, addr, token).StatusCode == http.StatusOK {
			admitted++
		}
	}
	if admitted != 2 || up.Calls("echo") != 5 {
		t.Fatalf("after reload: %d admitted, upstream saw %d; want 2 and 5", admitted, up.Calls("echo"))
	}

	// A broken config is refused and the old one stays in force.
	if err := os.WriteFile(path, []byte("listen: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("reload of a broken config: status %d, want 422", resp.StatusCode)
	}
	if callEcho(t, addr, token).StatusCode != http.StatusTooManyRequests {
		t.Fatal("the old limit is no longer enforced after a refused reload")
	}
}

func TestServeRefusesAMissingSecret(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mcpgate.yaml")
	cfg := "upstream: {url: http://127.0.0.1:9/mcp}\nauth:\n  jwt: {hs256_secret_env: CLI_TEST_UNSET_SECRET}\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run(t, "serve", "--config", path)
	if code != 1 || !strings.Contains(errOut, "CLI_TEST_UNSET_SECRET") {
		t.Fatalf("exit %d, stderr %q: want 1 naming the variable", code, errOut)
	}
}

var tokenLine = regexp.MustCompile(`export TOKEN=(\S+)`)

func TestDemoPrintsAWorkingToken(t *testing.T) {
	stdout := &testenv.SyncBuffer{}
	addr := startMain(t, stdout, "demo", "--listen", "127.0.0.1:0")
	var token string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := tokenLine.FindStringSubmatch(stdout.String()); m != nil {
			token = m[1]
			break
		}
	}
	if token == "" {
		t.Fatalf("no token printed:\n%s", stdout.String())
	}
	if !strings.Contains(stdout.String(), "curl") {
		t.Fatalf("no client command printed:\n%s", stdout.String())
	}
	if resp := callEcho(t, addr, token); resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Limit") == "" {
		t.Fatalf("demo call: status %d, headers %v", resp.StatusCode, resp.Header)
	}
	// The demo token reaches the demo's resources and prompts as well.
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":8,"method":"resources/read","params":{"uri":"file:///docs/readme.md"}}`,
		`{"jsonrpc":"2.0","id":9,"method":"prompts/get","params":{"name":"summarize","arguments":{"text":"x"}}}`,
	} {
		if resp := callMCP(t, addr, token, body); resp.StatusCode != http.StatusOK {
			t.Fatalf("demo %s: status %d", body, resp.StatusCode)
		}
	}
	if !strings.Contains(stdout.String(), `"tools:* resources:* prompts:*"`) || !strings.Contains(stdout.String(), "expires in 24h") {
		t.Fatalf("demo output does not state the token's scopes and expiry:\n%s", stdout.String())
	}
	if resp := callEcho(t, addr, "not-a-token"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("bad token: status %d, want 401", resp.StatusCode)
	}
}

// DynamoDB tables are not created by serve: it refuses to start without
// one, saying what to run, and starts once that was run.
func TestServeNamesUsageInitForAMissingDynamoDBTable(t *testing.T) {
	endpoint := testenv.StartDynalite(t)
	for k, v := range map[string]string{
		"AWS_ENDPOINT_URL_DYNAMODB": endpoint, "AWS_REGION": "us-east-1",
		"AWS_ACCESS_KEY_ID": "AKIDTEST", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_SESSION_TOKEN": "",
		"AWS_CONFIG_FILE": filepath.Join(t.TempDir(), "none"), "AWS_SHARED_CREDENTIALS_FILE": filepath.Join(t.TempDir(), "none"),
		"AWS_PROFILE": "", "AWS_EC2_METADATA_DISABLED": "true",
		"CLI_TEST_SECRET": strings.Repeat("k", 32),
	} {
		t.Setenv(k, v)
	}
	path := filepath.Join(t.TempDir(), "mcpgate.yaml")
	cfg := "listen: 127.0.0.1:0\nupstream: {url: http://127.0.0.1:9/mcp}\nusage: {store: \"dynamodb:mcpgate-usage-cli\"}\nauth:\n  jwt: {hs256_secret_env: CLI_TEST_SECRET}\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run(t, "serve", "--config", path)
	want := `usage table "mcpgate-usage-cli" does not exist: run 'mcpgate usage init --config ` + path + `' once`
	if code != 1 || !strings.Contains(errOut, want) {
		t.Fatalf("serve without the table: exit %d, stderr:\n%s\nwant it to say %q", code, errOut, want)
	}
	if code, out, errOut := run(t, "usage", "init", "--config", path); code != 0 || !strings.Contains(out, "created the DynamoDB table") {
		t.Fatalf("usage init: exit %d: %s%s", code, out, errOut)
	}
	if code, out, errOut := run(t, "usage", "init", "--config", path); code != 0 || !strings.Contains(out, "already initialized") {
		t.Fatalf("second usage init: exit %d: %s%s", code, out, errOut)
	}
	startMain(t, io.Discard, "serve", "--config", path)
}

// check fails, naming the field, on an audit.file serve could not open
// (serve stops at once on it: TestAuditFileUnopenable), and creates none:
// the file is serve's to create.
func TestCheckRefusesAnUnopenableAuditFile(t *testing.T) {
	dir := t.TempDir()
	aFile := filepath.Join(dir, "a-file")
	existing := filepath.Join(dir, "existing.jsonl")
	for _, p := range []string{aFile, existing} {
		if err := os.WriteFile(p, []byte("{}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("E2E_SECRET", e2eSecret)
	for _, c := range []struct {
		name, file string
		ok         bool
	}{
		{"missing directory", filepath.Join(dir, "missing", "audit.jsonl"), false},
		{"parent is a file", filepath.Join(aFile, "audit.jsonl"), false},
		{"a directory", dir, false},
		{"new file", filepath.Join(dir, "new.jsonl"), true},
		{"existing file", existing, true},
		{"stdout", "-", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := filepath.Join(t.TempDir(), "mcpgate.yaml")
			yaml := fmt.Sprintf("listen: 127.0.0.1:0\nupstream: {url: http://127.0.0.1:1/mcp}\n"+
				"auth: {jwt: {hs256_secret_env: E2E_SECRET}}\naudit: {file: %q}\n", c.file)
			if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			before, _ := os.ReadDir(dir)
			code, out, stderr := run(t, "check", "--config", cfg)
			switch {
			case c.ok && (code != 0 || !strings.Contains(out, ": ok")):
				t.Fatalf("exit %d, stdout %q, stderr %q; want ok", code, out, stderr)
			case !c.ok && (code != 1 || !strings.Contains(stderr, cfg+": audit.file: ") || !strings.Contains(stderr, c.file)):
				t.Fatalf("check exit %d, stdout %q, stderr %q; want exit 1 naming audit.file %s, which serve cannot open", code, out, stderr, c.file)
			}
			if after, _ := os.ReadDir(dir); len(after) != len(before) {
				t.Errorf("check left %d entries in the directory, %d before", len(after), len(before))
			}
		})
	}
}

// A dangling symbolic link as audit.file (left by a volume not mounted):
// serve's open follows it into a missing directory, so check must refuse it.
func TestCheckAuditFileDanglingSymlink(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "audit.log")
	if err := os.Symlink(filepath.Join("missing", "audit.log"), link); err != nil {
		t.Fatal(err)
	}
	if err := checkAuditFile(link); err == nil {
		t.Error("check passed a dangling link into a missing directory")
	}
	if err := os.Mkdir(filepath.Join(dir, "missing"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := checkAuditFile(link); err != nil {
		t.Errorf("link into a directory that exists: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "missing", "audit.log")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("check created the file: %v", err)
	}
}
