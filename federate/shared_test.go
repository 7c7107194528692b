//lint:file-ignore SA1019 the test upstreams sample and log, deprecated in MCP 2026-07-28 but still served; the federation relays them.
package federate_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// tenantEnv makes the test binary a stdio MCP server (newTenantServer)
// that goes on working for a call after answering it.
const tenantEnv = "FEDERATE_TEST_TENANT_SERVER"

// newTenantServer has tools secret (answers at once, then 300ms later logs
// "finished job for " and its text, as a server finishing a job in the
// background does) and slow (sleeps ms).
func newTenantServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "tenant", Version: "1"}, nil)
	text := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	mcp.AddTool(s, &mcp.Tool{Name: "secret"}, func(ctx context.Context, req *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
		go func() {
			time.Sleep(300 * time.Millisecond)
			_ = req.Session.Log(context.Background(), &mcp.LoggingMessageParams{Level: "info", Data: "finished job for " + a.Text})
		}()
		return text("started"), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "slow"}, func(ctx context.Context, req *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(time.Duration(a.MS) * time.Millisecond):
		}
		return text("slept"), nil, nil
	})
	return s
}

// A log message on a shared session (stdio) cannot say whose call it is
// of: one that comes while only bob's call is in flight may be alice's
// (here: her job, finishing after her answer). It goes to the gateway's
// log, naming the upstream, and never to bob.
func TestSharedSessionLogsStayInTheGateway(t *testing.T) {
	var gwlog testenv.SyncBuffer
	_, url := serve(t, federate.Options{
		Logger: slog.New(slog.NewJSONHandler(&gwlog, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Upstreams: []federate.Upstream{
			{Name: "t", Command: stdioCommand(t), Env: map[string]string{tenantEnv: "1"}, Prefix: "t__"},
		},
	})
	alice := connect(t, url, newClient("alice", nil))
	bobLogs := make(chan string, 10)
	bob := connect(t, url, newClient("bob", &mcp.ClientOptions{
		LoggingMessageHandler: func(ctx context.Context, req *mcp.LoggingMessageRequest) {
			s, _ := req.Params.Data.(string)
			bobLogs <- s
		},
	}))
	// Bob wants logs: the shared session gets his level.
	if err := bob.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
		t.Fatal(err)
	}
	if got, isErr := callText(t, alice, "t__secret", map[string]any{"text": "alice-data"}); got != "started" || isErr {
		t.Fatalf("t__secret = %q (isError %v)", got, isErr)
	}
	// Alice's job logs while bob's call is the only one in flight.
	if got, isErr := callText(t, bob, "t__slow", map[string]any{"ms": 1000}); got != "slept" || isErr {
		t.Fatalf("t__slow = %q (isError %v)", got, isErr)
	}
	// Relayed, it would have come before bob's answer (see wireCount).
	select {
	case got := <-bobLogs:
		t.Errorf("bob received a log message of the shared session: %q", got)
	default:
	}
	testenv.Eventually(t, 10*time.Second, "the gateway's log to hold alice's log message", func() bool {
		return strings.Contains(gwlog.String(), "finished job for alice-data")
	})
	for _, line := range strings.Split(gwlog.String(), "\n") {
		if strings.Contains(line, "finished job for alice-data") && !strings.Contains(line, `"upstream":"t"`) {
			t.Errorf("the gateway's log line does not name the upstream: %s", line)
		}
	}
	if len(bobLogs) != 0 {
		t.Errorf("bob received a log message of the shared session: %q", <-bobLogs)
	}
}

// On a shared session (stdio) a server-to-client request cannot say whose
// call it is for: it is refused, even while the only call in flight is
// the asking client's, and no client is asked.
func TestSharedSessionRequestsAreRefused(t *testing.T) {
	var asked atomic.Int64
	_, url := serve(t, federate.Options{Upstreams: []federate.Upstream{
		{Name: "c", Command: stdioCommand(t), Env: map[string]string{stdioEnv: "c"}, Prefix: "c__"},
	}})
	bob := connect(t, url, newClient("bob", &mcp.ClientOptions{
		CreateMessageHandler: func(ctx context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			asked.Add(1)
			return &mcp.CreateMessageResult{Role: "assistant", Model: "m", Content: &mcp.TextContent{Text: "bob's"}}, nil
		},
	}))
	got, isErr := callText(t, bob, "c__sample", map[string]any{"text": "q"})
	if !isErr || strings.Contains(got, "sampled") {
		t.Errorf("sampling on the shared session: %q (isError %v), want a refusal", got, isErr)
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("bob was asked %d sampling requests of the shared session", n)
	}
}

// A client without a session (MCP before 2026-07-28, whose requests the
// Federator serves statelessly) hangs up during a call: the call, on the
// upstream's shared session, is cancelled there (notifications/cancelled)
// rather than run to its end for nobody.
func TestSessionlessHangUpCancelsTheUpstreamCall(t *testing.T) {
	a := startHTTPUpstream(t, "a", nil)
	_, url := serve(t, federate.Options{Upstreams: []federate.Upstream{{Name: "a", URL: a.URL(), Prefix: "a__"}}})
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a__slow","arguments":{"ms":30000}}}`
	ctx, hangUp := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	testenv.Eventually(t, waitLong, "the call to reach a", func() bool { return a.calls.get("slow") == 1 })
	hangUp()
	<-done
	testenv.Eventually(t, waitLong, "a to see the call cancelled", func() bool { return a.calls.get("slow-cancelled") == 1 })
}
