package engine

import (
	"context"
	"errors"
	"flag"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/memstore"
)

var rounds = flag.Int("rounds", 0, "TestReport, TestPeerReport: interleaved rounds of every variant (0: one short smoke round)")

// reportRounds is -rounds. Without it a report runs one round of 100
// iterations per variant: a smoke run of its code against the real servers
// whose figures mean nothing, so that no run of the suite (CI's included)
// skips it.
func reportRounds(t *testing.T) int {
	if *rounds > 0 {
		return *rounds
	}
	bt := flag.Lookup("test.benchtime")
	old := bt.Value.String()
	if err := bt.Value.Set("100x"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bt.Value.Set(old) })
	return 1
}

// manyKeys is the key count of the many-keys memory benchmarks.
const manyKeys = 10_000

func memoryVariants() []Variant {
	return append(MemoryVariants("/one_key", Keys("hot", 1)), MemoryVariants("/many_keys", Keys("t", manyKeys))...)
}

func startRedis(tb testing.TB) *Redis {
	tb.Helper()
	srv := testenv.StartRedis(tb, nil)
	r, err := NewRedis(srv.Addr, srv.ClientOption())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.Close)
	return r
}

func BenchmarkMemory(b *testing.B) {
	for _, v := range memoryVariants() {
		b.Run(v.Name, v.Run)
	}
}

func BenchmarkRedis(b *testing.B) {
	for _, v := range startRedis(b).Variants() {
		b.Run(v.Name, v.Run)
	}
}

// TestReport runs the variants interleaved and prints medians and ratios:
//
//	go test ./engine -run TestReport -v -rounds 5
func TestReport(t *testing.T) {
	n := reportRounds(t)
	progress := func(round int, name string, s Sample) {
		t.Logf("round %d %-28s %12.0f ops/s %6d allocs/op", round, name, s.OpsPerSec, s.AllocsPerOp)
	}
	t.Run("memory", func(t *testing.T) {
		res, err := Interleave(n, memoryVariants(), progress)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		res.Print(&b, []Ratio{
			{Num: "memstore/one_key", Den: "x-time-rate/one_key"},
			{Num: "memstore/many_keys", Den: "x-time-rate/many_keys"},
		})
		os.Stdout.WriteString("\n" + b.String() + "\n")
	})
	t.Run("redis", func(t *testing.T) {
		r := startRedis(t)
		res, err := Interleave(n, r.Variants(), progress)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		procs := runtime.GOMAXPROCS(0)
		b.WriteString("Redis variants: " + strconv.Itoa(Parallelism()) + " goroutines x GOMAXPROCS " + strconv.Itoa(procs) +
			" = " + strconv.Itoa(Parallelism()*procs) + " concurrent callers\n\n")
		res.Print(&b, []Ratio{
			{Num: RedisStore, Den: RedisCeiling, Target: 0.9},
			{Num: RedisStore, Den: RedisGoRedis, Target: 1.5},
			{Num: RedisCeiling, Den: RedisGoRedis},
		})
		os.Stdout.WriteString("\n" + b.String() + "\n")
	})
}

// TestVariantsAgree holds each pair of variants to the same decisions on a
// small limit, so that the benchmarks compare the same logical work.
func TestVariantsAgree(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		rule := limit.Rule{Name: "r", Algorithm: limit.TokenBucket, Limit: 5, Period: time.Hour}
		s, err := memstore.New(nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		k := NewKeyedLimiters(rule)
		key := Key("agree")
		for i := range 8 {
			d, err := s.Take(context.Background(), []limit.Check{{Rule: rule, Key: key}}, 1)
			if err != nil {
				t.Fatal(err)
			}
			if peer := k.Allow(key); d.Allowed != peer || d.Allowed != (i < 5) {
				t.Fatalf("call %d: memstore allowed=%v, x/time/rate allowed=%v, want %v", i+1, d.Allowed, peer, i < 5)
			}
		}
	})
	t.Run("redis", func(t *testing.T) {
		r := startRedis(t)
		ctx := context.Background()
		rule := limit.Rule{Name: "r", Algorithm: limit.TokenBucket, Limit: 3, Period: time.Hour}
		args := ScriptArgs(rule)
		goArgs := make([]any, len(args))
		for i, a := range args {
			goArgs[i] = a
		}
		src, err := ScriptSource()
		if err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			d, err := r.Store.Take(ctx, []limit.Check{{Rule: rule, Key: Key("store")}}, 1)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := rawScript(ctx, r, src, Key("raw"), args)
			if err != nil {
				t.Fatal(err)
			}
			g, err := goRedisScript(ctx, r, src, Key("goredis"), goArgs)
			if err != nil {
				t.Fatal(err)
			}
			want := [2]int64{0, 0}
			if i < 3 {
				want = [2]int64{1, int64(2 - i)}
			}
			got := [2]int64{0, d.Remaining}
			if d.Allowed {
				got[0] = 1
			}
			if got != want || raw != want || g != want {
				t.Fatalf("call %d: (allowed, remaining) store %v, raw script %v, go-redis %v; want %v", i+1, got, raw, g, want)
			}
		}
	})
}

func rawScript(ctx context.Context, r *Redis, src, key string, args []string) ([2]int64, error) {
	return pair(rueidis.NewLuaScript(src).Exec(ctx, r.Rueidis, []string{key}, args).AsIntSlice())
}

func goRedisScript(ctx context.Context, r *Redis, src, key string, args []any) ([2]int64, error) {
	return pair(goredis.NewScript(src).Run(ctx, r.GoRedis, []string{key}, args...).Int64Slice())
}

// pair picks (allowed, remaining) of the one check from a take reply.
func pair(v []int64, err error) ([2]int64, error) {
	if err != nil {
		return [2]int64{}, err
	}
	if len(v) != 5 {
		return [2]int64{}, errShortReply
	}
	return [2]int64{v[1], v[2]}, nil
}

var errShortReply = errors.New("take reply is not 5 values")
