package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// deployBudget is what a stopping pod has between SIGTERM and SIGKILL in
// deploy/kubernetes/deployment.yaml: terminationGracePeriodSeconds (30 s)
// minus the preStop sleep (5 s). docs/deploy.md: "A stopping instance
// finishes the calls in flight for up to 15 s and flushes usage: give it
// more than that (terminationGracePeriodSeconds: 30)".
const deployBudget = 25 * time.Second

// A cached tool's load whose caller left (it hung up, or srv.Close cut it
// at the end of shutdownGrace) keeps a settling ticket: after srv.Shutdown
// (up to 15 s), Gateway.Close waits for it before the final usage flush.
// That wait must leave the flush within the deployment's budget, or the pod
// is SIGKILLed first and the usage of every tenant not yet flushed (up to
// usage.flush_interval of it) is lost with the in-process store. Here the
// caller leaves before SIGTERM, so srv.Shutdown returns at once and the
// settle wait alone (30 s before the fix, 5 s after) decides.
func TestShutdownFlushesWithinTheDeploymentBudget(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	srvMCP := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, nil)
	mcp.AddTool(srvMCP, &mcp.Tool{Name: "llm"}, func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		close(started)
		<-release // a slow load (under upstream.timeout, 60 s by default)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
	})
	upSrv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srvMCP },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true}))
	defer upSrv.Close()
	released := false
	defer func() { // before upSrv.Close, which waits for the handler
		if !released {
			close(release)
		}
	}()

	secret := strings.Repeat("k", 32)
	t.Setenv("CLI_BUDGET_SECRET", secret)
	dir := t.TempDir()
	path := filepath.Join(dir, "mcpgate.yaml")
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
upstream: {url: %s/mcp}
usage: {store: "sqlite:%s", flush_interval: 1h}
auth:
  jwt: {hs256_secret_env: CLI_BUDGET_SECRET}
tools:
  llm:
    cache: {ttl: 10m}
`, upSrv.URL, filepath.Join(dir, "usage.db"))
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	stderr := &testenv.SyncBuffer{}
	done := make(chan int, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- Main(ctx, []string{"serve", "--config", path}, io.Discard, stderr) }()
	var addr string
	for deadline := time.Now().Add(10 * time.Second); addr == ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("mcpgate did not start:\n%s", stderr.String())
		}
		if m := listening.FindStringSubmatch(stderr.String()); m != nil {
			addr = m[1]
		}
	}
	token, err := auth.SignHS256([]byte(secret), map[string]any{"tenant_id": "t1", "sub": "u", "scope": "tools:*", "exp": time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	callCtx, hangUp := context.WithCancel(context.Background())
	callDone := make(chan struct{})
	go func() {
		defer close(callDone)
		req, _ := http.NewRequestWithContext(callCtx, http.MethodPost, "http://"+addr+"/mcp",
			strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"llm","arguments":{}}}`))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", "2025-06-18")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	<-started
	hangUp() // the caller leaves; its cached load goes on
	<-callDone
	time.Sleep(200 * time.Millisecond) // the gateway sees the caller gone

	sigterm := time.Now()
	cancel()
	for !strings.Contains(stderr.String(), "usage: final flush done") {
		if time.Since(sigterm) > 2*deployBudget {
			t.Fatalf("no final flush within %v of SIGTERM:\n%s", 2*deployBudget, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	took := time.Since(sigterm)
	if took > deployBudget {
		t.Errorf("the final usage flush ran %v after SIGTERM, past the %v a pod has before SIGKILL (deploy/kubernetes): it would never run\n%s",
			took.Round(time.Second), deployBudget, stderr.String())
	}
	close(release) // serve returns once the load ends (Stores.Close waits for it)
	released = true
	<-done
}
