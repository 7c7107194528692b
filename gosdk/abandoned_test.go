package gosdk_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
)

// A client that goes away mid-call (its POST closed, no
// notifications/cancelled): as behind the gateway, which cancels it
// upstream (gateway/upstream_msg.go cancelAbandoned), the call is
// cancelled under gosdk.CancelAbandoned, settled Abandoned, and its
// concurrency slot freed, where the SDK's stateful handler would run it to
// its end and the client's retry be refused meanwhile. The same under the
// SDK's stateless handler (MCP 2026-07-28), which, without
// PropagateRequestCancellation, runs it to its end too.
func TestDisconnectedCallFreesItsSlot(t *testing.T) {
	t.Parallel()
	for _, stateless := range []bool{false, true} {
		t.Run(map[bool]string{false: "stateful", true: "stateless"}[stateless], func(t *testing.T) {
			t.Parallel()
			disconnectedCallFreesItsSlot(t, stateless)
		})
	}
}

func disconnectedCallFreesItsSlot(t *testing.T, stateless bool) {
	settled := make(chan enforce.Status, 16)
	s := newServer(t, false, `
tools:
  slow:
    limits:
      - {name: one_at_a_time, per: tenant_tool, algorithm: concurrency, limit: 1, period: 10m}
`, options{stateless: stateless, settled: func(tool string, st enforce.Status) {
		if tool == "slow" {
			settled <- st
		}
	}})
	release := make(chan struct{}) // closed at the test's end only: the call runs until cancelled
	s.setRelease(release)
	t.Cleanup(func() { close(release) }) // runs before the server's cleanups
	tok := token(t, "gone-co", "alice")
	cs := s.connect(tok)
	ctx, cancel := context.WithCancel(context.Background())
	params := `{"name":"slow","arguments":{"key":"gone"}}`
	if stateless { // MCP 2026-07-28: what a session said is in every request
		v := cs.InitializeResult().ProtocolVersion
		params = `{"name":"slow","arguments":{"key":"gone"},"_meta":{"io.modelcontextprotocol/protocolVersion":"` + v +
			`","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"}}}`
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url, strings.NewReader(
		`{"jsonrpc":"2.0","id":77,"method":"tools/call","params":`+params+`}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", cs.InitializeResult().ProtocolVersion)
	if cs.ID() != "" {
		req.Header.Set("Mcp-Session-Id", cs.ID())
	}
	if stateless {
		req.Header.Set("Mcp-Method", "tools/call")
		req.Header.Set("Mcp-Name", "slow")
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			t.Logf("DEBUG %d %s", resp.StatusCode, b)
			resp.Body.Close()
		}
	}()
	select {
	case <-s.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow call never started")
	}
	cancel() // the client goes away
	s.setRelease(nil)
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = call(cctx, cs, "slow", map[string]any{"key": "retry", "ms": 0})
		ccancel()
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("5s after its client went away, the abandoned call still holds its slot: %v", err)
	}
	if st := <-settled; st != enforce.Abandoned {
		t.Fatalf("the call whose client went away was settled %v, want Abandoned (%v)", st, enforce.Abandoned)
	}
}
