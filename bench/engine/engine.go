// Package engine benchmarks mcpgate's rate-limit stores against their peers,
// in one process and one run, so that the ratios hold even when the machine's
// absolute speed drifts:
//
//   - limit/memstore against golang.org/x/time/rate behind a mutex-guarded
//     map of per-key limiters (the usual in-process peer), on one hot key
//     and on many keys;
//   - limit/redisstore (Store.Take, one token_bucket check) against the same
//     Lua script run bare through rueidis (the ceiling: no validation, no
//     deadline, no Decision) and through go-redis v9's Script.Run (the peer).
//
// Every variant is a func(*testing.B) that runs its calls with b.RunParallel;
// the Benchmark* functions in the tests run them under go test -bench, and
// TestReport interleaves them (A B C A B C ...) with testing.Benchmark and
// prints the medians of the per-round ratios. The variants are built so that
// each side does the same logical work; TestVariantsAgree holds them to
// identical admission decisions.
package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"golang.org/x/time/rate"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/memstore"
	"github.com/mcpgate/mcpgate/limit/redisstore"
)

// Callers is the number of concurrent callers of the Redis variants: the
// figure the design's client choice was measured at.
const Callers = 64

// Parallelism is the b.SetParallelism argument that gives Callers goroutines
// under the current GOMAXPROCS (RunParallel starts p*GOMAXPROCS).
func Parallelism() int {
	procs := runtime.GOMAXPROCS(0)
	return (Callers + procs - 1) / procs
}

// BenchRule is the logical limit every variant enforces: a token bucket so
// large that no call is denied during a benchmark, so that every variant
// measures the admitting path, which reads and writes the counter.
var BenchRule = limit.Rule{Name: "per_tenant", Algorithm: limit.TokenBucket, Limit: 1_000_000_000, Period: time.Second}

// Key returns the counter key of tenant under BenchRule, as the gateway
// builds it.
func Key(tenant string) string {
	return keyspace.Counter(keyspace.PerTenant, string(BenchRule.Algorithm), BenchRule.Name, keyspace.Owner{Tenant: tenant})
}

// Keys returns n distinct counter keys with the given tenant prefix.
func Keys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = Key(prefix + strconv.Itoa(i))
	}
	return keys
}

// Variant is one benchmarked implementation.
type Variant struct {
	Name string
	Run  func(b *testing.B)
}

// KeyedLimiters is the usual in-process peer of memstore: one
// golang.org/x/time/rate.Limiter per key in a map guarded by one mutex,
// created on first use. Safe for concurrent use.
type KeyedLimiters struct {
	limit rate.Limit
	burst int

	mu sync.Mutex
	m  map[string]*rate.Limiter
}

// NewKeyedLimiters returns limiters enforcing r (a TokenBucket rule: Limit
// per Period, capacity r.Capacity()).
func NewKeyedLimiters(r limit.Rule) *KeyedLimiters {
	return &KeyedLimiters{
		limit: rate.Limit(float64(r.Limit) / r.Period.Seconds()),
		burst: int(r.Capacity()),
		m:     make(map[string]*rate.Limiter),
	}
}

// Allow reports whether one unit may be taken from key's bucket now, and
// takes it if so.
func (k *KeyedLimiters) Allow(key string) bool {
	k.mu.Lock()
	l, ok := k.m[key]
	if !ok {
		l = rate.NewLimiter(k.limit, k.burst)
		k.m[key] = l
	}
	k.mu.Unlock()
	return l.Allow()
}

// MemoryVariants returns memstore and its x/time/rate peer on the keys
// given (one key: every caller on one counter; many keys: each caller walks
// them from its own offset). Each call to a variant's Run starts from empty
// state.
func MemoryVariants(suffix string, keys []string) []Variant {
	ctx := context.Background()
	return []Variant{
		{Name: "memstore" + suffix, Run: func(b *testing.B) {
			s, err := memstore.New(nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			var seq atomic.Uint64
			b.ReportAllocs()
			defer reportCPU(b, processCPU())
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1) * 7919)
				checks := []limit.Check{{Rule: BenchRule}}
				for pb.Next() {
					i++
					checks[0].Key = keys[i%len(keys)]
					d, err := s.Take(ctx, checks, 1)
					if err != nil || !d.Allowed {
						b.Errorf("memstore Take: %+v, %v", d, err)
						return
					}
				}
			})
		}},
		{Name: "x-time-rate" + suffix, Run: func(b *testing.B) {
			k := NewKeyedLimiters(BenchRule)
			var seq atomic.Uint64
			b.ReportAllocs()
			defer reportCPU(b, processCPU())
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1) * 7919)
				for pb.Next() {
					i++
					if !k.Allow(keys[i%len(keys)]) {
						b.Error("x/time/rate denied")
						return
					}
				}
			})
		}},
	}
}

// reportCPU reports this process's CPU time per call since cpu0, under
// MetricClientCPU: with a sharded store against a peer behind one mutex,
// ops/s depends on how many cores the machine really gives, CPU per call
// much less.
func reportCPU(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), MetricClientCPU)
}

// ScriptSource is the store's library as a script (redisstore.Script):
// the exact script the store runs with EVALSHA.
func ScriptSource() (string, error) {
	return redisstore.Script(), nil
}

// ScriptArgs returns ARGV for one take of cost 1 on a single check of rule,
// laid out as redisstore builds it (see limit.lua): op, clock offset, cost,
// lease in one header, then the rule: "<algorithm> <limit> <period in µs>
// <capacity>".
func ScriptArgs(r limit.Rule) []string {
	return []string{"t 0 1", fmt.Sprintf("t %d %d %d", r.Limit, r.Period.Microseconds(), r.Capacity())}
}

// Redis holds what the Redis variants share: one server, one rueidis client
// (used by the store and the ceiling) and one go-redis client.
type Redis struct {
	Store *redisstore.Store
	// ScriptStore is a Store on the same client running its library as a
	// script (redisstore.Options.NoFunctions: EVALSHA).
	ScriptStore *redisstore.Store
	Rueidis     rueidis.Client
	GoRedis     *goredis.Client
	Source      string
}

// NewRedis builds the clients for the server at addr. rueidis is given opt
// (the address filled in if empty); go-redis gets its defaults, as an
// application would use it. Close releases both clients.
func NewRedis(addr string, opt rueidis.ClientOption) (*Redis, error) {
	src, err := ScriptSource()
	if err != nil {
		return nil, err
	}
	if len(opt.InitAddress) == 0 {
		opt.InitAddress = []string{addr}
	}
	rc, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("engine: rueidis: %w", err)
	}
	// A long deadline: a stall of the shared machine must not fail a run.
	// The store pays for context.WithTimeout whatever the value.
	st, err := redisstore.New(rc, &redisstore.Options{Timeout: 5 * time.Second})
	if err != nil {
		rc.Close()
		return nil, err
	}
	sst, err := redisstore.New(rc, &redisstore.Options{Timeout: 5 * time.Second, NoFunctions: true})
	if err != nil {
		rc.Close()
		return nil, err
	}
	gr := goredis.NewClient(&goredis.Options{Addr: addr})
	if err := gr.Ping(context.Background()).Err(); err != nil {
		rc.Close()
		gr.Close()
		return nil, fmt.Errorf("engine: go-redis: %w", err)
	}
	return &Redis{Store: st, ScriptStore: sst, Rueidis: rc, GoRedis: gr, Source: src}, nil
}

// Close closes both clients.
func (r *Redis) Close() {
	r.Rueidis.Close()
	_ = r.GoRedis.Close()
}

// Metrics the Redis variants report besides ns/op.
const (
	// MetricClientCPU is this process's CPU time per call, in ns.
	MetricClientCPU = "client-cpu-ns/op"
	// MetricServerCPU is redis-server's CPU time per call, in ns.
	MetricServerCPU = "server-cpu-ns/op"
)

// ServerCPU returns the CPU time redis-server has used (INFO cpu), or 0 if
// it cannot be read.
func (r *Redis) ServerCPU(ctx context.Context) time.Duration {
	info, err := r.Rueidis.Do(ctx, r.Rueidis.B().Info().Section("cpu").Build()).ToString()
	if err != nil {
		return 0
	}
	var total float64
	for line := range strings.SplitSeq(info, "\r\n") {
		k, v, _ := strings.Cut(line, ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// Variant names of the Redis variants, used for ratios.
const (
	RedisStore   = "redisstore"
	RedisCeiling = "rueidis-raw-script"
	RedisGoRedis = "go-redis-script"
)

// Variants returns the three Redis variants. Every caller has its own key
// (its own tenant), with a prefix per variant; all callers share one client
// per library, as a gateway does.
func (r *Redis) Variants() []Variant {
	ctx := context.Background()
	args := ScriptArgs(BenchRule)
	var round atomic.Int64
	// parallel runs Callers goroutines, each calling what newCall returns
	// for its own key: callers prepare their arguments once, as a gateway
	// would not, so that only the call itself is measured.
	parallel := func(b *testing.B, name string, newCall func(key string) func() error) {
		prefix := fmt.Sprintf("bench-%s-%d-", name, round.Add(1))
		var id atomic.Int64
		b.ReportAllocs()
		b.SetParallelism(Parallelism())
		cpu0, rcpu0 := processCPU(), r.ServerCPU(ctx)
		defer func() {
			// CPU per call on each side: unlike ops/s, it does not move with
			// what other tenants of a shared machine take.
			n := float64(b.N)
			b.ReportMetric(float64(processCPU()-cpu0)/n, MetricClientCPU)
			b.ReportMetric(float64(r.ServerCPU(ctx)-rcpu0)/n, MetricServerCPU)
		}()
		b.RunParallel(func(pb *testing.PB) {
			call := newCall(Key(prefix + strconv.FormatInt(id.Add(1), 10)))
			for pb.Next() {
				if err := call(); err != nil {
					b.Errorf("%s: %v", name, err)
					return
				}
			}
		})
	}
	ceiling := rueidis.NewLuaScript(r.Source)
	peer := goredis.NewScript(r.Source)
	return []Variant{
		{Name: RedisStore, Run: func(b *testing.B) {
			parallel(b, RedisStore, func(key string) func() error {
				checks := []limit.Check{{Rule: BenchRule, Key: key}}
				return func() error {
					d, err := r.Store.Take(ctx, checks, 1)
					if err == nil && !d.Allowed {
						err = errors.New("denied")
					}
					return err
				}
			})
		}},
		{Name: RedisCeiling, Run: func(b *testing.B) {
			parallel(b, RedisCeiling, func(key string) func() error {
				keys := []string{key}
				return func() error {
					arr, err := ceiling.Exec(ctx, r.Rueidis, keys, args).ToArray()
					if err == nil && len(arr) != 5 {
						err = fmt.Errorf("%d values", len(arr))
					}
					return err
				}
			})
		}},
		{Name: RedisGoRedis, Run: func(b *testing.B) {
			parallel(b, RedisGoRedis, func(key string) func() error {
				keys := []string{key}
				goArgs := make([]any, len(args))
				for i, a := range args {
					goArgs[i] = a
				}
				return func() error {
					arr, err := peer.Run(ctx, r.GoRedis, keys, goArgs...).Slice()
					if err == nil && len(arr) != 5 {
						err = fmt.Errorf("%d values", len(arr))
					}
					return err
				}
			})
		}},
	}
}
