// Package sqlite is the embedded usage.Store: one SQLite file, through the
// pure-Go driver modernc.org/sqlite (no cgo).
//
// The file holds one table:
//
//	usage(tenant TEXT, period TEXT, charged, refunded, calls, refunded_calls INTEGER,
//	      updated_at TEXT, PRIMARY KEY (tenant, period))
//
// updated_at is RFC 3339 in UTC. The database runs in WAL mode with
// synchronous=FULL (a committed flush survives a power loss: the flusher marks
// a meter flushed only after the commit) and a busy timeout, so that the
// gateway and the mcpgate usage command can share the file.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	// The driver registers itself as "sqlite".
	_ "modernc.org/sqlite"

	"github.com/mcpgate/mcpgate/usage"
)

// BusyTimeout is how long a statement waits for another connection or
// process holding the database lock before failing with ErrUnavailable.
const BusyTimeout = 5 * time.Second

const schema = `CREATE TABLE IF NOT EXISTS usage (
	tenant         TEXT    NOT NULL,
	period         TEXT    NOT NULL,
	charged        INTEGER NOT NULL DEFAULT 0,
	refunded       INTEGER NOT NULL DEFAULT 0,
	calls          INTEGER NOT NULL DEFAULT 0,
	refunded_calls INTEGER NOT NULL DEFAULT 0,
	updated_at     TEXT    NOT NULL,
	PRIMARY KEY (tenant, period)
) WITHOUT ROWID`

const columns = `tenant, period, charged, refunded, calls, refunded_calls, updated_at`

// upsert raises a row to the new snapshot field by field. The WHERE clause
// skips a snapshot the row already covers, so that updated_at only moves
// with the totals; MAX keeps every field from going down even for snapshots
// that are not ordered (two counters of one period, which a re-seed can
// produce).
const upsert = `INSERT INTO usage (` + columns + `) VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (tenant, period) DO UPDATE SET
	charged        = MAX(charged, excluded.charged),
	refunded       = MAX(refunded, excluded.refunded),
	calls          = MAX(calls, excluded.calls),
	refunded_calls = MAX(refunded_calls, excluded.refunded_calls),
	updated_at     = excluded.updated_at
WHERE excluded.charged > charged OR excluded.refunded > refunded
	OR excluded.calls > calls OR excluded.refunded_calls > refunded_calls`

// Store is a usage.Store in one SQLite file. It is safe for concurrent use,
// also by several processes sharing the file.
type Store struct {
	db   *sql.DB
	path string
}

var _ usage.Store = (*Store)(nil)

// Open opens (creating it if needed) the SQLite file at path. The table is
// created by Init, not by Open. path must not contain '?'.
func Open(path string) (*Store, error) {
	switch {
	case path == "":
		return nil, errors.New("usage/sqlite: empty path")
	case strings.ContainsRune(path, '?'):
		// The driver would read what follows as connection options.
		return nil, fmt.Errorf("usage/sqlite: path %q must not contain '?'", path)
	}
	// _txlock=immediate takes the write lock at BEGIN: a transaction that
	// would otherwise upgrade a read lock could fail at once with
	// SQLITE_BUSY, whatever the busy timeout.
	dsn := fmt.Sprintf("%s?_busy_timeout=%d&_journal_mode=WAL&_synchronous=FULL&_txlock=immediate",
		path, BusyTimeout.Milliseconds())
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("usage/sqlite: open %s: %w", path, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), BusyTimeout+time.Second)
	defer cancel()
	// Connecting applies the pragmas: a file that cannot be created or is
	// not a database fails here rather than at the first flush.
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("usage/sqlite: open %s: %w", path, err)
	}
	return &Store{db: db, path: path}, nil
}

// Path returns the file the Store was opened on.
func (s *Store) Path() string { return s.path }

// Init creates the usage table if it does not exist.
func (s *Store) Init(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, schema); err != nil {
		return s.fail("init", err)
	}
	return nil
}

// Check returns nil when the usage table exists with the expected columns,
// an error wrapping usage.ErrNotInitialized when it does not exist.
func (s *Store) Check(ctx context.Context) error {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'usage'`).Scan(&n)
	if err != nil {
		return s.fail("check", err)
	}
	if n == 0 {
		return fmt.Errorf("%w: %s has no usage table (run mcpgate usage init)", usage.ErrNotInitialized, s.path)
	}
	rows, err := s.db.QueryContext(ctx, `SELECT `+columns+` FROM usage LIMIT 0`)
	if err != nil {
		return fmt.Errorf("usage/sqlite: %s: the usage table has an unexpected schema: %w", s.path, err)
	}
	return rows.Close()
}

// Put raises the stored totals to recs in one transaction: either every
// record is applied or none is.
func (s *Store) Put(ctx context.Context, recs []usage.Record) (err error) {
	for _, r := range recs {
		if err := r.Validate(); err != nil {
			return err
		}
	}
	if len(recs) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return s.fail("put", err)
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	stmt, err := tx.PrepareContext(ctx, upsert)
	if err != nil {
		return s.fail("put", err)
	}
	defer stmt.Close()
	for _, r := range recs {
		_, err := stmt.ExecContext(ctx, r.Tenant, r.Period, r.Charged, r.Refunded, r.Calls, r.RefundedCalls, formatTime(r.UpdatedAt))
		if err != nil {
			return s.fail("put", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return s.fail("put", err)
	}
	return nil
}

// Get returns the stored totals of tenant in period.
func (s *Store) Get(ctx context.Context, tenant, period string) (usage.Record, bool, error) {
	var (
		r       usage.Record
		updated string
	)
	err := s.db.QueryRowContext(ctx, `SELECT `+columns+` FROM usage WHERE tenant = ? AND period = ?`, tenant, period).
		Scan(&r.Tenant, &r.Period, &r.Charged, &r.Refunded, &r.Calls, &r.RefundedCalls, &updated)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return usage.Record{}, false, nil
	case err != nil:
		return usage.Record{}, false, s.fail("get", err)
	}
	if r.UpdatedAt, err = time.Parse(time.RFC3339Nano, updated); err != nil {
		return usage.Record{}, false, fmt.Errorf("usage/sqlite: %s: tenant %q period %s: bad updated_at %q", s.path, tenant, period, updated)
	}
	return r, true, nil
}

// Close closes the database. Later calls fail with usage.ErrUnavailable.
func (s *Store) Close() error { return s.db.Close() }

// fail wraps err in usage.ErrNotInitialized when the table is missing, else
// in usage.ErrUnavailable (the file is closed, locked past the busy timeout,
// unreadable, full, or ctx ended).
func (s *Store) fail(op string, err error) error {
	if strings.Contains(err.Error(), "no such table") {
		return fmt.Errorf("usage/sqlite: %s %s: %w (run mcpgate usage init): %w", op, s.path, usage.ErrNotInitialized, err)
	}
	return fmt.Errorf("usage/sqlite: %s %s: %w: %w", op, s.path, usage.ErrUnavailable, err)
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		t = time.Now()
	}
	return t.UTC().Format(time.RFC3339Nano)
}
