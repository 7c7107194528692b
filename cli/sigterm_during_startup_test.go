package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A SIGTERM (or SIGINT) received during the start (an upstream's process
// starting, for up to the federation's 30s StartTimeout; a JWKS fetch; the
// usage store opening) stops what the start started, as the same signal
// does after it: a stdio upstream, which runs in a process group of its own
// (federate.ownGroup) and here does not exit on stdin's EOF, is stopped,
// not left running. (Once, the signal was caught only once serveUntilDone
// ran: during the start its default action killed mcpgate at once and
// orphaned the upstream.)
func TestSIGTERMDuringStartStopsStdioUpstream(t *testing.T) {
	dir := t.TempDir()
	bin := buildMcpgate(t, dir)
	pidFile := filepath.Join(dir, "upstream.pid")
	// Never answers initialize; does not read stdin.
	script := filepath.Join(dir, "up.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho $$ > "+pidFile+"\nexec sleep 600\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "mcpgate.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`listen: 127.0.0.1:0
upstreams:
  - {name: files, command: [%q]}
usage: {store: "sqlite:%s"}
auth:
  jwt: {hs256_secret_env: E2E_SECRET}
`, script, filepath.Join(dir, "usage.db"))), 0o600); err != nil {
		t.Fatal(err)
	}
	p := launchServe(t, bin, "", cfg)
	cmd, stderr := p.cmd, p.stderr
	var pid int
	for deadline := time.Now().Add(30 * time.Second); pid == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the stdio upstream did not start:\n%s", stderr.String())
		}
		if b, err := os.ReadFile(pidFile); err == nil && strings.HasSuffix(string(b), "\n") {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
	}
	defer syscall.Kill(-pid, syscall.SIGKILL) // the test's own cleanup of its group
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// gateway.New takes the context that bounds the start: the signal ends
	// the federation's start at once, and the upstream is stopped. The
	// bound below only catches a hang.
	select {
	case <-p.done:
	case <-time.After(90 * time.Second):
		t.Fatalf("mcpgate did not exit within 90s of SIGTERM during its start:\n%s", stderr.String())
	}
	t.Logf("mcpgate exit: %v; stderr:\n%s", cmd.ProcessState, stderr.String())
	// Generous: a stop in progress (stdin closed, SIGTERM, SIGKILL) would
	// be done long before.
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			return // gone
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && strings.Contains(string(b), ") Z ") {
			return // a zombie: it was stopped
		}
	}
	t.Fatalf("stdio upstream process %d still running 15s after mcpgate exited on a SIGTERM received during its start (mcpgate %v)", pid, cmd.ProcessState)
}
