package federate_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// wedgeEnv makes the test binary a bare stdio JSON-RPC server (serveWedged)
// that stops reading its stdin while it runs the tool stall.
const wedgeEnv = "FEDERATE_TEST_WEDGE_SERVER"

// serveWedged serves tools stall (40s, reading nothing of stdin
// meanwhile, as a single-threaded server that hangs does) and echo, one
// request at a time.
func serveWedged() {
	in := bufio.NewReader(os.Stdin)
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			return
		}
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		if json.Unmarshal(line, &m) != nil || m.ID == nil {
			continue
		}
		result := `{}`
		switch m.Method {
		case "initialize":
			result = `{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"wedge","version":"1"}}`
		case "tools/list":
			result = `{"tools":[{"name":"stall","inputSchema":{"type":"object"}},{"name":"echo","inputSchema":{"type":"object"}}]}`
		case "tools/call":
			if m.Params.Name == "stall" {
				fmt.Fprintln(os.Stderr, "stalling")
				time.Sleep(40 * time.Second)
			}
			result = `{"content":[{"type":"text","text":"done"}]}`
		}
		fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":%s}`+"\n", m.ID, result)
	}
}

// closeWithin closes f in the background and fails t if Close does not
// return within d (a hang: it must not hold the test, nor its cleanup).
func closeWithin(t *testing.T, f *federate.Federator, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		f.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Errorf("Federator.Close did not return within %v", d)
	}
}

// A stdio server that stops reading its stdin: once the pipe is full, a
// request written to it would wait forever, holding the session (every
// other call) and Federator.Close with it. The write gives up after the
// idle timeout, the process is killed and restarted, the call fails, and
// Close returns.
func TestStdioServerThatStopsReading(t *testing.T) {
	f, cs := startWedging(t, slog.New(slog.DiscardHandler), time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "w__stall"}); err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("w__stall: err = %v, want a timeout", err)
	}
	// More than the pipe holds, to a server that reads nothing.
	answered := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "w__echo", Arguments: map[string]any{"text": strings.Repeat("x", 256<<10)}})
		answered <- err
	}()
	select {
	case err := <-answered:
		if err == nil {
			t.Fatal("w__echo answered by a server that reads nothing")
		}
	case <-time.After(15 * time.Second):
		t.Fatal("w__echo got no answer: the write to the process hangs")
	}
	testenv.Eventually(t, 15*time.Second, "an answer from the restarted process", func() bool {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "w__echo", Arguments: map[string]any{"text": "x"}})
		return err == nil && !res.IsError && testenv.ToolText(res) == "done"
	})
	if h := f.Health()[0]; h.Restarts != 1 {
		t.Errorf("health = %+v, want 1 restart", h)
	}
	closeWithin(t, f, 20*time.Second)
}

// Close stops a stdio server whose session is held by a write it does not
// read, long before that write would give up (a long idle timeout): it
// does not wait for the session's calls to end.
func TestCloseStopsAServerThatStopsReading(t *testing.T) {
	var log testenv.SyncBuffer // the server's stderr
	f, cs := startWedging(t, slog.New(slog.NewTextHandler(&log, nil)), 5*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stallCtx, stop := context.WithCancel(ctx)
	stalled := make(chan struct{})
	go func() {
		defer close(stalled)
		_, _ = cs.CallTool(stallCtx, &mcp.CallToolParams{Name: "w__stall"})
	}()
	testenv.Eventually(t, 10*time.Second, "the server to stall", func() bool { return strings.Contains(log.String(), "stalling") })
	stop()
	answered := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "w__echo", Arguments: map[string]any{"text": strings.Repeat("x", 256<<10)}})
		answered <- err
	}()
	time.Sleep(time.Second) // the echo request fills the pipe
	closeWithin(t, f, 20*time.Second)
	select {
	case err := <-answered:
		if err == nil {
			t.Error("w__echo answered by a server that reads nothing")
		}
	case <-time.After(10 * time.Second):
		t.Error("w__echo got no answer after Close")
	}
	<-stalled
}

// startWedging is a Federator of one stdio upstream "w" (prefix w__) that
// stops reading its stdin on w__stall (wedgeEnv), its calls' idle timeout
// timeout, closed with the test (within 20 s), and a client connected to it.
func startWedging(t *testing.T, log *slog.Logger, timeout time.Duration) (*federate.Federator, *mcp.ClientSession) {
	t.Helper()
	f, err := federate.New(context.Background(), federate.Options{
		Logger: log,
		Upstreams: []federate.Upstream{
			{Name: "w", Command: stdioCommand(t), Env: map[string]string{wedgeEnv: "1"}, Prefix: "w__", Timeout: timeout},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeWithin(t, f, 20*time.Second) })
	ts := httptest.NewServer(f.Handler())
	t.Cleanup(ts.Close)
	return f, connect(t, ts.URL, newClient("test-client", nil))
}
