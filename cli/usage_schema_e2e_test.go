package cli

// First runs of `mcpgate serve` with the default usage store
// (sqlite:mcpgate-usage.db, relative to the working directory), through the
// real binary and without `mcpgate usage init`: on a fresh directory, on a
// file made by `mcpgate usage init` before schema versions, and on a file of
// a newer schema, which it refuses.

import (
	"bytes"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/limit"
	usagestore "github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

func TestServeCreatesAndUpgradesTheDefaultUsageStore(t *testing.T) {
	bin := buildMcpgate(t, t.TempDir())
	up := upstream.New(&upstream.Options{Stateless: true, JSONResponse: true})
	upSrv := httptest.NewServer(up.Handler())
	t.Cleanup(upSrv.Close)
	token, err := auth.SignHS256([]byte(e2eSecret), map[string]any{"tenant_id": "t1", "sub": "u", "scope": "tools:*", "exp": time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	period := usagestore.Period(time.Now())

	// newDir is a working directory with a config that names no usage
	// store, and the default store's file in it.
	newDir := func() (dir, cfg, db string) {
		dir = t.TempDir()
		cfg = filepath.Join(dir, "mcpgate.yaml")
		text := fmt.Sprintf("listen: 127.0.0.1:0\nupstream: {url: %s/mcp}\nauth:\n  jwt: {hs256_secret_env: E2E_SECRET}\n", upSrv.URL)
		if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir, cfg, filepath.Join(dir, "mcpgate-usage.db")
	}
	// serveCalls runs a gateway in dir, makes n calls, and stops it with
	// SIGTERM (whose final flush writes their usage).
	serveCalls := func(dir, cfg string, n int) string {
		t.Helper()
		p := startServeIn(t, bin, dir, cfg)
		for i := range n {
			if resp := callEcho(t, p.addr, token); resp.StatusCode != http.StatusOK {
				t.Fatalf("call %d: status %d\n%s", i+1, resp.StatusCode, p.stderr.String())
			}
		}
		p.signal(t, syscall.SIGTERM)
		if p.err != nil {
			t.Fatalf("mcpgate serve exited with %v:\n%s", p.err, p.stderr.String())
		}
		return p.stderr.String()
	}

	// A fresh directory: serve creates the file and its schema, and meters.
	dir, cfg, db := newDir()
	log := serveCalls(dir, cfg, 3)
	if !strings.Contains(log, "created the usage table") {
		t.Errorf("the log does not say the usage table was created:\n%s", log)
	}
	if got := durableTotal(t, db, "t1", period); got != (limit.Usage{Charged: 3, Calls: 3}) {
		t.Fatalf("durable usage after 3 calls on a fresh directory = %+v\n%s", got, log)
	}
	if v := sqliteVersion(t, db); v != sqlite.SchemaVersion {
		t.Fatalf("user_version = %d, want %d", v, sqlite.SchemaVersion)
	}
	// The next start finds it as it left it.
	serveCalls(dir, cfg, 2)
	if got := durableTotal(t, db, "t1", period); got != (limit.Usage{Charged: 5, Calls: 5}) {
		t.Fatalf("durable usage after a restart and 2 more calls = %+v", got)
	}

	// A file made by `mcpgate usage init` before versioning (see
	// usage/sqlite/testdata): upgraded in place, its totals kept.
	dir2, cfg2, db2 := newDir()
	fixture, err := os.ReadFile(filepath.Join("..", "usage", "sqlite", "testdata", "usage-init-unversioned.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(db2, fixture, 0o600); err != nil {
		t.Fatal(err)
	}
	log = serveCalls(dir2, cfg2, 2)
	if !strings.Contains(log, "upgraded the schema from version 0") {
		t.Errorf("the log does not say the schema was upgraded:\n%s", log)
	}
	if got := durableTotal(t, db2, "acme", "2026-11"); got != (limit.Usage{Charged: 260, Refunded: 10, Calls: 42, RefundedCalls: 2}) {
		t.Fatalf("the old file's totals after the upgrade = %+v", got)
	}
	if got := durableTotal(t, db2, "t1", period); got != (limit.Usage{Charged: 2, Calls: 2}) {
		t.Fatalf("durable usage after 2 calls on the upgraded file = %+v", got)
	}

	// A file of a newer schema: serve refuses to start and names the cause.
	if err := sqliteExec(db, fmt.Sprintf("PRAGMA user_version = %d", sqlite.SchemaVersion+1)); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--config", cfg)
	cmd.Dir, cmd.Env = dir, e2eEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil || !strings.Contains(stderr.String(), fmt.Sprintf("schema version %d, newer than", sqlite.SchemaVersion+1)) {
		t.Fatalf("serve on a newer schema: %v\n%s", err, stderr.String())
	}
	if v := sqliteVersion(t, db); v != sqlite.SchemaVersion+1 {
		t.Fatalf("user_version = %d after the refusal, want it unchanged", v)
	}
}

// sqliteExec and sqliteVersion reach the file without the usage store, as
// another program would.
func sqliteExec(path, stmt string) error {
	db, err := sql.Open("sqlite", path)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.Exec(stmt)
	return err
}

func sqliteVersion(t *testing.T, path string) int {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v int
	if err := db.QueryRow("PRAGMA user_version").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}
