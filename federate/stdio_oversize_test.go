package federate_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
)

// oversizeEnv makes the test binary a go-sdk stdio server with tools "big"
// (an answer of 17 MiB: past the 16 MiB answer bound) and "slow", which
// creates the file "started" in the directory the variable names, then
// answers once the test creates "release" there.
const oversizeEnv = "FEDERATE_TEST_OVERSIZE_SERVER"

func init() {
	dir := os.Getenv(oversizeEnv)
	if dir == "" {
		return
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "big", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "big"}, func(ctx context.Context, req *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", 17<<20)}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "slow"}, func(ctx context.Context, req *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
		if err := os.WriteFile(filepath.Join(dir, "started"), nil, 0o600); err != nil {
			return nil, nil, err
		}
		for !exists(filepath.Join(dir, "release")) {
			time.Sleep(10 * time.Millisecond)
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "released"}}}, nil, nil
	})
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		os.Exit(1)
	}
	os.Exit(0)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, os.ErrNotExist)
}

// One tenant's call whose answer is past the answer bound (16 MiB) fails
// that call alone, at once, as on an HTTP upstream
// (TestEndlessJSONAnswerIsBounded): the stdio server's answer line is
// dropped and answered with an error for its id. Had it reached the SDK,
// it would have ended the shared session: every other tenant's call in
// flight on the process failed too, and the process restarted.
func TestStdioOversizeAnswerFailsOnlyItsCall(t *testing.T) {
	dir := t.TempDir()
	f, url := serve(t, federate.Options{
		Upstreams: []federate.Upstream{{Name: "b", Command: stdioCommand(t), Env: map[string]string{oversizeEnv: dir}, Prefix: "b__", Timeout: 20 * time.Second}},
	})
	a := connect(t, url, newClient("tenant-a", nil))
	b := connect(t, url, newClient("tenant-b", nil))
	var wg sync.WaitGroup
	var slowRes *mcp.CallToolResult
	var slowErr error
	wg.Go(func() {
		slowRes, slowErr = b.CallTool(context.Background(), &mcp.CallToolParams{Name: "b__slow", Arguments: map[string]any{}})
	})
	for !exists(filepath.Join(dir, "started")) { // b's call is in flight
		time.Sleep(10 * time.Millisecond)
	}
	res, err := a.CallTool(context.Background(), &mcp.CallToolParams{Name: "b__big", Arguments: map[string]any{}})
	if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err == nil && !res.IsError {
		t.Errorf("tenant a's oversize call succeeded")
	} else if msg := fmt.Sprint(err, res); !strings.Contains(msg, "over 16777216 bytes") {
		t.Errorf("tenant a's oversize call failed with %s, want the answer bound named", msg)
	}
	if slowErr != nil || slowRes.IsError {
		t.Errorf("tenant b's call failed because of tenant a's oversize answer: err=%v res=%+v", slowErr, slowRes)
	}
	if h := f.Health()[0]; h.Restarts != 0 {
		t.Errorf("health = %+v: the shared process was restarted", h)
	}
}
