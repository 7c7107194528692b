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
//
// Open creates the schema, or upgrades it, itself: the file's header keeps
// its schema version (PRAGMA user_version) and Open applies, in order and
// each in one transaction, the migrations the file lacks (see SchemaVersion).
// A file from before versioning (version 0, made by mcpgate usage init) holds
// exactly version 1's table and is adopted as it is. A file newer than this
// build is refused (ErrSchemaTooNew), never written.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	// The driver registers itself as "sqlite".
	_ "modernc.org/sqlite"

	"github.com/mcpgate/mcpgate/usage"
)

// BusyTimeout is how long a statement waits for another connection or
// process holding the database lock before failing with ErrUnavailable.
const BusyTimeout = 5 * time.Second

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
	db        *sql.DB
	path      string
	migration Migration // set by Open
}

var _ usage.Store = (*Store)(nil)

// Migration is what Open did to the file's schema.
type Migration struct {
	From, To int  // the schema version Open found and the one it left; equal when it changed nothing
	Created  bool // the file had no usage table: Open created it (From is 0)
}

// ErrInMemory means Open was given an in-memory database (":memory:",
// "file::memory:") or a temporary one ("file:", no file name). database/sql pools connections, and each connection to
// an in-memory database is a database of its own: the schema would exist on
// one connection only, and what was Put would vanish with the connection
// that held it. Usage needs a file path.
var ErrInMemory = errors.New("usage/sqlite: an in-memory database cannot hold usage (each pooled connection is a database of its own); use a file path")

// openTimeout bounds Open: connecting, and migrations that may each wait
// BusyTimeout for another process's write lock.
const openTimeout = 2*BusyTimeout + time.Second

// Open is OpenContext bounded by a deadline of a few busy timeouts.
func Open(path string) (*Store, error) {
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	return OpenContext(ctx, path)
}

// OpenContext opens the SQLite file at path, creating it if needed, and
// brings its schema to SchemaVersion (see the package doc); ctx bounds that
// I/O. A file already at SchemaVersion is opened without taking the write
// lock, so another process writing does not delay it; a migration waits for
// that lock until ctx ends. It fails, leaving the file unchanged, with an
// error wrapping
// ErrSchemaTooNew for a file of a newer schema and ErrUnexpectedSchema for a
// usage table mcpgate did not create, and ErrInMemory for an in-memory
// database. path must not contain '?'.
func OpenContext(ctx context.Context, path string) (*Store, error) {
	switch {
	case path == "":
		return nil, errors.New("usage/sqlite: empty path")
	case strings.ContainsRune(path, '?'):
		// The driver would read what follows as connection options (and
		// so a URI's mode=memory never gets here).
		return nil, fmt.Errorf("usage/sqlite: path %q must not contain '?'", path)
	case inMemory(path):
		return nil, fmt.Errorf("%w: %q", ErrInMemory, path)
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
	s := &Store{db: db, path: path}
	// Connecting applies the pragmas: a file that cannot be created or is
	// not a database fails here rather than at the first flush.
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("usage/sqlite: open %s: %w", path, err)
	}
	if err := s.migrateOnOpen(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// inMemory reports whether path names a database private to each
// connection: ":memory:", as a name or as the file name of a "file:" URI,
// or a "file:" URI with no file name, which SQLite opens as a temporary
// database of the connection.
func inMemory(path string) bool {
	name, uri := strings.CutPrefix(path, "file:")
	return name == ":memory:" || uri && (name == "" || name == "//")
}

func (s *Store) migrateOnOpen(ctx context.Context) error {
	cols, err := tableColumns(ctx, s.db, "usage")
	if err != nil {
		return fmt.Errorf("usage/sqlite: open %s: %w", s.path, err)
	}
	from, err := migrate(ctx, s.db, migrations)
	if err != nil {
		return fmt.Errorf("usage/sqlite: open %s: %w", s.path, err)
	}
	s.migration = Migration{From: from, To: SchemaVersion, Created: from == 0 && len(cols) == 0}
	return nil
}

// Migration reports what Open did to the file's schema.
func (s *Store) Migration() Migration { return s.migration }

// Path returns the file the Store was opened on.
func (s *Store) Path() string { return s.path }

// Init brings the schema to SchemaVersion, as Open does: on a file that is
// up to date it changes nothing. (It matters only when something reset the
// file after Open.)
func (s *Store) Init(ctx context.Context) error {
	if _, err := migrate(ctx, s.db, migrations); err != nil {
		if errors.Is(err, ErrSchemaTooNew) || errors.Is(err, ErrUnexpectedSchema) {
			return fmt.Errorf("usage/sqlite: init %s: %w", s.path, err)
		}
		return s.fail("init", err)
	}
	return nil
}

// Check returns nil when the file is at SchemaVersion with the expected usage
// table; an error wrapping usage.ErrNotInitialized when its schema is older
// or the table is missing (the file was changed after Open), ErrSchemaTooNew
// when it is newer, ErrUnexpectedSchema when the table is not mcpgate's.
func (s *Store) Check(ctx context.Context) error {
	v, err := userVersion(ctx, s.db)
	if err != nil {
		return s.fail("check", err)
	}
	switch {
	case v > SchemaVersion:
		return fmt.Errorf("usage/sqlite: check %s: %w", s.path, tooNew(v, SchemaVersion))
	case v < SchemaVersion:
		return fmt.Errorf("%w: %s is at schema version %d, want %d (run mcpgate usage init)", usage.ErrNotInitialized, s.path, v, SchemaVersion)
	}
	cols, err := tableColumns(ctx, s.db, "usage")
	switch {
	case err != nil:
		return s.fail("check", err)
	case len(cols) == 0:
		return fmt.Errorf("%w: %s is at schema version %d but has no usage table: it was changed outside mcpgate", usage.ErrNotInitialized, s.path, v)
	case !slices.Equal(cols, usageColumns):
		return fmt.Errorf("usage/sqlite: check %s: %w: the usage table has the columns %v, want %v", s.path, ErrUnexpectedSchema, cols, usageColumns)
	}
	return nil
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
