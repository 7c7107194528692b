package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"sync"
	"testing"
)

func TestMigrationsAreNumberedInOrder(t *testing.T) {
	if len(migrations) != SchemaVersion {
		t.Fatalf("%d migrations, SchemaVersion %d", len(migrations), SchemaVersion)
	}
	for i, m := range migrations {
		if m.version != i+1 {
			t.Fatalf("migrations[%d] has version %d, want %d", i, m.version, i+1)
		}
	}
}

// openDB opens path with Open (so at SchemaVersion) and returns its
// handle, closed when t ends.
func openDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s.db
}

func version(t *testing.T, db *sql.DB) int {
	t.Helper()
	v, err := userVersion(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func count(t *testing.T, db *sql.DB, query string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), query).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// history is the real migrations followed by two made up here: each logs
// itself in a table, so that the test sees how often it ran.
func history(fail2 bool) []migration {
	ms := append([]migration(nil), migrations...)
	logRun := func(name string) func(ctx context.Context, tx *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO ran (name) VALUES (?)`, name)
			return err
		}
	}
	ms = append(ms, migration{version: len(ms) + 1, name: "log table", apply: func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `CREATE TABLE ran (name TEXT)`); err != nil {
			return err
		}
		return logRun("a")(ctx, tx)
	}})
	second := logRun("b")
	if fail2 {
		second = func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `CREATE TABLE half_done (x)`); err != nil {
				return err
			}
			if err := logRun("b")(ctx, tx); err != nil {
				return err
			}
			return errors.New("migration failed half way")
		}
	}
	return append(ms, migration{version: len(ms) + 1, name: "second", apply: second})
}

func TestMigrateAppliesEachOnceInOrder(t *testing.T) {
	db := openDB(t, filepath.Join(t.TempDir(), "usage.db"))
	ms := history(false)
	for range 3 {
		if _, err := migrate(t.Context(), db, ms); err != nil {
			t.Fatal(err)
		}
	}
	if v := version(t, db); v != len(ms) {
		t.Fatalf("version %d, want %d", v, len(ms))
	}
	if n := count(t, db, `SELECT count(*) FROM ran`); n != 2 {
		t.Fatalf("%d migration runs logged, want 2 (each once)", n)
	}
	from, err := migrate(t.Context(), db, ms)
	if err != nil || from != len(ms) {
		t.Fatalf("migrate of an up-to-date file = %d, %v", from, err)
	}
}

// A migration that fails leaves nothing of itself behind and the version
// where it was; the ones before it stay applied.
func TestMigrateRollsBackAFailedStep(t *testing.T) {
	db := openDB(t, filepath.Join(t.TempDir(), "usage.db"))
	_, err := migrate(t.Context(), db, history(true))
	if err == nil {
		t.Fatal("migrate with a failing migration succeeded")
	}
	if v := version(t, db); v != SchemaVersion+1 {
		t.Fatalf("version %d after the failure, want %d", v, SchemaVersion+1)
	}
	if n := count(t, db, `SELECT count(*) FROM sqlite_master WHERE name = 'half_done'`); n != 0 {
		t.Fatal("the failed migration's table was kept")
	}
	if n := count(t, db, `SELECT count(*) FROM ran`); n != 1 {
		t.Fatalf("%d runs logged, want 1 (the failed one rolled back)", n)
	}
	// Fixed, it runs once.
	if _, err := migrate(t.Context(), db, history(false)); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT count(*) FROM ran`); n != 2 {
		t.Fatalf("%d runs logged, want 2", n)
	}
}

// Processes opening one file at once (a gateway starting while mcpgate usage
// runs) apply each migration once between them.
func TestMigrateConcurrently(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.db")
	const n = 4
	dbs := make([]*sql.DB, n)
	for i := range dbs {
		dbs[i] = openDB(t, path)
	}
	ms := history(false)
	var wg sync.WaitGroup
	for _, db := range dbs {
		wg.Go(func() {
			if _, err := migrate(context.Background(), db, ms); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := count(t, dbs[0], `SELECT count(*) FROM ran`); got != 2 {
		t.Fatalf("%d migration runs logged by %d concurrent migrations, want 2", got, n)
	}
}

func TestMigrateRefusesANewerFile(t *testing.T) {
	db := openDB(t, filepath.Join(t.TempDir(), "usage.db"))
	if _, err := migrate(t.Context(), db, history(false)); err != nil {
		t.Fatal(err)
	}
	from, err := migrate(t.Context(), db, migrations)
	if !errors.Is(err, ErrSchemaTooNew) || from != SchemaVersion+2 {
		t.Fatalf("migrate of a newer file = %d, %v; want ErrSchemaTooNew", from, err)
	}
	if v := version(t, db); v != SchemaVersion+2 {
		t.Fatalf("version %d after refusing, want it unchanged", v)
	}
}
