package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/bench/internal/toolhive/ratelimit"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/redisstore"
)

// The peer: ToolHive's Redis rate limiter (pkg/ratelimit of ToolHive
// v0.63.0, vendored in bench/internal/toolhive with its licence), the one
// peer with atomic multi-bucket limits: one Lua script checks every bucket
// of a call and consumes all or none, through go-redis v9.
//
// Same logical work on both sides:
//
//   - one decision: one token bucket per caller (mcpgate: a tenant rule,
//     Store.Take; ToolHive: a perUser bucket, Limiter.Allow with the caller
//     as user);
//   - layered: three token buckets per call, all-or-nothing: the caller's
//     own, the caller's on the tool, and one shared by every caller
//     (mcpgate: tenant and tenant_tool rules and a global rule, one
//     GuardedStore.Evaluate with Request.Global; ToolHive: perUser, the
//     tool's perUser and the server's shared bucket, one Limiter.Allow).
//
// The rules are so large that nothing is denied: every call reads and
// writes every bucket. TestPeersAgree holds both sides to the same
// decisions on small limits.

// Variant names of the peer comparison.
const (
	PeerStore          = "mcpgate/one"          // redisstore.Take, the library as a function (FCALL)
	PeerStoreScript    = "mcpgate-evalsha/one"  // the same as a script (EVALSHA)
	PeerToolHive       = "toolhive/one"         // ToolHive Limiter.Allow (go-redis)
	PeerToolHiveScript = "toolhive-rueidis/one" // ToolHive's script, one bucket, through rueidis
	PeerStore3         = "mcpgate/layered"
	PeerStore3Script   = "mcpgate-evalsha/layered"
	PeerStore3TwoTrips = "mcpgate-2-calls/layered" // tenant call, then global call: the engine's path before
	PeerToolHive3      = "toolhive/layered"
	PeerToolHive3Raw   = "toolhive-rueidis/layered"
)

// peerLimit is what every bucket of the throughput variants holds: nothing
// is denied during a run.
const peerLimit = 2_000_000_000

// peerRule is a token bucket of peerLimit per second: ToolHive's buckets
// hold at most an int32 of tokens.
func peerRule(name string) limit.Rule {
	return limit.Rule{Name: name, Algorithm: limit.TokenBucket, Limit: peerLimit, Period: time.Second}
}

// ToolHiveConfig is ToolHive's configuration for the peer variants: a
// shared bucket, a per-user bucket and the tool's per-user bucket, each of
// tokens per refill (three buckets on a call of tool with a user; one, the
// per-user bucket, on a call without a tool when only is true).
func ToolHiveConfig(tool string, tokens int32, refill time.Duration, only bool) *ratelimit.RateLimitConfig {
	b := &ratelimit.RateLimitBucket{MaxTokens: tokens, RefillPeriod: ratelimit.Duration{Duration: refill}}
	if only {
		return &ratelimit.RateLimitConfig{PerUser: b}
	}
	return &ratelimit.RateLimitConfig{Shared: b, PerUser: b, Tools: []ratelimit.ToolRateLimitConfig{{Name: tool, PerUser: b}}}
}

// LayeredRequest is mcpgate's request of the layered variants for a caller
// (tenant) on tool, with rules named after the variant's round.
func LayeredRequest(round, tenant, tool string, tenantRule, toolRule, globalRule limit.Rule) limit.Request {
	o := keyspace.Owner{Tenant: tenant, Tool: tool}
	return limit.Request{
		Checks: []limit.Check{
			{Rule: tenantRule, Key: keyspace.Counter(keyspace.PerTenant, string(tenantRule.Algorithm), tenantRule.Name, o)},
			{Rule: toolRule, Key: keyspace.Counter(keyspace.PerTenantTool, string(toolRule.Algorithm), toolRule.Name, o)},
		},
		Global: []limit.Check{
			{Rule: globalRule, Key: keyspace.Counter(keyspace.PerGlobal, string(globalRule.Algorithm), globalRule.Name+"-"+round, o)},
		},
		Cost: 1,
	}
}

// PeerVariants returns the variants of the ToolHive comparison, Callers
// concurrent callers each.
func (r *Redis) PeerVariants() []Variant {
	ctx := context.Background()
	var round atomic.Int64
	scriptStore := r.ScriptStore
	th := rueidis.NewLuaScript(ratelimit.ConsumeAllSource())
	tr, ttr, gr := peerRule("tenant"), peerRule("tool"), peerRule("global")
	parallel := func(b *testing.B, name string, newCall func(round, caller string) func() error) {
		rd := strconv.FormatInt(round.Add(1), 10)
		var id atomic.Int64
		b.ReportAllocs()
		b.SetParallelism(Parallelism())
		cpu0, rcpu0 := processCPU(), r.ServerCPU(ctx)
		defer func() {
			n := float64(b.N)
			b.ReportMetric(float64(processCPU()-cpu0)/n, MetricClientCPU)
			b.ReportMetric(float64(r.ServerCPU(ctx)-rcpu0)/n, MetricServerCPU)
		}()
		b.RunParallel(func(pb *testing.PB) {
			call := newCall(rd, "c"+strconv.FormatInt(id.Add(1), 10))
			for pb.Next() {
				if err := call(); err != nil {
					b.Errorf("%s: %v", name, err)
					return
				}
			}
		})
	}
	denied := errors.New("denied")
	take := func(s *redisstore.Store) func(b *testing.B) {
		return func(b *testing.B) {
			parallel(b, "take", func(rd, caller string) func() error {
				checks := []limit.Check{{Rule: tr, Key: Key("peer-" + rd + "-" + caller)}}
				return func() error {
					d, err := s.Take(ctx, checks, 1)
					if err == nil && !d.Allowed {
						err = denied
					}
					return err
				}
			})
		}
	}
	evaluate := func(s *redisstore.Store) func(b *testing.B) {
		return func(b *testing.B) {
			parallel(b, "evaluate", func(rd, caller string) func() error {
				req := LayeredRequest(rd, "peer-"+rd+"-"+caller, "search", tr, ttr, gr)
				return func() error {
					o, err := s.Evaluate(ctx, req)
					if err == nil && !o.Decision.Allowed {
						err = denied
					}
					return err
				}
			})
		}
	}
	var servers atomic.Int64
	toolhive := func(only bool) func(b *testing.B) {
		return func(b *testing.B) {
			// one limiter per MCP server, shared by its callers, as ToolHive runs it
			srv := "srv-" + strconv.FormatInt(servers.Add(1), 10)
			lim, err := ratelimit.NewLimiter(r.GoRedis, "bench", srv, ToolHiveConfig("search", peerLimit, time.Second, only))
			if err != nil {
				b.Fatal(err)
			}
			parallel(b, "toolhive", func(_, caller string) func() error {
				tool := "search"
				if only {
					tool = ""
				}
				return func() error {
					d, err := lim.Allow(ctx, tool, caller)
					if err == nil && !d.Allowed {
						err = denied
					}
					return err
				}
			})
		}
	}
	toolhiveRaw := func(n int) func(b *testing.B) {
		return func(b *testing.B) {
			parallel(b, "toolhive-rueidis", func(rd, caller string) func() error {
				sfx := []string{"user:" + caller}
				if n == 3 {
					sfx = []string{"shared", "user:" + caller, "user-tool:search:" + caller}
				}
				keys, args := ratelimit.BucketArgs("bench-raw", "srv-"+rd, sfx, peerLimit, time.Second)
				return func() error {
					v, err := th.Exec(ctx, r.Rueidis, keys, args).AsInt64()
					if err == nil && v != 0 {
						err = denied
					}
					return err
				}
			})
		}
	}
	return []Variant{
		{Name: PeerStore, Run: take(r.Store)},
		{Name: PeerStoreScript, Run: take(scriptStore)},
		{Name: PeerToolHive, Run: toolhive(true)},
		{Name: PeerToolHiveScript, Run: toolhiveRaw(1)},
		{Name: PeerStore3, Run: evaluate(r.Store)},
		{Name: PeerStore3Script, Run: evaluate(scriptStore)},
		{Name: PeerStore3TwoTrips, Run: func(b *testing.B) {
			parallel(b, "two calls", func(rd, caller string) func() error {
				req := LayeredRequest(rd, "peer-"+rd+"-"+caller, "search", tr, ttr, gr)
				return func() error {
					d, err := r.Store.Take(ctx, req.Checks, 1)
					if err == nil && d.Allowed {
						d, err = r.Store.Take(ctx, req.Global, 1)
					}
					if err == nil && !d.Allowed {
						err = denied
					}
					return err
				}
			})
		}},
		{Name: PeerToolHive3, Run: toolhive(false)},
		{Name: PeerToolHive3Raw, Run: toolhiveRaw(3)},
	}
}

// MetricP50 is the median latency of one call of a single-caller variant,
// in ns.
const MetricP50 = "p50-ns"

// Single-caller variant names.
const (
	SingleStore3    = "mcpgate/layered/1-caller"
	SingleToolHive3 = "toolhive/layered/1-caller"
)

// SingleVariants returns the layered variants run by one caller, one call
// after the other: their latency, not their throughput (MetricP50).
func (r *Redis) SingleVariants() []Variant {
	ctx := context.Background()
	var round atomic.Int64
	tr, ttr, gr := peerRule("tenant"), peerRule("tool"), peerRule("global")
	sequential := func(b *testing.B, call func() error) {
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			t0 := time.Now()
			if err := call(); err != nil {
				b.Error(err)
				return
			}
			lat = append(lat, time.Since(t0))
		}
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2]), MetricP50)
	}
	return []Variant{
		{Name: SingleStore3, Run: func(b *testing.B) {
			rd := "single-" + strconv.FormatInt(round.Add(1), 10)
			req := LayeredRequest(rd, "single-"+rd, "search", tr, ttr, gr)
			sequential(b, func() error {
				o, err := r.Store.Evaluate(ctx, req)
				if err == nil && !o.Decision.Allowed {
					err = fmt.Errorf("denied: %+v", o.Decision)
				}
				return err
			})
		}},
		{Name: SingleToolHive3, Run: func(b *testing.B) {
			rd := "single-" + strconv.FormatInt(round.Add(1), 10)
			l, err := ratelimit.NewLimiter(r.GoRedis, "bench", rd, ToolHiveConfig("search", peerLimit, time.Second, false))
			if err != nil {
				b.Fatal(err)
			}
			sequential(b, func() error {
				d, err := l.Allow(ctx, "search", "single")
				if err == nil && !d.Allowed {
					err = errors.New("denied")
				}
				return err
			})
		}},
	}
}
