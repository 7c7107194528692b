package sqlite_test

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/sqlite"
	"github.com/mcpgate/mcpgate/usage/usagetest"
)

func open(t *testing.T) usage.Store {
	t.Helper()
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "usage.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) { usagetest.Run(t, open) }

func TestOpenErrors(t *testing.T) {
	for _, path := range []string{"", "a?b.db", filepath.Join(t.TempDir(), "missing-dir", "usage.db")} {
		if s, err := sqlite.Open(path); err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", path)
		}
	}
	// A file that is not a database is refused at Open, not at the first
	// flush.
	junk := filepath.Join(t.TempDir(), "junk.db")
	if err := os.WriteFile(junk, []byte("this is not an SQLite database, not at all, no"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := sqlite.Open(junk); err == nil {
		err = s.Init(t.Context())
		s.Close()
		if err == nil {
			t.Errorf("Open+Init of a non-database file succeeded")
		}
	}
}

// The gateway and the mcpgate usage command share the file: both processes'
// writes land, in WAL mode, without SQLITE_BUSY failures.
func TestTwoHandlesShareTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.db")
	a, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := usagetest.Ctx(t, 30*time.Second)
	if err := a.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(ctx); err != nil {
		t.Fatalf("second handle: Check = %v", err)
	}
	var wg sync.WaitGroup
	for i, s := range []*sqlite.Store{a, b} {
		wg.Go(func() {
			for k := int64(1); k <= 50; k++ {
				r := usage.Record{Tenant: "acme", Period: "2026-11", Usage: limit.Usage{Charged: 2*k + int64(i), Calls: k}}
				if err := s.Put(ctx, []usage.Record{r}); err != nil {
					t.Errorf("handle %d: Put: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	usagetest.Want(t, a, "acme", "2026-11", limit.Usage{Charged: 101, Calls: 50})
	var mode string
	if err := rawQuery(path, "PRAGMA journal_mode", &mode); err != nil {
		t.Fatal(err)
	}
	if mode != "wal" {
		t.Fatalf("journal_mode = %q, want wal", mode)
	}
}

func TestCheckReportsWrongSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.db")
	if err := rawExec(path, "CREATE TABLE usage (tenant TEXT, amount INTEGER)"); err != nil {
		t.Fatal(err)
	}
	s, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Check(t.Context())
	if err == nil || errors.Is(err, usage.ErrNotInitialized) {
		t.Fatalf("Check of a foreign usage table = %v, want a schema error", err)
	}
}
