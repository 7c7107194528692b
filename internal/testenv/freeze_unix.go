//go:build unix

package testenv

import (
	"syscall"
	"testing"
)

// Freeze stops the server process (SIGSTOP): it keeps its port and its
// connections, the kernel still accepts new ones, and nothing is answered,
// as with a hung server or a network partition that drops packets. In a
// Cluster the other nodes fail a frozen master over after
// cluster-node-timeout. The returned thaw (SIGCONT) is idempotent and also
// runs when the test ends; Kill and Restart work on a frozen server.
func (r *Redis) Freeze(tb testing.TB) (thaw func()) {
	tb.Helper()
	r.mu.Lock()
	p := r.proc
	r.mu.Unlock()
	if p == nil {
		tb.Fatalf("testenv: freeze redis-server on %s: not running", r.Addr)
	}
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		tb.Fatalf("testenv: SIGSTOP redis-server on %s: %v", r.Addr, err)
	}
	thaw = func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) }
	tb.Cleanup(thaw)
	return thaw
}
