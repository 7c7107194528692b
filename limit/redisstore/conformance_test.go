package redisstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit/limittest"
)

// TestConformance holds the Redis store to the suite every store passes, on
// a standalone server and on a 6-node Cluster. Each subtest gets its own
// Store (so its own clock offset) on one shared client: the store's clock is
// the server's TIME plus an offset the suite advances, so real time moves
// it too (Harness.RealTime).
func TestConformance(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		c := testenv.StartRedis(t, nil).Client(t)
		limittest.RunConformance(t, conformanceHarness(c, nil))
	})
	t.Run("redis-scripts", func(t *testing.T) {
		// the library as a script (EVALSHA, EVAL), as on Redis < 7
		t.Parallel()
		c := testenv.StartRedis(t, nil).Client(t)
		limittest.RunConformance(t, conformanceHarness(c, &Options{NoFunctions: true}))
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		c := testenv.StartCluster(t).Client(t)
		if c.Mode() != rueidis.ClientModeCluster {
			t.Fatalf("cluster client in mode %v", c.Mode())
		}
		limittest.RunConformance(t, conformanceHarness(c, nil))
	})
}

// epochUnixUS is the scripts' epoch, 2020-01-01T00:00:00Z, in µs since 1970.
const epochUnixUS = 1577836800 * 1e6

func conformanceHarness(c rueidis.Client, opts *Options) func(t *testing.T) limittest.Harness {
	return func(t *testing.T) limittest.Harness {
		o := Options{Timeout: testTimeout}
		if opts != nil {
			o.NoFunctions = opts.NoFunctions
		}
		s, err := New(c, &o)
		if err != nil {
			t.Fatal(err)
		}
		return limittest.Harness{
			Store:        s,
			Advance:      func(d time.Duration) { s.offset.Add(d.Microseconds()) },
			TTLs:         func(t *testing.T) map[string]time.Duration { return conformanceTTLs(t, c) },
			FlushScripts: func(t *testing.T) { conformanceFlush(t, c) },
			RealTime:     true,
			Now: func() time.Time {
				return time.UnixMicro(serverNow(t, c) + s.offset.Load() + epochUnixUS)
			},
		}
	}
}

// conformanceMasters returns the nodes that hold keys: every master (the one
// server when standalone).
func conformanceMasters(t *testing.T, ctx context.Context, c rueidis.Client) map[string]rueidis.Client {
	t.Helper()
	masters := map[string]rueidis.Client{}
	for addr, n := range c.Nodes() {
		role, err := n.Do(ctx, n.B().Role().Build()).ToArray()
		if err != nil || len(role) == 0 {
			t.Fatalf("ROLE on %s: %v", addr, err)
		}
		if r, _ := role[0].ToString(); r == "master" {
			masters[addr] = n
		}
	}
	if len(masters) == 0 {
		t.Fatal("no master among the client's nodes")
	}
	return masters
}

// conformanceTTLs lists every mcpgate key of every master with its PTTL
// (-1, no TTL, and -2, gone meanwhile, are reported as they are: the suite
// wants a positive TTL on every key).
func conformanceTTLs(t *testing.T, c rueidis.Client) map[string]time.Duration {
	t.Helper()
	ctx := t.Context()
	out := map[string]time.Duration{}
	for addr, n := range conformanceMasters(t, ctx, c) {
		var keys []string
		for cursor := uint64(0); ; {
			e, err := n.Do(ctx, n.B().Scan().Cursor(cursor).Match("mcpgate:*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				t.Fatalf("SCAN on %s: %v", addr, err)
			}
			keys = append(keys, e.Elements...)
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
		cmds := make(rueidis.Commands, len(keys))
		for i, k := range keys {
			cmds[i] = n.B().Pttl().Key(k).Build()
		}
		for i, r := range n.DoMulti(ctx, cmds...) {
			ms, err := r.AsInt64()
			if err != nil {
				t.Fatalf("PTTL %q on %s: %v", keys[i], addr, err)
			}
			out[keys[i]] = time.Duration(ms) * time.Millisecond
		}
	}
	return out
}

// conformanceFlush drops the scripts and the functions of every node
// (FUNCTION FLUSH on masters: a replica refuses it, and gets it from its
// master).
func conformanceFlush(t *testing.T, c rueidis.Client) {
	t.Helper()
	ctx := t.Context()
	for addr, n := range c.Nodes() {
		if err := n.Do(ctx, n.B().ScriptFlush().Build()).Error(); err != nil {
			t.Fatalf("SCRIPT FLUSH on %s: %v", addr, err)
		}
		err := n.Do(ctx, n.B().FunctionFlush().Build()).Error()
		if rerr, ok := rueidis.IsRedisErr(err); err != nil && (!ok || !strings.HasPrefix(rerr.Error(), "READONLY")) {
			t.Fatalf("FUNCTION FLUSH on %s: %v", addr, err)
		}
	}
}
