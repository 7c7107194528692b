package sqlite_test

import (
	"database/sql"
	"testing"
	"time"
)

// rawExec and rawQuery reach the file without the Store, as another tool
// would.
func rawExec(path, stmt string) error {
	db, err := sql.Open("sqlite", path)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.Exec(stmt)
	return err
}

func rawQuery(path, query string, dst any) error {
	db, err := sql.Open("sqlite", path)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.QueryRow(query).Scan(dst)
}

// holdWriteLock takes the file's write lock as another process would (a
// gateway's long flush, a backup) and keeps it for d, or until the test
// ends when d is 0. The file is put in WAL mode first, as Open leaves it, so
// that readers are not blocked.
func holdWriteLock(t *testing.T, path string, d time.Duration) {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_journal_mode=WAL&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if d > 0 {
		release := time.AfterFunc(d, func() { tx.Rollback() })
		t.Cleanup(func() { release.Stop() })
	}
	t.Cleanup(func() { tx.Rollback() })
}
