package federate_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// longStderrEnv makes the test binary a go-sdk stdio server whose tool
// "spew" writes one stderr line of 100 KiB (a stack trace, a dumped
// request), then 256 KiB of ordinary stderr lines (four times what a pipe
// holds), and answers.
const longStderrEnv = "FEDERATE_TEST_LONG_STDERR_SERVER"

func init() {
	if os.Getenv(longStderrEnv) == "" {
		return
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "spew", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "spew"}, func(ctx context.Context, req *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
		fmt.Fprintln(os.Stderr, strings.Repeat("y", 100<<10))
		line := strings.Repeat("z", 1023)
		for range 256 {
			fmt.Fprintln(os.Stderr, line)
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "spewed"}}}, nil, nil
	})
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		os.Exit(1)
	}
	os.Exit(0)
}

// A stdio server's stderr is read to its end whatever its lines' length: a
// reader that stopped at a long line (bufio.Scanner's ErrTooLong) would
// leave the pipe full, the server blocked writing its logs, and every call
// to it timing out, with the process never restarted. The long line is
// logged cut, its rest dropped.
func TestStdioLongStderrLineDoesNotWedgeTheServer(t *testing.T) {
	logs := &testenv.SyncBuffer{}
	_, url := serve(t, federate.Options{
		Logger:    slog.New(slog.NewTextHandler(logs, nil)),
		Upstreams: []federate.Upstream{{Name: "s", Command: stdioCommand(t), Env: map[string]string{longStderrEnv: "1"}, Prefix: "s__", Timeout: 5 * time.Second}},
	})
	cs := connect(t, url, newClient("test-client", nil))
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "s__spew", Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Fatalf("s__spew: err=%v res=%+v", err, res)
	}
	// The server answered after writing its lines, all but the last
	// pipeful of them read: the long one was logged.
	text := logs.String()
	if n := strings.Count(text, "cut_at=65536"); n != 1 {
		t.Errorf("%d stderr lines logged cut, want 1 (the long line's start; its rest dropped)", n)
	}
	if !strings.Contains(text, "line="+strings.Repeat("z", 1023)+"\n") {
		t.Error("the ordinary stderr lines after the long one were not logged")
	}
}
