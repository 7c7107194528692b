package sqlite_test

import (
	"database/sql"
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
