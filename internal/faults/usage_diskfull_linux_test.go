//go:build linux

package faults_test

import (
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"
)

// The SQLite usage file cannot grow (a full disk, simulated: the process's
// RLIMIT_FSIZE is lowered to the size of the write-ahead log, so the next
// commit's write fails with EFBIG, as a full disk fails it with ENOSPC;
// SIGXFSZ is ignored). A loop device or a small tmpfs would need
// privileges, a read-only directory does not stop writes to files already
// open, and PRAGMA max_page_count is per connection (the store's own
// connections cannot be reached). Calls go on, flushes fail and are
// counted, and once the limit is lifted the durable totals are exactly the
// admitted calls.
func TestUsageSQLiteDiskFull(t *testing.T) {
	leakCheck(t)
	e, st, path, period := meteredEnv(t, 1) // redis-server started before the limit: its process keeps its own
	wal, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	signal.Ignore(syscall.SIGXFSZ)
	defer signal.Reset(syscall.SIGXFSZ)
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	full := syscall.Rlimit{Cur: uint64(wal.Size()), Max: old.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &full); err != nil {
		t.Fatal(err)
	}
	lifted := false
	lift := func() {
		if !lifted {
			lifted = true
			if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer lift()
	before := e.metric(0, "mcpgate_usage_flush_failures_total")
	var slowest time.Duration
	for range 5 {
		slowest = max(slowest, usageLoad(t, e, "acme", 20))
		time.Sleep(150 * time.Millisecond)
	}
	failures := e.metric(0, "mcpgate_usage_flush_failures_total") - before
	stuck := durable(t, st, "acme", period)
	t.Logf("disk full (WAL capped at %d bytes): slowest call %v, flush failures %v, durable still %+v", wal.Size(), slowest, failures, stuck)
	if slowest > 2*time.Second {
		t.Errorf("a call took %v while the disk was full", slowest)
	}
	if failures == 0 || stuck.Calls != 20 {
		t.Errorf("with the disk full: %v flush failures, durable %+v; want failures and nothing written", failures, stuck)
	}
	lift()
	served := e.up.Calls("echo")
	e.stop(0)
	if got := durable(t, st, "acme", period); got.Calls != served || got.Charged != served {
		t.Fatalf("durable usage %+v after the disk was freed and the final flush; the upstream served %d", got, served)
	}
	t.Logf("durable usage == %d admitted calls", served)
}
