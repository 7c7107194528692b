package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/internal/testenv"
	usagestore "github.com/mcpgate/mcpgate/usage"
)

// breakListener finds this process's listening socket bound to port and
// shuts it down: a blocked accept(2) then fails with EINVAL, an error
// net/http does not retry (as ENOMEM or ENOBUFS from accept would), so
// http.Server.Serve returns it.
func breakListener(t *testing.T, port int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		testenv.Missing(t, "no /proc/self/fd: "+err.Error())
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if v, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN); err != nil || v != 1 {
			continue
		}
		sa, err := syscall.Getsockname(fd)
		if err != nil {
			continue
		}
		var p int
		switch a := sa.(type) {
		case *syscall.SockaddrInet4:
			p = a.Port
		case *syscall.SockaddrInet6:
			p = a.Port
		}
		if p == port {
			if err := syscall.Shutdown(fd, syscall.SHUT_RD); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no listening socket on port %d", port)
}

// When http.Server.Serve fails after the engine started (the listener's
// accept returns an error net/http does not retry), serveUntilDone returns
// at once: no srv.Shutdown, so the calls in flight are not waited for, and
// the deferred g.Close runs the final usage flush under them. The call
// below was charged its estimate (100) on admission; its result reports 7.
// On the signal path (srv.Shutdown) the flush waits for the call and the
// store holds 7; on the fatal path it holds the estimate and the
// correction, made after the flush on a closed engine, is lost.
func TestFatalServeErrorFlushesBeforeCallsInFlightSettle(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	srvMCP := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, nil)
	mcp.AddTool(srvMCP, &mcp.Tool{Name: "llm"}, func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		close(started)
		<-release
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}},
			Meta: mcp.Meta{"usage": map[string]any{"tokens": 7}}}, nil, nil
	})
	upSrv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srvMCP },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true}))
	defer upSrv.Close()
	var released bool
	defer func() {
		if !released {
			close(release)
		}
	}()

	secret := strings.Repeat("k", 32)
	t.Setenv("CLI_FATAL_SECRET", secret)
	dir := t.TempDir()
	db := filepath.Join(dir, "usage.db")
	path := filepath.Join(dir, "mcpgate.yaml")
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
upstream: {url: %s/mcp}
usage: {store: "sqlite:%s", flush_interval: 1h}
auth:
  jwt: {hs256_secret_env: CLI_FATAL_SECRET}
tools:
  llm:
    cost: {estimate: 100, from_result: _meta.usage.tokens}
`, upSrv.URL, db)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	stderr := &testenv.SyncBuffer{}
	done := make(chan int, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- Main(ctx, []string{"serve", "--config", path}, io.Discard, stderr) }()
	var addr string
	for deadline := time.Now().Add(10 * time.Second); addr == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m := listening.FindStringSubmatch(stderr.String()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatalf("mcpgate did not start:\n%s", stderr.String())
	}
	token, err := auth.SignHS256([]byte(secret), map[string]any{"tenant_id": "t1", "sub": "u", "scope": "tools:*", "exp": time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	callDone := make(chan struct{})
	go func() {
		defer close(callDone)
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/mcp",
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
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatalf("the call did not reach the upstream:\n%s", stderr.String())
	}
	_, portStr, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portStr)
	breakListener(t, port)

	// Give serve the chance to wait for the call (as its signal path
	// does); the assertion below is on the durable total, not on time.
	returned := false
	select {
	case <-done:
		returned = true
		t.Logf("mcpgate serve returned while the call was still in flight:\n%s", stderr.String())
	case <-time.After(5 * time.Second):
	}
	close(release)
	released = true
	<-callDone
	if !returned {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("mcpgate serve did not return within 30s")
		}
	}
	u := durableTotal(t, db, "t1", usagestore.Period(time.Now()))
	if u.Used() != 7 {
		t.Fatalf("durable usage after a fatal serve error: used %d (charged %d, refunded %d), want 7: the final flush ran before the call in flight settled", u.Used(), u.Charged, u.Refunded)
	}
}
