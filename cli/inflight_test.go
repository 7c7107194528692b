package cli

import (
	"context"
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

// llmUpstream is a stateless MCP upstream whose tool "llm" closes started
// when called and answers its result once release is closed: by the
// test (releaseCall), or at the test's cleanup, before the upstream
// closes (which waits for the handler).
type llmUpstream struct {
	url      string
	started  chan struct{}
	release  chan struct{}
	released bool
}

func newLLMUpstream(t *testing.T, result *mcp.CallToolResult) *llmUpstream {
	t.Helper()
	u := &llmUpstream{started: make(chan struct{}), release: make(chan struct{})}
	srvMCP := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, nil)
	mcp.AddTool(srvMCP, &mcp.Tool{Name: "llm"}, func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		close(u.started)
		<-u.release
		return result, nil, nil
	})
	upSrv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srvMCP },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true}))
	t.Cleanup(upSrv.Close)
	t.Cleanup(func() { // before upSrv.Close
		if !u.released {
			close(u.release)
		}
	})
	u.url = upSrv.URL
	return u
}

// releaseCall lets the call in flight answer.
func (u *llmUpstream) releaseCall() {
	close(u.release)
	u.released = true
}

// serving is mcpgate serve run by Main in the background.
type serving struct {
	addr   string
	stderr *testenv.SyncBuffer
	done   chan int           // Main's exit code
	stop   context.CancelFunc // SIGTERM
	token  string             // tenant t1's, with every tool in scope
}

// serveInBackground runs mcpgate serve on the config cfg, whose JWT secret
// is read from env var secretEnv (set here), and waits until it listens.
// Main is stopped at the test's cleanup, not waited for.
func serveInBackground(t *testing.T, secretEnv, cfg string) *serving {
	t.Helper()
	secret := strings.Repeat("k", 32)
	t.Setenv(secretEnv, secret)
	path := filepath.Join(t.TempDir(), "mcpgate.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s := serveConfig(t, path)
	var err error
	s.token, err = auth.SignHS256([]byte(secret), map[string]any{"tenant_id": "t1", "sub": "u", "scope": "tools:*", "exp": time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// serveConfig runs mcpgate serve on the config file at path and waits
// until it listens (token stays empty). Main is stopped at the test's
// cleanup, not waited for.
func serveConfig(t *testing.T, path string) *serving {
	t.Helper()
	s := &serving{stderr: &testenv.SyncBuffer{}, done: make(chan int, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s.stop = cancel
	go func() { s.done <- Main(ctx, []string{"serve", "--config", path}, io.Discard, s.stderr) }()
	for deadline := time.Now().Add(10 * time.Second); s.addr == ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("mcpgate did not start:\n%s", s.stderr.String())
		}
		if m := listening.FindStringSubmatch(s.stderr.String()); m != nil {
			s.addr = m[1]
		}
	}
	return s
}

// callLLM calls tool llm through s in the background, with ctx; done is
// closed once the answer is read, or the request failed.
func (s *serving) callLLM(ctx context.Context) (done <-chan struct{}) {
	callDone := make(chan struct{})
	go func() {
		defer close(callDone)
		req := mcpRequest(ctx, s.addr, s.token, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"llm","arguments":{}}}`)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	return callDone
}
