package setup

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/sqlite"
)

// parse parses a config made of an upstream, an HS256 auth section and
// extra.
func parse(t *testing.T, extra string) *policy.Config {
	t.Helper()
	yaml := "upstream:\n  url: http://127.0.0.1:1/mcp\nauth:\n  jwt:\n    hs256_secret_env: SETUP_TEST_SECRET\n" + extra
	cfg, err := policy.Parse("setup_test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("config:\n%s\n%v", yaml, err)
	}
	return cfg
}

func TestOpenUsageStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, spec := range []string{"", "sqlite:", "postgres:x", "dynamodb:ab"} {
		if s, err := OpenUsageStore(ctx, spec); err == nil {
			s.Close()
			t.Errorf("OpenUsageStore(%q) succeeded", spec)
		}
	}
	s, err := OpenUsageStore(ctx, "sqlite:"+filepath.Join(t.TempDir(), "u.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// An SQLite file gets its schema on open.
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check of a new file = %v, want it ready", err)
	}
}

func TestDescribeMigration(t *testing.T) {
	t.Parallel()
	for m, want := range map[sqlite.Migration]string{
		{Created: true, To: 2}:  "created the usage table (schema version 2)",
		{From: 1, To: 2}:        "upgraded the schema from version 1 to 2",
		{From: 2, To: 2}:        "already initialized (schema version 2), nothing to do",
		{Created: false, To: 1}: "upgraded the schema from version 0 to 1",
	} {
		if got := DescribeMigration(m); got != want {
			t.Errorf("DescribeMigration(%+v) = %q, want %q", m, got, want)
		}
	}
}

func TestAuthSecretUnset(t *testing.T) {
	t.Setenv("SETUP_TEST_SECRET", "")
	cfg := parse(t, "")
	_, err := Auth(context.Background(), cfg, nil)
	if err == nil || err.Error() != "auth.jwt.hs256_secret_env: environment variable SETUP_TEST_SECRET is not set or empty" {
		t.Fatalf("Auth without the secret = %v", err)
	}
}

// On embedded defaults (usage in an SQLite file, no Redis) Open gives an
// in-process setup: no shared store, a memory cache, a ready usage store,
// and an engine built on EngineOptions meters into it.
func TestOpenInProcess(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "usage.db")
	var logs testenv.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	cfg := parse(t, "usage:\n  store: sqlite:"+db+"\n  flush_interval: 1h\n")
	ctx := context.Background()
	st, err := Open(ctx, cfg, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Shared != nil || st.Probe != nil || st.Cache == nil || st.Usage == nil {
		t.Fatalf("stores = %+v, want no shared store, a cache and a usage store", st)
	}
	if !strings.Contains(logs.String(), "created the usage table") {
		t.Errorf("the log does not say the usage table was created:\n%s", logs.String())
	}
	opts := st.EngineOptions()
	if opts.Config != cfg || opts.Shared != nil || opts.Probe != nil || opts.Usage != st.Usage || opts.Cache != st.Cache || opts.Logger != log {
		t.Fatalf("EngineOptions = %+v", opts)
	}
	eng, err := enforce.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		tk, d := eng.Admit(ctx, enforce.Call{Tenant: "acme", Subject: "alice", Name: "echo"})
		if !d.Allowed {
			t.Fatalf("denied: %+v", d)
		}
		tk.Done(ctx, enforce.Outcome{})
	}
	if err := eng.Close(); err != nil { // the final flush
		t.Fatal(err)
	}
	period := usage.Period(time.Now())
	rec, ok, err := st.Usage.Get(ctx, "acme", period)
	if err != nil || !ok || rec.Usage.Used() != 3 {
		t.Fatalf("durable usage = %+v, %v, %v; want 3 used", rec, ok, err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

// NoUsage opens no usage store: the engine meters nothing.
func TestOpenNoUsage(t *testing.T) {
	t.Parallel()
	cfg := parse(t, "usage:\n  store: sqlite:"+filepath.Join(t.TempDir(), "never.db")+"\n")
	st, err := Open(context.Background(), cfg, nil, &Options{NoUsage: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Usage != nil || st.EngineOptions().Usage != nil {
		t.Fatalf("usage store opened with NoUsage: %v", st.Usage)
	}
	if _, target := cfg.Usage.Backend(); fileExists(target) {
		t.Fatalf("%s was created with NoUsage", target)
	}
}

// With store.redis the shared store, its probe and the cache are on that
// Redis: two engines built on two Opens share their counters, and the
// maxmemory-policy check speaks up about a policy that can evict counters.
func TestOpenRedis(t *testing.T) {
	t.Parallel()
	redis := testenv.StartRedis(t, &testenv.RedisOptions{Args: []string{"--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"}})
	var logs testenv.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	cfg := parse(t, "store:\n  redis: \""+redis.URL+"\"\n  timeout: 2s\n"+
		"tiers:\n  free:\n    limits:\n      - {name: cap, per: tenant, algorithm: fixed_window, limit: 3, period: 1h}\ndefault_tier: free\n")
	ctx := context.Background()
	var engines []*enforce.Engine
	for range 2 {
		st, err := Open(ctx, cfg, log, &Options{NoUsage: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		if st.Shared == nil || st.Probe == nil || st.Cache == nil {
			t.Fatalf("stores = %+v, want a shared store with its probe and a cache", st)
		}
		if err := st.Probe(ctx); err != nil {
			t.Fatalf("probe: %v", err)
		}
		// The limit library is on the server before the first call.
		c := redis.Client(t)
		if libs, err := c.Do(ctx, c.B().FunctionList().Build()).ToArray(); err != nil || len(libs) != 1 {
			t.Fatalf("FUNCTION LIST after Open: %d libraries, %v; want the limit library loaded", len(libs), err)
		}
		eng, err := enforce.New(st.EngineOptions())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = eng.Close() }) // before the stores close
		engines = append(engines, eng)
	}
	admitted := 0
	for i := range 8 {
		tk, d := engines[i%2].Admit(ctx, enforce.Call{Tenant: "acme", Subject: "alice", Name: "echo"})
		tk.Done(ctx, enforce.Outcome{})
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("admitted %d calls across two engines, want exactly 3 (shared counters)", admitted)
	}
	if out := logs.String(); !strings.Contains(out, "redis=store.redis") || !strings.Contains(out, "maxmemory_policy=allkeys-lru") {
		t.Errorf("no eviction warning about store.redis:\n%s", out)
	}
}

// Open reports a config it cannot open, naming the field, and closes what
// it opened before.
func TestOpenErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cases := []struct {
		name, yaml, want string
	}{
		{"usage store in a missing directory", "usage:\n  store: sqlite:" + filepath.Join(dir, "no", "such", "dir", "u.db") + "\n", "u.db"},
		{"unreachable store.redis", "usage:\n  store: sqlite:" + filepath.Join(dir, "a.db") + "\nstore:\n  redis: \"redis://127.0.0.1:1/0\"\n", "store.redis: cannot connect: "},
		{"unreachable cache.redis", "usage:\n  store: sqlite:" + filepath.Join(dir, "b.db") + "\ncache:\n  redis: \"redis://127.0.0.1:1/0\"\n", "cache.redis: cannot connect: "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, err := Open(context.Background(), parse(t, c.yaml), slog.New(slog.DiscardHandler), nil)
			if err == nil {
				st.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
		})
	}
	if _, err := Open(context.Background(), nil, nil, nil); err == nil {
		t.Fatal("Open(nil config) succeeded")
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, os.ErrNotExist)
}
