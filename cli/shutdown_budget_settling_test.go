package cli

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
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
	up := newLLMUpstream(t, &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}) // a slow load (under upstream.timeout, 60 s by default)
	srv := serveInBackground(t, "CLI_BUDGET_SECRET", fmt.Sprintf(`listen: 127.0.0.1:0
upstream: {url: %s/mcp}
usage: {store: "sqlite:%s", flush_interval: 1h}
auth:
  jwt: {hs256_secret_env: CLI_BUDGET_SECRET}
tools:
  llm:
    cache: {ttl: 10m}
`, up.url, filepath.Join(t.TempDir(), "usage.db")))
	stderr, done, cancel := srv.stderr, srv.done, srv.stop
	callCtx, hangUp := context.WithCancel(context.Background())
	callDone := srv.callLLM(callCtx)
	<-up.started
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
	up.releaseCall() // serve returns once the load ends (Stores.Close waits for it)
	<-done
}
