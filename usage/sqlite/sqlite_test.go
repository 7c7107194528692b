package sqlite_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/sqlite"
	"github.com/mcpgate/mcpgate/usage/usagetest"
)

// open returns a store whose file had its schema taken away after Open, as
// the conformance suite wants a store that is not initialized: Open itself
// never returns one.
func open(t *testing.T) usage.Store {
	t.Helper()
	path := filepath.Join(t.TempDir(), "usage.db")
	s, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := rawExec(path, "DROP TABLE usage; PRAGMA user_version = 0"); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) { usagetest.Run(t, open) }

// A new file is ready as soon as Open returns: no Init.
func TestOpenCreatesTheSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.db")
	s, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if m := s.Migration(); m != (sqlite.Migration{From: 0, To: sqlite.SchemaVersion, Created: true}) {
		t.Fatalf("Migration() = %+v, want a creation", m)
	}
	ctx := usagetest.Ctx(t, 30*time.Second)
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check right after Open: %v", err)
	}
	r := usage.Record{Tenant: "acme", Period: "2026-11", Usage: limit.Usage{Charged: 3, Calls: 3}}
	if err := s.Put(ctx, []usage.Record{r}); err != nil {
		t.Fatalf("Put right after Open: %v", err)
	}
	usagetest.Want(t, s, "acme", "2026-11", r.Usage)
	if v := fileVersion(t, path); v != sqlite.SchemaVersion {
		t.Fatalf("user_version = %d, want %d", v, sqlite.SchemaVersion)
	}
	// Opening it again changes nothing.
	again, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if m := again.Migration(); m != (sqlite.Migration{From: sqlite.SchemaVersion, To: sqlite.SchemaVersion}) {
		t.Fatalf("second Open: Migration() = %+v, want no change", m)
	}
	usagetest.Want(t, again, "acme", "2026-11", r.Usage)
}

// Gateways started together on a new file all open it.
func TestConcurrentOpensOfANewFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.db")
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		created int
	)
	for range 4 {
		wg.Go(func() {
			s, err := sqlite.Open(path)
			if err != nil {
				t.Error(err)
				return
			}
			defer s.Close()
			if err := s.Check(t.Context()); err != nil {
				t.Error(err)
			}
			if s.Migration().From == 0 {
				mu.Lock()
				created++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if created < 1 {
		t.Fatal("no Open found the file new")
	}
	if v := fileVersion(t, path); v != sqlite.SchemaVersion {
		t.Fatalf("user_version = %d, want %d", v, sqlite.SchemaVersion)
	}
}

// testdata/usage-init-unversioned.db was made by the code from before
// schema versions (sqlite.Open, Init, one Put of acme 2026-11, Close): the
// file every existing deployment holds. Open adopts it, keeps its data and
// stamps the version.
func TestOpenUpgradesAFileFromBeforeVersioning(t *testing.T) {
	path := copyFixture(t, "usage-init-unversioned.db")
	if v := fileVersion(t, path); v != 0 {
		t.Fatalf("fixture user_version = %d, want 0", v)
	}
	s, err := sqlite.Open(path)
	if err != nil {
		t.Fatalf("Open of a file made by mcpgate usage init before versioning: %v", err)
	}
	defer s.Close()
	if m := s.Migration(); m != (sqlite.Migration{From: 0, To: sqlite.SchemaVersion}) {
		t.Fatalf("Migration() = %+v, want an upgrade from 0", m)
	}
	ctx := usagetest.Ctx(t, 30*time.Second)
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	old := limit.Usage{Charged: 260, Refunded: 10, Calls: 42, RefundedCalls: 2}
	rec := usagetest.Want(t, s, "acme", "2026-11", old)
	if want := time.Date(2026, 11, 20, 8, 30, 0, 0, time.UTC); !rec.UpdatedAt.Equal(want) {
		t.Fatalf("UpdatedAt = %v, want %v", rec.UpdatedAt, want)
	}
	// Flushes keep their semantics on the adopted table.
	higher := limit.Usage{Charged: 300, Refunded: 10, Calls: 50, RefundedCalls: 2}
	if err := s.Put(ctx, []usage.Record{{Tenant: "acme", Period: "2026-11", Usage: higher}, {Tenant: "acme", Period: "2026-11", Usage: old}}); err != nil {
		t.Fatal(err)
	}
	usagetest.Want(t, s, "acme", "2026-11", higher)
	if v := fileVersion(t, path); v != sqlite.SchemaVersion {
		t.Fatalf("user_version = %d after the upgrade, want %d", v, sqlite.SchemaVersion)
	}
}

// A file a newer mcpgate migrated is refused, by Open and by Check, and left
// as it is.
func TestNewerSchemaIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.db")
	s, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := usagetest.Ctx(t, 30*time.Second)
	if err := s.Put(ctx, []usage.Record{{Tenant: "acme", Period: "2026-11", Usage: limit.Usage{Charged: 1, Calls: 1}}}); err != nil {
		t.Fatal(err)
	}
	newer := sqlite.SchemaVersion + 1
	if err := rawExec(path, fmt.Sprintf("PRAGMA user_version = %d", newer)); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); !errors.Is(err, sqlite.ErrSchemaTooNew) {
		t.Fatalf("Check of a newer file = %v, want ErrSchemaTooNew", err)
	}
	if err := s.Init(ctx); !errors.Is(err, sqlite.ErrSchemaTooNew) {
		t.Fatalf("Init of a newer file = %v, want ErrSchemaTooNew", err)
	}
	if s2, err := sqlite.Open(path); !errors.Is(err, sqlite.ErrSchemaTooNew) {
		if err == nil {
			s2.Close()
		}
		t.Fatalf("Open of a newer file = %v, want ErrSchemaTooNew", err)
	} else if !strings.Contains(err.Error(), fmt.Sprintf("version %d", newer)) {
		t.Fatalf("the error does not name the file's version: %v", err)
	}
	if v := fileVersion(t, path); v != newer {
		t.Fatalf("user_version = %d after the refusals, want %d", v, newer)
	}
}

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

// An in-memory database is a database of each pooled connection's own: the
// schema Open made would be on one connection only (another answers "no
// such table"), and what was Put would vanish when database/sql closes
// that connection. Open refuses it, saying to use a file path.
func TestOpenRefusesInMemoryDatabases(t *testing.T) {
	for _, path := range []string{":memory:", "file::memory:", "file:", "file://"} {
		s, err := sqlite.Open(path)
		if err == nil {
			s.Close()
		}
		if !errors.Is(err, sqlite.ErrInMemory) || !strings.Contains(err.Error(), "file path") {
			t.Errorf("Open(%q) = %v, want an error wrapping ErrInMemory that says to use a file path", path, err)
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

// Opening a file that is up to date takes no write lock: while another
// process holds it past the busy timeout (a long flush, a backup), a
// gateway still starts and mcpgate usage still reads, without waiting.
func TestOpenOfAnUpToDateFileWhileAnotherProcessWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.db")
	s, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := usagetest.Ctx(t, 30*time.Second)
	r := usage.Record{Tenant: "acme", Period: "2026-11", Usage: limit.Usage{Charged: 3, Calls: 3}}
	if err := s.Put(ctx, []usage.Record{r}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	holdWriteLock(t, path, 0)

	start := time.Now()
	ro, err := sqlite.Open(path)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Open of an up-to-date file while another process writes failed after %v: %v", took.Round(time.Millisecond), err)
	}
	defer ro.Close()
	if took > time.Second {
		t.Fatalf("Open of an up-to-date file waited %v for the write lock", took.Round(time.Millisecond))
	}
	if err := ro.Check(ctx); err != nil {
		t.Fatalf("Check while another process writes: %v", err)
	}
	usagetest.Want(t, ro, "acme", "2026-11", r.Usage)
}

// A file that needs a migration waits for another process's write lock as
// long as OpenContext's context allows, not only the busy timeout: a gateway
// started while the file is locked for longer still starts.
func TestOpenMigratesOnceTheWriteLockIsReleased(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.db")
	held := sqlite.BusyTimeout + 1500*time.Millisecond
	holdWriteLock(t, path, held)
	start := time.Now()
	s, err := sqlite.OpenContext(usagetest.Ctx(t, 30*time.Second), path)
	if err != nil {
		t.Fatalf("Open of a new file locked for %v failed after %v: %v", held, time.Since(start).Round(time.Millisecond), err)
	}
	defer s.Close()
	if m := s.Migration(); !m.Created || m.To != sqlite.SchemaVersion {
		t.Fatalf("Migration() = %+v, want a creation", m)
	}
	if v := fileVersion(t, path); v != sqlite.SchemaVersion {
		t.Fatalf("user_version = %d, want %d", v, sqlite.SchemaVersion)
	}
}

// A usage table of another program is neither adopted nor overwritten.
func TestForeignUsageTableIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.db")
	if err := rawExec(path, "CREATE TABLE usage (tenant TEXT, amount INTEGER)"); err != nil {
		t.Fatal(err)
	}
	s, err := sqlite.Open(path)
	if err == nil {
		s.Close()
		t.Fatal("Open of a file with a foreign usage table succeeded")
	}
	if !errors.Is(err, sqlite.ErrUnexpectedSchema) || errors.Is(err, usage.ErrNotInitialized) {
		t.Fatalf("Open of a foreign usage table = %v, want ErrUnexpectedSchema", err)
	}
	if v := fileVersion(t, path); v != 0 {
		t.Fatalf("user_version = %d, want the file left at 0", v)
	}
	// Nor is one swapped in after Open.
	path = filepath.Join(t.TempDir(), "usage.db")
	if s, err = sqlite.Open(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := rawExec(path, "DROP TABLE usage; CREATE TABLE usage (tenant TEXT, amount INTEGER)"); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(t.Context()); !errors.Is(err, sqlite.ErrUnexpectedSchema) {
		t.Fatalf("Check of a foreign usage table = %v, want ErrUnexpectedSchema", err)
	}
}

func fileVersion(t *testing.T, path string) int {
	t.Helper()
	var v int
	if err := rawQuery(path, "PRAGMA user_version", &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// copyFixture copies testdata/name into a temporary directory (Open writes
// to the file it upgrades) and returns the copy.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "usage.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
