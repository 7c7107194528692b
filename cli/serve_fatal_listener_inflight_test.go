package cli

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

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
// accept returns an error net/http does not retry), the final usage flush
// still waits for the calls in flight, as on the signal path
// (srv.Shutdown): the call below, charged its estimate (100) on admission,
// reports 7, and the durable store holds 7. (Once, serveUntilDone returned
// at once and the deferred g.Close flushed the estimate under the call,
// whose correction, made on a closed engine, was lost.)
func TestFatalServeErrorFlushesAfterCallsInFlightSettle(t *testing.T) {
	up := newLLMUpstream(t, &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}},
		Meta: mcp.Meta{"usage": map[string]any{"tokens": 7}}})
	db := filepath.Join(t.TempDir(), "usage.db")
	srv := serveInBackground(t, "CLI_FATAL_SECRET", fmt.Sprintf(`listen: 127.0.0.1:0
upstream: {url: %s/mcp}
usage: {store: "sqlite:%s", flush_interval: 1h}
auth:
  jwt: {hs256_secret_env: CLI_FATAL_SECRET}
tools:
  llm:
    cost: {estimate: 100, from_result: _meta.usage.tokens}
`, up.url, db))
	addr, stderr, done := srv.addr, srv.stderr, srv.done
	callDone := srv.callLLM(context.Background())
	select {
	case <-up.started:
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
	up.releaseCall()
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
