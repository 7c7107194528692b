package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	usagestore "github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// runU runs the usage command itself (whether or not cli.go lists it yet).
func runU(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	err = runUsage(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), err
}

// usageConfig writes a config whose usage store is an SQLite file in a
// temporary directory, and returns the config path and the file.
func usageConfig(t *testing.T) (cfgPath, dbPath string) {
	t.Helper()
	t.Setenv("CLI_USAGE_TEST_SECRET", "0123456789abcdef0123456789abcdef")
	dir := t.TempDir()
	dbPath = filepath.Join(dir, "usage.db")
	cfg := `upstream: {url: http://127.0.0.1:9/mcp}
auth:
  jwt: {hs256_secret_env: CLI_USAGE_TEST_SECRET}
usage:
  store: sqlite:` + dbPath + `
  flush_interval: 1s
default_tier: free
tiers:
  free:
    monthly_quota: 1000
    limits:
      - {name: per_tenant, algorithm: fixed_window, limit: 10, period: 1m}
  enterprise:
    monthly_quota: 0
    limits:
      - {name: per_tenant, algorithm: fixed_window, limit: 1000, period: 1m}
`
	cfgPath = filepath.Join(dir, "mcpgate.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfgPath, dbPath
}

func TestUsageInitThenReport(t *testing.T) {
	cfg, db := usageConfig(t)

	// Before init: the report says how to initialize, and leaves no file.
	_, _, err := runU(t, "--config", cfg, "--tenant", "acme", "--period", "2026-11")
	if err == nil || !strings.Contains(err.Error(), "mcpgate usage init --config "+cfg) {
		t.Fatalf("usage before init = %v, want advice to run usage init", err)
	}
	if _, statErr := os.Stat(db); !errors.Is(statErr, os.ErrNotExist) {
		t.Fatalf("a report created the database file (%v)", statErr)
	}

	out, errOut, err := runU(t, "init", "--config", cfg)
	if err != nil || !strings.Contains(out, "created the usage table") {
		t.Fatalf("first init: %v\nstdout: %s\nstderr: %s", err, out, errOut)
	}
	out, _, err = runU(t, "init", "--config", cfg)
	if err != nil || !strings.Contains(out, "already initialized") {
		t.Fatalf("second init: %v\nstdout: %s", err, out)
	}

	// What the gateway's flusher would have written.
	st, err := sqlite.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 20, 8, 30, 0, 0, time.UTC)
	err = st.Put(context.Background(), []usagestore.Record{
		{Tenant: "acme", Period: "2026-11", Usage: limit.Usage{Charged: 260, Refunded: 10, Calls: 42, RefundedCalls: 2}, UpdatedAt: at},
		{Tenant: "acme", Period: "2026-10", Usage: limit.Usage{Charged: 5, Calls: 5}, UpdatedAt: at},
		{Tenant: "globex", Period: "2026-11", Usage: limit.Usage{Charged: 1, Calls: 1}, UpdatedAt: at},
	})
	st.Close()
	if err != nil {
		t.Fatal(err)
	}

	out, errOut, err = runU(t, "--config", cfg, "--tenant", "acme", "--period", "2026-11", "--json")
	if err != nil {
		t.Fatalf("usage --json: %v\n%s", err, errOut)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	for k, v := range map[string]any{
		"tenant": "acme", "period": "2026-11", "tier": "free",
		"used": 250.0, "quota": 1000.0, "remaining": 750.0, "calls": 40.0,
		"charged": 260.0, "refunded": 10.0, "calls_admitted": 42.0, "refunded_calls": 2.0,
		"found": true, "updated_at": "2026-11-20T08:30:00Z", "period_end": "2026-12-01T00:00:00Z",
	} {
		if got[k] != v {
			t.Errorf("%s = %#v, want %#v\n%s", k, got[k], v, out)
		}
	}

	// Another tier's quota; a tenant with nothing recorded.
	out, _, err = runU(t, "--config", cfg, "--tenant", "nobody", "--period", "2026-11", "--tier", "enterprise", "--json")
	if err != nil {
		t.Fatal(err)
	}
	got = nil
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got["used"] != 0.0 || got["quota"] != 0.0 || got["found"] != false || got["tier"] != "enterprise" {
		t.Errorf("unknown tenant, enterprise tier: %s", out)
	}
	if _, ok := got["remaining"]; ok {
		t.Errorf("remaining without a quota: %s", out)
	}

	// The text form.
	out, _, err = runU(t, "--config", cfg, "--tenant", "acme", "--period", "2026-11")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"tenant acme, period 2026-11", "250 of 1000 cost units", "750 left", "calls: 40 (42 admitted, 2 taken back)"} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
}

func TestUsageDefaultsToTheCurrentPeriod(t *testing.T) {
	cfg, db := usageConfig(t)
	if _, _, err := runU(t, "init", "--config", cfg); err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	now := usagestore.Period(time.Now())
	err = st.Put(context.Background(), []usagestore.Record{{Tenant: "acme", Period: now, Usage: limit.Usage{Charged: 3, Calls: 3}}})
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := runU(t, "--config", cfg, "--tenant", "acme", "--json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"period": "`+now+`"`) || !strings.Contains(out, `"used": 3`) {
		t.Fatalf("default period: %s", out)
	}
}

func TestUsageBadInvocations(t *testing.T) {
	cfg, _ := usageConfig(t)
	for _, args := range [][]string{
		{},
		{"--config", cfg},
		{"--tenant", "acme"},
		{"--config", cfg, "--tenant", "acme", "--period", "2026-13"},
		{"--config", cfg, "--tenant", "acme", "--period", "november"},
		{"--config", cfg, "--tenant", "acme", "--tier", "platinum"},
		{"--config", cfg, "--tenant", "acme", "extra"},
		{"init"},
		{"init", "--config", cfg, "extra"},
	} {
		_, errOut, err := runU(t, args...)
		if !errors.Is(err, errUsage) {
			t.Errorf("usage %q = %v, want a usage error\n%s", args, err, errOut)
		}
	}
	if _, _, err := runU(t, "init", "--config", "/does/not/exist.yaml"); !errors.Is(err, errReported) {
		t.Errorf("init with a missing config = %v, want it reported", err)
	}
	_, errOut, err := runU(t, "-h")
	if !errors.Is(err, flag.ErrHelp) || !strings.Contains(errOut, "mcpgate usage init --config FILE") {
		t.Errorf("-h = %v:\n%s", err, errOut)
	}
}
