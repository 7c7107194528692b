package policy

import (
	"errors"
	"os"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// head makes a config valid on its own; cases append to it from line 3.
const head = "upstream: {url: http://127.0.0.1:9000/mcp}\nauth: {jwt: {hs256_secret_env: SECRET}}\n"

func TestExampleLoads(t *testing.T) {
	t.Setenv("UPSTREAM_TOKEN", "tok")
	c, err := Load("testdata/mcpgate.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 0 {
		t.Errorf("warnings: %q", c.Warnings)
	}
	if c.Path != "testdata/mcpgate.example.yaml" || c.Listen != "127.0.0.1:8080" {
		t.Errorf("path %q listen %q", c.Path, c.Listen)
	}
	wantUp := Upstream{
		URL:             "http://127.0.0.1:9000/mcp",
		Headers:         map[string]string{"Authorization": "Bearer tok"},
		IdentityHeaders: true,
		MaxBodyBytes:    4 << 20,
		Timeout:         60 * time.Second,
	}
	if !reflect.DeepEqual(c.Upstream, wantUp) {
		t.Errorf("upstream = %+v, want %+v", c.Upstream, wantUp)
	}
	wantAuth := Auth{JWT: JWT{HS256SecretEnv: "MCPGATE_JWT_SECRET", TenantClaim: "tenant_id", TierClaim: "tier", ScopeClaim: "scope", RequireExpiry: true, Leeway: 30 * time.Second}, AdminTokenEnv: "MCPGATE_ADMIN_TOKEN"}
	if !reflect.DeepEqual(c.Auth, wantAuth) {
		t.Errorf("auth = %+v", c.Auth)
	}
	if c.Store.Redis != nil || c.Store.Timeout != 25*time.Millisecond || c.Store.OnError != FailOpen {
		t.Errorf("store = %+v", c.Store)
	}
	if c.Usage != (Usage{Store: "sqlite:mcpgate-usage.db", FlushInterval: time.Second}) {
		t.Errorf("usage = %+v", c.Usage)
	}
	if kind, target := c.Usage.Backend(); kind != "sqlite" || target != "mcpgate-usage.db" {
		t.Errorf("backend = %q %q", kind, target)
	}
	wantTiers := map[string]Tier{
		"free": {MonthlyQuota: 100000, Limits: []Rule{
			rule("per_tenant", keyspace.PerTenant, limit.TokenBucket, 30, time.Minute, 20, false),
			rule("per_tool", keyspace.PerTenantTool, limit.SlidingWindow, 10, time.Minute, 0, false),
		}},
		"enterprise": {Limits: []Rule{
			rule("per_tenant", keyspace.PerTenant, limit.GCRA, 1000, time.Second, 2000, false),
			rule("per_user", keyspace.PerSubject, limit.SlidingWindowCounter, 600, time.Minute, 0, false),
		}},
	}
	if c.DefaultTier != "free" || !reflect.DeepEqual(c.Tiers, wantTiers) {
		t.Errorf("default %q tiers = %+v", c.DefaultTier, c.Tiers)
	}
	wantGlobal := []Rule{rule("all_tenants", keyspace.PerGlobal, limit.FixedWindow, 10000, time.Minute, 0, false)}
	if !reflect.DeepEqual(c.Global, wantGlobal) {
		t.Errorf("global = %+v", c.Global)
	}
	wantCache := Cache{Timeout: DefaultCacheTimeout, Warm: []Warm{{Tool: "search", Args: map[string]any{"query": "pricing"}, Tenant: "acme"}}}
	if !reflect.DeepEqual(c.Cache, wantCache) {
		t.Errorf("cache = %+v", c.Cache)
	}
	wantTools := map[string]Tool{
		"search": {Cost: Cost{Fixed: 1}, Cache: &ToolCache{TTL: 10 * time.Minute, Jitter: 0.10, NegativeTTL: time.Minute, Tags: []string{"product:{{args.id}}"}}},
		"llm_complete": {Cost: Cost{Estimate: 150, FromResult: "_meta.usage.tokens"}, OnError: FailClosed, Limits: []Rule{
			rule("llm_calls", keyspace.PerTenantTool, limit.TokenBucket, 10, time.Minute, 0, false),
			rule("llm_in_flight", keyspace.PerTenantTool, limit.Concurrency, 2, 5*time.Minute, 0, false),
			rule("llm_trial", keyspace.PerSubjectTool, limit.FixedWindow, 100, time.Hour, 0, true),
		}},
		"update_product": {Cost: Cost{Fixed: 1}, Invalidates: []string{"product:{{args.id}}"}},
	}
	if !reflect.DeepEqual(c.Tools, wantTools) {
		t.Errorf("tools = %+v\nwant %+v", c.Tools, wantTools)
	}
	wantBreaker := Breaker{Key: "subject", ConsecutiveDenials: 5, ConsecutiveFailures: 5,
		IdenticalCalls: IdenticalCalls{Count: 20, Within: time.Minute}, Cooldown: 30 * time.Second, MaxCooldown: 10 * time.Minute}
	if c.Breaker != wantBreaker || !c.Breaker.Enabled() {
		t.Errorf("breaker = %+v", c.Breaker)
	}
}

func rule(name string, per keyspace.Per, a limit.Algorithm, n int64, p time.Duration, burst int64, shadow bool) Rule {
	return Rule{Rule: limit.Rule{Name: name, Algorithm: a, Limit: n, Period: p, Burst: burst, Shadow: shadow}, Per: per}
}

// The example must load without the variables it references.
func TestExampleUnsetVariableWarns(t *testing.T) {
	t.Setenv("UPSTREAM_TOKEN", "")
	os.Unsetenv("UPSTREAM_TOKEN")
	c, err := Load("testdata/mcpgate.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`testdata/mcpgate.example.yaml:10: upstream.headers.Authorization: environment variable UPSTREAM_TOKEN is not set (expands to "")`}
	if !reflect.DeepEqual(c.Warnings, want) {
		t.Errorf("warnings = %q, want %q", c.Warnings, want)
	}
	if got := c.Upstream.Headers["Authorization"]; got != "Bearer " {
		t.Errorf("header = %q", got)
	}
}

func TestDefaults(t *testing.T) {
	c, err := Parse("m.yaml", []byte(head))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Path:        "m.yaml",
		Listen:      "127.0.0.1:8080",
		Upstream:    Upstream{URL: "http://127.0.0.1:9000/mcp", Headers: map[string]string{}, MaxBodyBytes: 4 << 20, Timeout: time.Minute},
		Auth:        Auth{JWT: JWT{HS256SecretEnv: "SECRET", TenantClaim: "tenant_id", TierClaim: "tier", ScopeClaim: "scope", RequireExpiry: true, Leeway: 30 * time.Second}},
		Store:       Store{Timeout: 25 * time.Millisecond, OnError: FailOpen},
		Usage:       Usage{Store: "sqlite:mcpgate-usage.db", FlushInterval: time.Second},
		Cache:       Cache{Timeout: 25 * time.Millisecond},
		DefaultTier: "free",
		Tiers:       map[string]Tier{},
		Tools:       map[string]Tool{},
		Breaker:     Breaker{Key: "subject", Cooldown: 30 * time.Second, MaxCooldown: 10 * time.Minute},
		Server: Server{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 60 * time.Second, IdleTimeout: 180 * time.Second,
			WriteTimeout: 60 * time.Second, MaxConnections: 1024, MaxRequestsPerTenant: 256, derivedTenantCap: 256},
		Sessions: Sessions{MaxPerTenant: 100, MaxPerSubject: 10, IdleTimeout: 30 * time.Minute},
	}
	c.rules, c.methodRules, c.methodGlobal, c.global = nil, nil, nil, nil
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got  %+v\nwant %+v", c, want)
	}
	if c.Breaker.Enabled() {
		t.Error("breaker enabled by default")
	}
	// Null values keep defaults too.
	c, err = Parse("m.yaml", []byte(head+"listen:\nstore: {timeout: ~, on_error: null}\nbreaker:\ntiers:\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != DefaultListen || c.Store.Timeout != DefaultStoreTimeout || c.Store.OnError != FailOpen {
		t.Errorf("nulls did not keep defaults: %+v", c)
	}
}

func TestGoodValues(t *testing.T) {
	t.Setenv("MCPGATE_TEST_HOST", "up.example")
	c, err := Parse("m.yaml", []byte(`
listen: ":0"
upstream:
  url: https://${MCPGATE_TEST_HOST}/mcp
  headers: {X-Literal: "$${NOT_EXPANDED} $5"}
  max_body_bytes: 1_000
  timeout: 2m
auth: {jwt: {jwks_url: "https://idp/jwks", issuer: iss}, admin_token_env: ADMIN}
store:
  redis: [10.0.0.1:7000, "10.0.0.2:7001"]
  on_error: local
usage: {store: "dynamodb:mcpgate-usage", flush_interval: 250ms}
tools:
  t:
    cost: 16
    cache: &c {ttl: 1h, jitter: "12.5%", shared: true}
  u:
    cache: {<<: *c, ttl: 2s}
  v: {<<: [{cost: 3, on_error: closed}, {cost: 4, invalidates: ["x"]}], on_error: open}
cache:
  redis: "rediss://u:p@cache:6380/2"
  timeout: 40ms
  max_entries: 5_000
  max_bytes: 67_108_864
  warm:
    - tool: t
      args: {s: x, i: -3, f: 2.5, b: false, "n": null, l: [1, {k: v}], ts: 2024-01-02, q: "7"}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != ":0" || c.Upstream.URL != "https://up.example/mcp" || c.Upstream.MaxBodyBytes != 1000 || c.Upstream.Timeout != 2*time.Minute {
		t.Errorf("upstream %+v listen %q", c.Upstream, c.Listen)
	}
	if got := c.Upstream.Headers["X-Literal"]; got != "${NOT_EXPANDED} $5" {
		t.Errorf("literal header = %q", got)
	}
	if c.Auth.JWT.JWKSURL != "https://idp/jwks" || c.Auth.JWT.Issuer != "iss" || c.Auth.AdminTokenEnv != "ADMIN" {
		t.Errorf("auth %+v", c.Auth)
	}
	if !reflect.DeepEqual(c.Store.Redis, []string{"10.0.0.1:7000", "10.0.0.2:7001"}) || c.Store.OnError != FailLocal {
		t.Errorf("store %+v", c.Store)
	}
	if !reflect.DeepEqual(c.Cache.Redis, []string{"rediss://u:p@cache:6380/2"}) || c.Cache.Timeout != 40*time.Millisecond ||
		c.Cache.MaxEntries != 5000 || c.Cache.MaxBytes != 64<<20 {
		t.Errorf("cache %+v", c.Cache)
	}
	if k, tb := c.Usage.Backend(); k != "dynamodb" || tb != "mcpgate-usage" || c.Usage.FlushInterval != 250*time.Millisecond {
		t.Errorf("usage %+v", c.Usage)
	}
	if got := c.Tools["t"]; got.Cost != (Cost{Fixed: 16}) || !reflect.DeepEqual(*got.Cache, ToolCache{TTL: time.Hour, Jitter: 0.125, Shared: true}) {
		t.Errorf("tool t %+v %+v", got, got.Cache)
	}
	if got := c.Tools["u"].Cache; !reflect.DeepEqual(*got, ToolCache{TTL: 2 * time.Second, Jitter: 0.125, Shared: true}) {
		t.Errorf("merged cache %+v", got)
	}
	if got := c.Tools["v"]; got.Cost != (Cost{Fixed: 3}) || got.OnError != FailOpen || !reflect.DeepEqual(got.Invalidates, []string{"x"}) {
		t.Errorf("merged list: %+v", got)
	}
	if c.DefaultTier != "free" {
		t.Errorf("default tier %q", c.DefaultTier)
	}
	wantArgs := map[string]any{"s": "x", "i": int64(-3), "f": 2.5, "b": false, "n": nil,
		"l": []any{int64(1), map[string]any{"k": "v"}}, "ts": "2024-01-02", "q": "7"}
	if len(c.Cache.Warm) != 1 || c.Cache.Warm[0].Tenant != "" || !reflect.DeepEqual(c.Cache.Warm[0].Args, wantArgs) {
		t.Errorf("warm = %#v", c.Cache.Warm)
	}
}

func TestRulesFor(t *testing.T) {
	c, err := Parse("m.yaml", []byte(head+`
default_tier: basic
tiers:
  basic:
    limits: [{name: b, algorithm: fixed_window, limit: 5, period: 1s}]
  pro:
    limits:
      - {name: p, algorithm: gcra, limit: 50, period: 1s, burst: 100}
      - {name: q, per: subject_tool, algorithm: sliding_window, limit: 5, period: 1s}
global:
  - {name: g, per: global, algorithm: fixed_window, limit: 1000, period: 1s}
tools:
  slow:
    on_error: closed
    cost: 7
    limits: [{name: s, algorithm: concurrency, limit: 2, period: 1m}]
`))
	if err != nil {
		t.Fatal(err)
	}
	b := rule("b", keyspace.PerTenant, limit.FixedWindow, 5, time.Second, 0, false)
	p := rule("p", keyspace.PerTenant, limit.GCRA, 50, time.Second, 100, false)
	q := rule("q", keyspace.PerSubjectTool, limit.SlidingWindow, 5, time.Second, 0, false)
	s := rule("s", keyspace.PerTenantTool, limit.Concurrency, 2, time.Minute, 0, false)
	g := rule("g", keyspace.PerGlobal, limit.FixedWindow, 1000, time.Second, 0, false)
	for _, tc := range []struct {
		tier, tool string
		want       []Rule
	}{
		{"pro", "slow", []Rule{p, q, s}},
		{"pro", "other", []Rule{p, q}},
		{"basic", "slow", []Rule{b, s}},
		{"unknown", "slow", []Rule{b, s}},
		{"", "", []Rule{b}},
	} {
		got, global := c.RulesFor(tc.tier, tc.tool)
		if !reflect.DeepEqual(got, tc.want) || !reflect.DeepEqual(global, []Rule{g}) {
			t.Errorf("RulesFor(%q, %q) = %v, %v; want %v", tc.tier, tc.tool, got, global, tc.want)
		}
		if cap(got) != len(got) || cap(global) != len(global) {
			t.Errorf("RulesFor(%q, %q) has spare capacity: appends would write into shared memory", tc.tier, tc.tool)
		}
		// A Config built by hand (no index) gives the same answer.
		hand := *c
		hand.rules = nil
		if got2, _ := hand.RulesFor(tc.tier, tc.tool); !reflect.DeepEqual(got2, tc.want) {
			t.Errorf("unindexed RulesFor(%q, %q) = %v", tc.tier, tc.tool, got2)
		}
	}
	if name, tier, ok := c.ResolveTier("nope"); name != "basic" || !ok || len(tier.Limits) != 1 {
		t.Errorf("ResolveTier = %q %v %v", name, tier, ok)
	}
	if got := c.ToolOnError("slow"); got != FailClosed {
		t.Errorf("ToolOnError(slow) = %q", got)
	}
	if got := c.ToolOnError("other"); got != FailOpen {
		t.Errorf("ToolOnError(other) = %q", got)
	}
	if got := c.ToolCost("slow"); got != (Cost{Fixed: 7}) || got.Charge() != 7 {
		t.Errorf("ToolCost(slow) = %+v", got)
	}
	if got := c.ToolCost("other"); got != (Cost{Fixed: 1}) {
		t.Errorf("ToolCost(other) = %+v", got)
	}
	if got := (Cost{Estimate: 150, FromResult: "x"}).Charge(); got != 150 {
		t.Errorf("Charge = %d", got)
	}

	// No tiers: only the tool's rules.
	c, err = Parse("m.yaml", []byte(head+"tools: {t: {limits: [{name: s, algorithm: concurrency, limit: 2, period: 1m}]}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got, global := c.RulesFor("any", "t"); !reflect.DeepEqual(got, []Rule{s.withName("s")}) || global != nil {
		t.Errorf("no tiers: %v %v", got, global)
	}
	if got, _ := c.RulesFor("any", "x"); got != nil {
		t.Errorf("no tiers, unknown tool: %v", got)
	}
}

// A Config is read by every request goroutine at once.
func TestConcurrentReads(t *testing.T) {
	c, err := Load("testdata/mcpgate.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := c.RulesFor("enterprise", "llm_complete")
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				got, _ := c.RulesFor("enterprise", "llm_complete")
				_, _ = c.RulesFor("nope", "nope")
				_ = c.ToolCost("search")
				_ = c.ToolOnError("search")
				if len(got) != len(want) {
					t.Error("rules changed")
					return
				}
			}
		}()
	}
	wg.Wait()
}

func (r Rule) withName(n string) Rule { r.Name = n; return r }

func TestErrorTypes(t *testing.T) {
	_, err := Parse("m.yaml", []byte(head+"listen: 1\nbogus: 2\n"))
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("errors.Is(%v, ErrInvalidConfig) = false", err)
	}
	var es Errors
	if !errors.As(err, &es) || len(es) != 2 {
		t.Fatalf("errors.As Errors: %v", err)
	}
	var e *Error
	if !errors.As(err, &e) || e.File != "m.yaml" || e.Line != 3 || e.Field != "listen" {
		t.Fatalf("errors.As *Error: %+v", e)
	}
	if !errors.Is(e, ErrInvalidConfig) {
		t.Error("*Error is not ErrInvalidConfig")
	}
	_, err = Load("testdata/does-not-exist.yaml")
	if err == nil || errors.Is(err, ErrInvalidConfig) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v", err)
	}
}

// Hostile documents end quickly with an error instead of hanging or
// exhausting memory.
// aliasBomb names one rule 10^6 times through 6 levels of aliased lists and
// puts the lot into a warm entry's arguments.
func aliasBomb() []byte {
	var b strings.Builder
	b.WriteString(head + "x0: &a0 {name: a, algorithm: fixed_window, limit: 1, period: 1s}\n")
	prev := "a0"
	for i := 1; i <= 6; i++ {
		b.WriteString("x" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [")
		for j := 0; j < 10; j++ {
			b.WriteString("*" + prev + ", ")
		}
		b.WriteString("]\n")
		prev = "a" + string(rune('0'+i))
	}
	b.WriteString("cache: {warm: [{tool: t, tenant: x, args: {bomb: *a6}}]}\n")
	b.WriteString("tools: {t: {cache: {ttl: 1s}}}\n")
	return []byte(b.String())
}

// aliasedTiers gives tiers tiers one shared list of 300 rules: about
// 2700*tiers nodes once aliases are expanded.
func aliasedTiers(tiers int) []byte {
	var b strings.Builder
	b.WriteString(head + "tiers:\n  t0:\n    limits: &l\n")
	for i := 0; i < 300; i++ {
		b.WriteString("      - {name: r" + strconv.Itoa(i) + ", algorithm: fixed_window, limit: 1, period: 1s}\n")
	}
	for i := 1; i < tiers; i++ {
		b.WriteString("  t" + strconv.Itoa(i) + ": {limits: *l}\n")
	}
	return []byte(b.String())
}

// mallocs counts the heap allocations f makes. Allocations track the work
// Parse does node by node, and unlike elapsed time they do not depend on the
// machine's load or the race detector's speed.
func mallocs(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.Mallocs - before.Mallocs
}

// TestHostileDocuments checks that the budgets bound the work of small files
// that expand to huge ones. The allocation bounds sit several times above what
// Parse makes with the budgets and several times below what it makes without
// them (the alias bomb ~30k with maxArgNodes, ~1.7M without; the aliased tiers
// ~3M with maxVisits, ~30M without). BenchmarkParseHostile gives the speed.
func TestHostileDocuments(t *testing.T) {
	var err error
	n := mallocs(func() { _, err = Parse("m.yaml", aliasBomb()) })
	if err == nil || !strings.Contains(err.Error(), "too large (more than 10000 values)") {
		t.Errorf("alias bomb: %v", err)
	}
	if limit := uint64(10 * maxArgNodes); n > limit {
		t.Errorf("alias bomb made %d allocations, want at most %d (10 per warm argument value)", n, limit)
	}

	// Many tiers sharing a long list of rules (10^7 nodes expanded): the
	// visit budget stops it.
	n = mallocs(func() { _, err = Parse("m.yaml", aliasedTiers(4000)) })
	if err == nil || !strings.Contains(err.Error(), "document too large: more than 1048576 nodes (after expanding aliases)") {
		t.Errorf("aliased tiers: %.500v", err)
	}
	if limit := uint64(8 * maxVisits); n > limit {
		t.Errorf("aliased tiers made %d allocations, want at most %d (8 per visited node)", n, limit)
	}
	if es := err.(Errors); len(es) > maxErrors+1 {
		t.Errorf("%d problems reported", len(es))
	}

	// An anchor that contains itself.
	_, err = Parse("m.yaml", []byte(head+"tools: {t: {cache: {ttl: 1s}}}\ncache: {warm: [{tool: t, tenant: x, args: &a {self: *a}}]}\n"))
	if err == nil || !strings.Contains(err.Error(), "too large") {
		t.Errorf("recursive args: %v", err)
	}
}

// BenchmarkParseHostile measures how long Parse takes to refuse the hostile
// documents of TestHostileDocuments, next to the example configuration.
func BenchmarkParseHostile(b *testing.B) {
	example, err := os.ReadFile("testdata/mcpgate.example.yaml")
	if err != nil {
		b.Fatal(err)
	}
	b.Setenv("UPSTREAM_TOKEN", "tok")
	for _, c := range []struct {
		name string
		doc  []byte
	}{
		{"example", example},
		{"alias_bomb", aliasBomb()},
		{"aliased_tiers", aliasedTiers(4000)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = Parse("m.yaml", c.doc)
			}
		})
	}
}
