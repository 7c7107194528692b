package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/redisstore"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/setup"
)

// aclRun is what one run of the gateway's stores as the ACL user saw.
type aclRun struct {
	problems []string // failed operations, wrong answers
	denied   []string // ACL LOG entries: "reason object (context, user name)"
	warnings []string // warnings the stores logged
}

// The documented rule, given as it is to a real redis-server, lets the
// gateway's stores (opened by setup.Open, as mcpgate serve does) do all
// their work as the restricted user: the rate-limit store (every
// algorithm, leases, meters, breakers, the usage flush's reads and sweep,
// resets and listings), the result cache of two gateways (a miss, a hit, an
// invalidation, a wait for another gateway's load through SSUBSCRIBE). The
// server refuses nothing but the optional commands, and loads the
// store's function library. With +config|get the startup check runs too.
// Without the channel pattern the same scenario fails: it does catch a
// missing grant.
func TestDeployDocACLServer(t *testing.T) {
	rule := aclRule(t)
	t.Setenv("MCPGATE_ACL_TEST_SECRET", strings.Repeat("s", 32))
	srv := testenv.StartRedis(t, nil)
	admin := srv.Client(t)

	t.Run("as documented", func(t *testing.T) {
		r := runAsACLUser(t, srv, admin, rule)
		for _, p := range r.problems {
			t.Error(p)
		}
		for _, d := range r.denied {
			if !optionalDenial(d) {
				t.Errorf("ACL LOG: the server refused %s", d)
			}
		}
		checked := false
		for _, w := range r.warnings {
			if strings.Contains(w, "cannot read maxmemory-policy") {
				checked = true
			} else {
				t.Errorf("warning: %s", w)
			}
		}
		if !checked {
			t.Errorf("no warning that CONFIG GET was refused, as docs/deploy.md says")
		}
	})

	t.Run("with the optional config get", func(t *testing.T) {
		r := runAsACLUser(t, srv, admin, append(slices.Clone(rule), "+config|get"))
		for _, p := range r.problems {
			t.Error(p)
		}
		for _, d := range r.denied {
			if !optionalDenial(d) || strings.Contains(d, "config|get") {
				t.Errorf("ACL LOG: the server refused %s", d)
			}
		}
		for _, w := range r.warnings {
			t.Errorf("warning: %s", w)
		}
	})

	// A command the scripts run through pcall (they tolerate a key of
	// another type there) that the ACL refuses fails the operation with
	// the server's refusal: it never reads as a missing key or a lease
	// that is gone.
	for cmd, op := range map[string]string{"get": "Take", "zcount": "Take", "zcard": "Refund", "zrem": "Release", "zscore": "Renew"} {
		t.Run("without "+cmd, func(t *testing.T) {
			cut := slices.DeleteFunc(slices.Clone(rule), func(w string) bool { return w == "+"+cmd })
			if len(cut) == len(rule) {
				t.Fatalf("the rule does not grant +%s", cmd)
			}
			r := runAsACLUser(t, srv, admin, cut)
			refused := false
			for _, p := range r.problems {
				byOp := strings.HasPrefix(p, op+" ") || strings.HasPrefix(p, op+":")
				refused = refused || byOp && strings.Contains(p, "can't run this command")
			}
			if !refused {
				t.Fatalf("%s did not fail with the server's refusal of %s: problems %q", op, cmd, r.problems)
			}
			t.Logf("without +%s: %d problems, first: %s", cmd, len(r.problems), r.problems[0])
		})
	}

	t.Run("without the channel pattern", func(t *testing.T) {
		var cut []string
		for _, w := range rule {
			if !strings.HasPrefix(w, "&") {
				cut = append(cut, w)
			}
		}
		if len(cut) == len(rule) {
			t.Fatal("the rule has no channel pattern")
		}
		r := runAsACLUser(t, srv, admin, cut)
		channel := false
		for _, d := range r.denied {
			channel = channel || strings.HasPrefix(d, "channel ")
		}
		if len(r.problems) == 0 || !channel {
			t.Fatalf("the scenario passed without the channel pattern: problems %q, ACL LOG %q", r.problems, r.denied)
		}
		t.Logf("as expected, without the channel pattern: %d problems, first: %s; ACL LOG %q", len(r.problems), r.problems[0], r.denied)
	})
}

// optionalDenial reports whether an ACL LOG entry refuses a command the
// documented rule leaves out on purpose and that a Redis 7 server is sent
// (PUBLISH is only sent where SPUBLISH is missing).
func optionalDenial(d string) bool {
	for _, c := range []string{"config|get", "client|setinfo"} {
		if strings.HasPrefix(d, "command "+c+" ") {
			return true
		}
	}
	return false
}

// runAsACLUser empties srv, sets the ACL user with rule (its password
// filled in), opens the stores of two gateways as that user and runs the
// scenario, then reads the server's ACL LOG.
func runAsACLUser(t *testing.T, srv *testenv.Redis, admin rueidis.Client, rule []string) aclRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var (
		r  aclRun
		mu sync.Mutex // fail is called from the cache's goroutines too
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		r.problems = append(r.problems, fmt.Sprintf(format, args...))
	}
	adminDo := func(words ...string) error {
		return admin.Do(ctx, admin.B().Arbitrary(words...).Build()).Error()
	}

	const pass = "acl-test-Pa55"
	var setuser []string
	for _, w := range rule[2:] { // after ACL SETUSER
		if w == aclPlaceholder {
			w = ">" + pass
		}
		setuser = append(setuser, w)
	}
	for _, words := range [][]string{{"FLUSHALL"}, {"FUNCTION", "FLUSH"}, append([]string{"ACL", "SETUSER"}, setuser...), {"ACL", "LOG", "RESET"}} {
		if err := adminDo(words...); err != nil {
			t.Fatalf("%s: %v", strings.Join(words[:min(len(words), 2)], " "), err)
		}
	}

	var logs testenv.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	url := "redis://" + aclUser + ":" + pass + "@" + srv.Addr + "/0"
	yaml := "upstream: {url: \"http://127.0.0.1:1/mcp\"}\nauth: {jwt: {hs256_secret_env: MCPGATE_ACL_TEST_SECRET}}\n" +
		"store:\n  redis: \"" + url + "\"\n  timeout: 2s\ncache:\n  timeout: 2s\n"
	cfg, err := policy.Parse("acl_test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	var gws [2]*setup.Stores
	for i := range gws {
		st, err := setup.Open(ctx, cfg, log, &setup.Options{NoUsage: true})
		if err != nil {
			t.Fatalf("setup.Open as %s: %v", aclUser, err)
		}
		gws[i] = st
	}
	closed := false
	closeAll := func() {
		if !closed {
			closed = true
			for _, st := range gws {
				if err := st.Close(); err != nil {
					fail("close: %v", err)
				}
			}
		}
	}
	defer closeAll()

	if err := gws[0].Probe(ctx); err != nil {
		fail("store probe (PING): %v", err)
	}
	store, ok := gws[0].Shared.(*redisstore.Store)
	if !ok {
		t.Fatalf("setup.Open's shared store is a %T", gws[0].Shared)
	}
	exerciseStore(ctx, store, fail)
	exerciseCache(ctx, admin, gws[0].Cache, gws[1].Cache, fail)
	closeAll()

	// The store ran its library as a function: FUNCTION LOAD was allowed.
	libs, err := admin.Do(ctx, admin.B().Arbitrary("FUNCTION", "LIST", "LIBRARYNAME", "mcpgate_*").Build()).ToArray()
	if err != nil || len(libs) == 0 {
		fail("no mcpgate function library on the server (FUNCTION LIST: %d, %v): the store did not load it", len(libs), err)
	}

	entries, err := admin.Do(ctx, admin.B().Arbitrary("ACL", "LOG").Build()).ToArray()
	if err != nil {
		t.Fatalf("ACL LOG: %v", err)
	}
	for _, e := range entries {
		m, err := e.AsMap()
		if err != nil {
			t.Fatalf("ACL LOG entry: %v", err)
		}
		str := func(k string) string { v := m[k]; s, _ := v.ToString(); return s }
		r.denied = append(r.denied, fmt.Sprintf("%s %s (%s, user %s)", str("reason"), str("object"), str("context"), str("username")))
	}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if line != "" {
			r.warnings = append(r.warnings, line)
		}
	}
	return r
}

// exerciseStore runs every kind of call of the rate-limit store: every
// algorithm admitting then denying, lease renewal, refund and release, a
// metered take with an op, an adjustment, breaker evaluation, outcome,
// denials, listing and reset, the usage flush's reads, mark and sweep,
// counter listing and reset.
func exerciseStore(ctx context.Context, st *redisstore.Store, fail func(string, ...any)) {
	const tenant = "acme"
	owner := keyspace.Owner{Tenant: tenant, Subject: "alice", Tool: "search"}
	var checks []limit.Check
	for _, alg := range limit.Algorithms {
		checks = append(checks, limit.Check{
			Rule: limit.Rule{Name: "r", Algorithm: alg, Limit: 2, Period: time.Minute},
			Key:  keyspace.Counter(keyspace.PerTenantTool, string(alg), "r", owner),
		})
	}
	var leases []string
	for i := range 3 {
		d, err := st.Take(ctx, checks, 1)
		switch {
		case err != nil:
			fail("Take %d: %v", i+1, err)
		case d.Allowed != (i < 2):
			fail("Take %d: allowed %v, want %v", i+1, d.Allowed, i < 2)
		case d.Allowed:
			leases = append(leases, d.Lease)
		}
	}
	if len(leases) == 2 {
		if held, err := st.Renew(ctx, checks, leases[0]); err != nil || !held {
			fail("Renew: held %v, %v", held, err)
		}
		if err := st.Refund(ctx, checks, 1, leases[1]); err != nil {
			fail("Refund: %v", err)
		}
		if err := st.Release(ctx, checks, leases[0]); err != nil {
			fail("Release: %v", err)
		}
	}
	held, err := st.HeldCounters(ctx, keyspace.ToolCounters(keyspace.PerTenantTool, string(limit.FixedWindow), "r", owner))
	if err != nil || !slices.Contains(held, checks[0].Key) {
		fail("HeldCounters: %q, %v; want %s", held, err, checks[0].Key)
	}
	var keys []string
	for _, c := range checks {
		keys = append(keys, c.Key)
	}
	if n, err := st.Reset(ctx, keys); err != nil || n == 0 {
		fail("Reset: %d, %v", n, err)
	}

	period := "2030-01"
	meter := func() *limit.Meter {
		return &limit.Meter{Key: keyspace.Usage(tenant, period), Tenant: tenant, Period: period, Quota: 1000,
			Seeded: true, ExpireAt: time.Now().Add(40 * 24 * time.Hour), Op: limit.NewOp()}
	}
	tenantCheck := []limit.Check{{
		Rule: limit.Rule{Name: "t", Algorithm: limit.FixedWindow, Limit: 100, Period: time.Minute},
		Key:  keyspace.Counter(keyspace.PerTenant, string(limit.FixedWindow), "t", owner),
	}}
	if d, mr, err := st.TakeMetered(ctx, tenantCheck, *meter(), 1); err != nil || !d.Allowed || !mr.Allowed {
		fail("TakeMetered: %+v, %+v, %v", d, mr, err)
	}
	if _, err := st.Adjust(ctx, *meter(), limit.Usage{Charged: 2}); err != nil {
		fail("Adjust: %v", err)
	}
	br := limit.BreakerSpec{
		Key: keyspace.Breaker(tenant, "subject:alice"), Tenant: tenant, Subject: "alice", ID: "subject:alice",
		ConsecutiveDenials: 5, ConsecutiveFailures: 5,
		IdenticalKey: keyspace.BreakerCall(tenant, "subject:alice", "fp"), IdenticalCount: 2, IdenticalWithin: time.Minute,
		Cooldown: time.Minute, MaxCooldown: 5 * time.Minute, ProbeLease: 10 * time.Second,
	}
	for i := range 3 {
		o, err := st.Evaluate(ctx, limit.Request{Checks: tenantCheck, Meter: meter(), Breaker: &br, Cost: 1})
		switch {
		case err != nil:
			fail("Evaluate %d: %v", i+1, err)
		case i == 2 && !o.Breaker.Open:
			fail("Evaluate %d: the breaker is not open after %d identical calls: %+v", i+1, br.IdenticalCount, o.Breaker)
		}
	}
	if _, err := st.ReportOutcome(ctx, br, true, false); err != nil {
		fail("ReportOutcome: %v", err)
	}
	if _, err := st.AddDenials(ctx, br, 1); err != nil {
		fail("AddDenials: %v", err)
	}
	if err := st.ReleaseProbe(ctx, br); err != nil {
		fail("ReleaseProbe: %v", err)
	}
	var open []string
	if err := st.ListBreakers(ctx, func(b limit.BreakerInfo) error {
		open = append(open, b.Key+" "+b.Reason)
		return nil
	}); err != nil || !slices.Contains(open, br.Key+" "+limit.ReasonIdentical) {
		fail("ListBreakers: %q, %v; want %s %s", open, err, br.Key, limit.ReasonIdentical)
	}
	if found, err := st.ResetBreaker(ctx, br.Key); err != nil || !found {
		fail("ResetBreaker: %v, %v", found, err)
	}

	// The usage flush: read a meter, sweep for unflushed ones, mark flushed.
	ms, ok, err := st.ReadMeter(ctx, meter().Key)
	if err != nil || !ok || ms.Live.Calls == 0 {
		fail("ReadMeter: %+v, %v, %v", ms, ok, err)
	}
	sweep := func() (found bool, err error) {
		err = st.ScanMeters(ctx, func(m limit.MeterState) error {
			found = found || m.Key == ms.Key
			return nil
		})
		return found, err
	}
	if found, err := sweep(); err != nil || !found {
		fail("ScanMeters: found %v, %v; want the unflushed meter", found, err)
	}
	if err := st.MarkFlushed(ctx, ms.Key, ms.Gen.ID, ms.Live); err != nil {
		fail("MarkFlushed: %v", err)
	}
	if found, err := sweep(); err != nil || found {
		fail("ScanMeters after MarkFlushed: found %v, %v; want it flushed", found, err)
	}
}

// exerciseCache runs the cache of two gateways, a and b, on one Redis: a
// miss, a hit from the other gateway, an invalidation, and b waiting for
// the value a loads (b subscribes to the entry's channel and a's commit
// wakes it).
func exerciseCache(ctx context.Context, admin rueidis.Client, a, b *cache.Cache, fail func(string, ...any)) {
	scope := cache.Tenant("acme")
	pol := cache.Policy{TTL: time.Minute, Tags: []string{"q:acl"}}
	value := func(v string) cache.Loader {
		return func(context.Context) ([]byte, bool, error) { return []byte(v), false, nil }
	}
	key, err := cache.NewKey(scope, "search", json.RawMessage(`{"q":"acl"}`))
	if err != nil {
		fail("NewKey: %v", err)
		return
	}
	get := func(what string, c *cache.Cache, k cache.Key, load cache.Loader, want cache.Source, wantValue string) {
		e, src, err := c.Get(ctx, k, load, pol)
		if err != nil || src != want || string(e.Value) != wantValue || e.StoreErr != nil {
			fail("cache %s: %s %q (store error %v), %v; want %s %q", what, src, e.Value, e.StoreErr, err, want, wantValue)
		}
	}
	get("first Get", a, key, value("v1"), cache.Miss, "v1")
	get("Get from the other gateway", b, key, value("other"), cache.Hit, "v1")
	if n, err := a.Invalidate(ctx, scope, []string{"q:acl"}); err != nil || n != 1 {
		fail("cache Invalidate: %d, %v; want 1 entry", n, err)
	}
	get("Get after the invalidation", b, key, value("v2"), cache.Miss, "v2")

	// b waits for the value a is loading.
	key2, err := cache.NewKey(scope, "search", json.RawMessage(`{"q":"wait"}`))
	if err != nil {
		fail("NewKey: %v", err)
		return
	}
	started, release := make(chan struct{}), make(chan struct{})
	aDone, bDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(aDone)
		get("Get that loads", a, key2, func(context.Context) ([]byte, bool, error) {
			close(started)
			<-release
			return []byte("loaded"), false, nil
		}, cache.Miss, "loaded")
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		fail("cache: the loader did not start")
		close(release)
		<-aDone
		return
	}
	var bLoads atomic.Int32
	go func() {
		defer close(bDone)
		get("Get that waits", b, key2, func(context.Context) ([]byte, bool, error) {
			bLoads.Add(1)
			return []byte("not waited"), false, nil
		}, cache.Coalesced, "loaded")
	}()
	channel := keyspace.CacheChannel(key2.String())
	subscribed := false
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && b.Stats().StoreErrors == 0; time.Sleep(5 * time.Millisecond) {
		n, err := admin.Do(ctx, admin.B().PubsubShardnumsub().Channel(channel).Build()).AsIntMap()
		if err != nil {
			fail("PUBSUB SHARDNUMSUB: %v", err)
			break
		}
		if n[channel] > 0 {
			subscribed = true
			break
		}
	}
	if !subscribed {
		fail("cache: the waiting gateway never subscribed to %s", channel)
	}
	close(release)
	for _, done := range []chan struct{}{aDone, bDone} {
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			fail("cache: a Get did not return")
			return
		}
	}
	if n := bLoads.Load(); n != 0 {
		fail("cache: the waiting gateway loaded %d times itself", n)
	}
	for i, c := range []*cache.Cache{a, b} {
		if s := c.Stats(); s.StoreErrors != 0 || s.Degraded != 0 || s.Rejected != 0 || s.Uncached != 0 {
			fail("cache of gateway %d: %+v; want no store error, nothing degraded, rejected or uncached", i+1, s)
		}
	}
	if err := ctx.Err(); err != nil {
		fail("cache: %v", err)
	}
}
