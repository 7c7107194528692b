//go:build unix

package gateway

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/audit"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/metrics"
)

// A reopen behind an audit write that does not return (here: a pipe
// nobody reads, as a stalled disk) gives up after reopenWait: SIGHUP and
// POST /admin/reload run the config reload after it, which waited for the
// disk for as long as it stalled.
func TestReopenAuditBehindAStuckWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.fifo")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	rfd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(rfd)
	var logs testenv.SyncBuffer
	g := &Gateway{log: slog.New(slog.NewTextHandler(&logs, nil)), metrics: metrics.New()}
	if g.audit, err = audit.Open(path, nil); err != nil {
		t.Fatal(err)
	}
	old := reopenWait
	reopenWait = 200 * time.Millisecond
	t.Cleanup(func() { reopenWait = old })
	big := strings.Repeat("x", audit.MaxField)
	for range 200 { // far more than a pipe holds: the writer blocks
		g.audit.Log(audit.Record{Time: time.Now(), Tenant: big, Subject: big, Tool: big})
	}
	done := make(chan error, 1)
	go func() { done <- g.ReopenAudit(context.Background()) }() // as the SIGHUP handler calls it
	select {
	case err := <-done:
		if err == nil || !strings.Contains(logs.String(), "audit file not reopened") {
			t.Fatalf("ReopenAudit = %v, logs %q; want it to give up and say so", err, logs.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("ReopenAudit still waits on the stuck write after a minute")
	}
	// Drain the pipe so that the writer, and Close, can finish.
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		buf := make([]byte, 1<<16)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := syscall.Read(rfd, buf); err != nil {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	_ = g.audit.Close()
	close(stop)
	<-drained
}
