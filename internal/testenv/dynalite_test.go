package testenv

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// dynamo sends one DynamoDB JSON request. dynalite checks that a signature
// is present and well formed, not that it is valid.
func dynamo(t *testing.T, endpoint, op, body string) (int, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+"/", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	req.Header.Set("X-Amz-Target", "DynamoDB_20120810."+op)
	req.Header.Set("X-Amz-Date", time.Now().UTC().Format("20060102T150405Z"))
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKIDTEST/"+time.Now().UTC().Format("20060102")+
		"/us-east-1/dynamodb/aws4_request, SignedHeaders=host;x-amz-date, Signature=0000")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

func TestDynaliteKillRestartKeepsData(t *testing.T) {
	d := StartDynaliteServer(t)
	if !strings.HasPrefix(d.Endpoint, "http://127.0.0.1:") || !d.Running() {
		t.Fatalf("endpoint %q, running %v", d.Endpoint, d.Running())
	}
	code, body, err := dynamo(t, d.Endpoint, "CreateTable", `{"TableName":"tbl1",
		"AttributeDefinitions":[{"AttributeName":"k","AttributeType":"S"}],
		"KeySchema":[{"AttributeName":"k","KeyType":"HASH"}],"BillingMode":"PAY_PER_REQUEST"}`)
	if err != nil || code != http.StatusOK {
		t.Fatalf("CreateTable: %d %s %v", code, body, err)
	}

	d.Kill(t)
	if d.Running() {
		t.Fatal("running after Kill")
	}
	if _, _, err := dynamo(t, d.Endpoint, "ListTables", `{}`); err == nil {
		t.Fatal("a killed dynalite answered")
	}
	d.Kill(t) // idempotent

	d.Restart(t)
	code, body, err = dynamo(t, d.Endpoint, "ListTables", `{}`)
	if err != nil || code != http.StatusOK || !strings.Contains(body, `"tbl1"`) {
		t.Fatalf("ListTables after Restart: %d %s %v (the table must survive)", code, body, err)
	}
}

func TestStartDynaliteTwice(t *testing.T) {
	a, b := StartDynalite(t), StartDynalite(t)
	if a == b {
		t.Fatalf("two servers on one endpoint %s", a)
	}
	for _, e := range []string{a, b} {
		if err := healthy(http.DefaultClient, e); err != nil {
			t.Fatalf("%s: %v", e, err)
		}
	}
}

// Without the npm install, CI fails loudly and a developer's run skips with
// the command to run.
func TestDynaliteMissingInstall(t *testing.T) {
	ci := os.Getenv("CI") // before this test sets CI itself
	missing := t.TempDir()
	t.Setenv("CI", "true")
	rec := runRecorded(t, func(tb testing.TB) { requireDynalite(tb, missing) })
	if rec.fatal == "" || rec.skip != "" || !strings.Contains(rec.fatal, "npm ci --prefix "+missing) {
		t.Errorf("CI=true, no dynalite: fatal=%q skip=%q, want a failure naming the install command", rec.fatal, rec.skip)
	}
	t.Setenv("CI", "")
	rec = runRecorded(t, func(tb testing.TB) { requireDynalite(tb, missing) })
	if rec.skip == "" || rec.fatal != "" || !strings.Contains(rec.skip, "CI never skips") {
		t.Errorf("CI unset, no dynalite: fatal=%q skip=%q, want a skip", rec.fatal, rec.skip)
	}

	var cli string
	t.Setenv("CI", ci)
	rec = runRecorded(t, func(tb testing.TB) { cli = requireDynalite(tb, dynaliteDir()) })
	if rec.skip != "" {
		Missing(t, "dynalite not installed: npm ci --prefix "+dynaliteDir())
	}
	if rec.fatal != "" || !strings.HasSuffix(cli, filepath.Join("dynalite", "cli.js")) {
		t.Fatalf("installed dynalite: cli=%q fatal=%q", cli, rec.fatal)
	}
}

// A client that hangs up on a request in flight (a cancelled context, a
// read deadline under load) does not kill dynalite, whose request handler
// throws on it (dynalite 4.0.0, index.js: req.on('error', ... throw err)):
// a real DynamoDB shrugs it off, and a test whose emulator died would
// blame the code under test.
func TestDynaliteSurvivesAClientHangingUp(t *testing.T) {
	d := StartDynaliteServer(t)
	c, err := net.Dial("tcp", strings.TrimPrefix(d.Endpoint, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-amz-json-1.0\r\n" +
		"X-Amz-Target: DynamoDB_20120810.ListTables\r\nContent-Length: 100\r\n\r\n{\"Lim"))
	time.Sleep(100 * time.Millisecond) // the request is being read
	c.Close()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if !d.Running() {
			out, _ := os.ReadFile(filepath.Join(d.Dir, "stdout.log"))
			t.Fatalf("dynalite died after a client hung up on a request:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	resp, err := http.Post(d.Endpoint, "application/x-amz-json-1.0", strings.NewReader("{}"))
	if err != nil {
		t.Fatalf("dynalite no longer answers after a client hung up: %v", err)
	}
	resp.Body.Close()
}
