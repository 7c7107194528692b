package federate_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// marked returns the pids of the processes whose command line holds
// marker.
func marked(marker string) []int {
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []int
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte(marker)) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// A stdio server started by a wrapper that leaves a helper in its process
// group (sh -c 'helper & exec server'), the helper holding its stdout: when
// the server crashes, the call fails at once (the helper keeps stdout
// open, so its end cannot tell) and the helper is stopped; the server is
// restarted, with a new helper, which Close stops too.
func TestStdioProcessGroupIsStopped(t *testing.T) {
	testenv.RequireBinary(t, "sh")
	marker := fmt.Sprintf("federate-helper-%d-%d", os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() {
		for _, pid := range marked(marker) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	exe := stdioCommand(t)
	helper := `while :; do sleep 1; done; : ` + marker
	f, url := serve(t, federate.Options{Upstreams: []federate.Upstream{{
		Name:    "c",
		Command: []string{"sh", "-c", `sh -c '` + helper + `' & exec "$0" "$@"`, exe[0], exe[1]},
		Env:     map[string]string{stdioEnv: "c"},
		Prefix:  "c__",
		Timeout: time.Minute, // the call to the crashed server must not end by its idle timeout
	}}})
	cs := connect(t, url, newClient("test-client", nil))
	if got, _ := callText(t, cs, "c__echo", map[string]any{"text": "1"}); got != "c: 1" {
		t.Fatalf("c__echo = %q", got)
	}
	var first []int
	testenv.Eventually(t, 10*time.Second, "the helper to run", func() bool { first = marked(marker); return len(first) == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "c__crash"}); err == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("c__crash: err = %v, want the call to fail once the server exits", err)
	}
	testenv.Eventually(t, 10*time.Second, "the crashed server's helper to be stopped", func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", first[0]))
		return err != nil || !bytes.Contains(b, []byte(marker))
	})
	testenv.Eventually(t, 20*time.Second, "an answer from the restarted server", func() bool {
		got, isErr := callText(t, cs, "c__echo", map[string]any{"text": "2"})
		return got == "c: 2" && !isErr
	})
	testenv.Eventually(t, 10*time.Second, "the restarted server's helper to run", func() bool { return len(marked(marker)) == 1 })

	closeWithin(t, f, 20*time.Second)
	testenv.Eventually(t, 5*time.Second, "no helper left after Close", func() bool { return len(marked(marker)) == 0 })
}
