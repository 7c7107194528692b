package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// SchemaVersion is the schema version this build creates and expects: the
// number of migrations it knows. It is kept in the file's header
// (PRAGMA user_version); version 0 is a file without a versioned schema
// (new, or initialized by an mcpgate from before versioning).
const SchemaVersion = 1

// ErrSchemaTooNew means the file's schema version is newer than
// SchemaVersion: a newer mcpgate migrated it, and this one cannot know what
// changed. Nothing was written. Run the newer mcpgate, or restore a copy of
// the file made before the upgrade.
var ErrSchemaTooNew = errors.New("usage/sqlite: schema too new")

// ErrUnexpectedSchema means the file holds a usage table that mcpgate did not
// create (other columns or another key). Nothing was written: the file is
// probably another program's.
var ErrUnexpectedSchema = errors.New("usage/sqlite: unexpected schema")

// A migration moves the schema from version-1 to version. It runs inside the
// transaction that sets the new version, so it is applied entirely or not
// at all, and once: the version is read under the write lock.
type migration struct {
	version int
	name    string
	apply   func(ctx context.Context, tx *sql.Tx) error
}

// migrations is the schema's history, oldest first; migrations[i] has
// version i+1. Append to it, never edit an entry: files in the field hold
// the result of every entry up to their version.
var migrations = []migration{
	{version: 1, name: "create the usage table", apply: createUsage},
}

const usageTableV1 = `CREATE TABLE usage (
	tenant         TEXT    NOT NULL,
	period         TEXT    NOT NULL,
	charged        INTEGER NOT NULL DEFAULT 0,
	refunded       INTEGER NOT NULL DEFAULT 0,
	calls          INTEGER NOT NULL DEFAULT 0,
	refunded_calls INTEGER NOT NULL DEFAULT 0,
	updated_at     TEXT    NOT NULL,
	PRIMARY KEY (tenant, period)
) WITHOUT ROWID`

// column is one row of pragma_table_info: a name and its position in the
// primary key (0: not in it).
type column struct {
	name string
	pk   int
}

func (c column) String() string {
	if c.pk > 0 {
		return fmt.Sprintf("%s (key part %d)", c.name, c.pk)
	}
	return c.name
}

// usageColumns is the usage table of every schema version so far. Check
// compares the file's table with it.
var usageColumns = []column{
	{"tenant", 1}, {"period", 2}, {"charged", 0}, {"refunded", 0},
	{"calls", 0}, {"refunded_calls", 0}, {"updated_at", 0},
}

// createUsage creates the usage table, or adopts the one that mcpgate usage
// init created before the schema was versioned: that table is exactly
// version 1's, so adopting it only stamps the version. A usage table of any
// other shape is refused rather than stamped.
func createUsage(ctx context.Context, tx *sql.Tx) error {
	cols, err := tableColumns(ctx, tx, "usage")
	switch {
	case err != nil:
		return err
	case len(cols) == 0:
		_, err = tx.ExecContext(ctx, usageTableV1)
		return err
	case !slices.Equal(cols, usageColumns):
		return fmt.Errorf("%w: the usage table has the columns %v, want %v", ErrUnexpectedSchema, cols, usageColumns)
	}
	return nil
}

// querier is what *sql.DB, *sql.Conn and *sql.Tx share.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// tableColumns lists table's columns in order; none when it does not exist.
func tableColumns(ctx context.Context, q querier, table string) ([]column, error) {
	rows, err := q.QueryContext(ctx, `SELECT name, pk FROM pragma_table_info(?) ORDER BY cid`, table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var cols []column
	for rows.Next() {
		var c column
		if err := rows.Scan(&c.name, &c.pk); err != nil {
			return nil, err
		}
		cols = append(cols, c)
	}
	return cols, rows.Err()
}

func userVersion(ctx context.Context, q querier) (int, error) {
	var v int
	err := q.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v)
	return v, err
}

// tooNew is the error for a file at version v when the build knows known.
func tooNew(v, known int) error {
	return fmt.Errorf("%w: the file is at schema version %d, newer than the %d this mcpgate knows (run the mcpgate that upgraded it, or restore a copy from before the upgrade)", ErrSchemaTooNew, v, known)
}

// busyPause is how long migrate waits before taking the write lock again
// after SQLITE_BUSY: the busy timeout has usually been waited already, but
// a lock refused at once (a snapshot gone stale) must not make it spin.
const busyPause = 100 * time.Millisecond

// migrate applies the migrations of ms the file does not have yet, each in
// its own transaction, and returns the version it found. Several processes
// may migrate one file at once: each step re-reads the version under the
// write lock, so every migration is applied once. While another process
// holds the write lock past the busy timeout, a step is tried again until
// ctx ends. A file newer than ms is refused with ErrSchemaTooNew and left
// alone.
func migrate(ctx context.Context, db *sql.DB, ms []migration) (from int, err error) {
	if from, err = userVersion(ctx, db); err != nil {
		return 0, err
	}
	switch {
	case from > len(ms):
		return from, tooNew(from, len(ms))
	case from == len(ms):
		// The usual case costs one read and no write lock: versions only
		// grow, so a file found up to date stays so. Opening it then
		// never waits for another process's write (a long flush, a
		// backup): a gateway starts, and mcpgate usage reads, meanwhile.
		return from, nil
	}
	for {
		done, err := migrateStep(ctx, db, ms)
		if isBusy(err) && ctx.Err() == nil {
			// Another process writes: wait for it as long as ctx
			// allows (OpenContext's caller chose how long).
			select {
			case <-ctx.Done():
				return from, err
			case <-time.After(busyPause):
			}
			continue
		}
		if done || err != nil {
			return from, err
		}
	}
}

// isBusy reports whether err is SQLite's SQLITE_BUSY (any extended code):
// another connection holds the lock.
func isBusy(err error) bool {
	var se *msqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_BUSY
}

// migrateStep applies the next migration the file lacks; done reports that
// it lacked none.
func migrateStep(ctx context.Context, db *sql.DB, ms []migration) (done bool, err error) {
	// The DSN's _txlock=immediate takes the write lock at BEGIN, before
	// the version is read.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer func() {
		if err != nil || done {
			_ = tx.Rollback()
		}
	}()
	v, err := userVersion(ctx, tx)
	switch {
	case err != nil:
		return false, err
	case v > len(ms):
		return false, tooNew(v, len(ms))
	case v == len(ms):
		return true, nil
	}
	m := ms[v]
	if err := m.apply(ctx, tx); err != nil {
		return false, fmt.Errorf("migration %d (%s): %w", m.version, m.name, err)
	}
	// PRAGMA takes no parameters; m.version is an int.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, m.version)); err != nil {
		return false, fmt.Errorf("migration %d (%s): set the version: %w", m.version, m.name, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("migration %d (%s): commit: %w", m.version, m.name, err)
	}
	return false, nil
}
