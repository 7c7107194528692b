package redisstore

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/internal/algo"
)

// rawScript runs the store's library as a script, with the KEYS and ARGV
// limit.lua documents.
var rawScript = rueidis.NewLuaScript(scriptSource)

// testTimeout replaces DefaultTimeout in tests: a loaded CI machine running
// -race must not turn slow calls into failures. Tests of the timeout itself
// set their own.
const testTimeout = 5 * time.Second

func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

func newStore(tb testing.TB, c rueidis.Client, timeout time.Duration) *Store {
	tb.Helper()
	return newStoreOpts(tb, c, &Options{Timeout: timeout})
}

// warmUp runs call, the first of a store with a short timeout under test,
// until it succeeds (for up to 10 s): it also dials and loads the library,
// which on a loaded machine can take longer than that timeout.
func warmUp(tb testing.TB, call func() error) {
	tb.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		err := call()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatal(err)
		}
	}
}

// newStoreOpts is newStore with options.
func newStoreOpts(tb testing.TB, c rueidis.Client, o *Options) *Store {
	tb.Helper()
	s, err := New(c, o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close) // before the client's Close: cleanups run last first
	return s
}

// startStore starts a plain redis-server and a Store on it.
func startStore(tb testing.TB) (*testenv.Redis, rueidis.Client, *Store) {
	tb.Helper()
	r := testenv.StartRedis(tb, nil)
	c := r.Client(tb)
	return r, c, newStore(tb, c, testTimeout)
}

// taker returns a function taking one unit of checks on s; an error fails
// the test.
func taker(tb testing.TB, ctx context.Context, s *Store, checks []limit.Check) func() limit.Decision {
	return func() limit.Decision {
		tb.Helper()
		d, err := s.Take(ctx, checks, 1)
		if err != nil {
			tb.Fatal(err)
		}
		return d
	}
}

// tenantChecks builds checks of rules on tenant's counters: one slot.
func tenantChecks(tenant string, rules ...limit.Rule) []limit.Check {
	checks := make([]limit.Check, len(rules))
	for i, r := range rules {
		checks[i] = limit.Check{Rule: r, Key: keyspace.RateLimit(keyspace.PerTenant, r.Name, keyspace.Owner{Tenant: tenant})}
	}
	return checks
}

// splitGlobal is the check of global rule r, failing t when its key shares
// the slot of tenantKey: a Cluster would not split the request, and the
// test would prove nothing.
func splitGlobal(t *testing.T, r limit.Rule, tenantKey string) limit.Check {
	t.Helper()
	c := limit.Check{Rule: r, Key: keyspace.RateLimit(keyspace.PerGlobal, r.Name, keyspace.Owner{})}
	if keyspace.Slot(c.Key) == keyspace.Slot(tenantKey) {
		t.Fatal("the global key shares the tenant's slot: no split, the test proves nothing")
	}
	return c
}

// serverNow is the Redis time in the scripts' microseconds, without offset.
func serverNow(tb testing.TB, c rueidis.Client) int64 {
	tb.Helper()
	ctx := ctxT(tb)
	// On a cluster TIME goes to any node; in tests they share one clock.
	arr, err := c.Do(ctx, c.B().Time().Build()).AsStrSlice()
	if err != nil || len(arr) != 2 {
		tb.Fatalf("TIME: %v %v", arr, err)
	}
	sec, _ := strconv.ParseInt(arr[0], 10, 64)
	usec, _ := strconv.ParseInt(arr[1], 10, 64)
	return (sec-1577836800)*1e6 + usec
}

// align moves the store's clock forward so that it reads 1 ms past a
// multiple of p: scenarios then start at a known place in their windows
// (give or take the few milliseconds the scenario itself takes).
func align(tb testing.TB, c rueidis.Client, s *Store, p time.Duration) {
	tb.Helper()
	now := serverNow(tb, c) + s.offset.Load()
	us := p.Microseconds()
	target := (now/us+1)*us + 1000
	s.offset.Add(target - now)
}

// model runs package algo on explicit states, the way every store must
// combine it: evaluate all, then charge the allowed checks only when every
// enforced one allows.
type model struct{ states map[string]*algo.State }

func newModel() *model { return &model{states: map[string]*algo.State{}} }

func (m *model) state(key string) *algo.State {
	st := m.states[key]
	if st == nil {
		st = &algo.State{}
		m.states[key] = st
	}
	return st
}

func (m *model) take(checks []limit.Check, now, cost int64, lease string) []limit.Result {
	res := make([]limit.Result, len(checks))
	admit := true
	for i, c := range checks {
		res[i] = algo.Eval(c.Rule, m.state(c.Key), now, cost, lease, false)
		admit = admit && (res[i].Allowed || c.Rule.Shadow)
	}
	if admit {
		for i, c := range checks {
			if res[i].Allowed {
				algo.Eval(c.Rule, m.state(c.Key), now, cost, lease, true)
			}
		}
	}
	return res
}

func (m *model) refund(checks []limit.Check, now, cost int64, lease string) {
	for _, c := range checks {
		algo.Refund(c.Rule, m.state(c.Key), now, cost, lease)
	}
}

func (m *model) release(checks []limit.Check, lease string) {
	for _, c := range checks {
		algo.Release(c.Rule, m.state(c.Key), lease)
	}
}

type opKind int

const (
	opTakeStep opKind = iota
	opRefundStep
	opReleaseStep
)

func (o opKind) String() string { return [...]string{"take", "refund", "release"}[o] }

// step is one call of a scenario.
type step struct {
	advance time.Duration // added to the store's clock first
	op      opKind
	cost    int64         // take and refund; 0 means 1
	checks  []limit.Check // when set, the batch from this step on (a config reload)
}

// runner plays steps against a Store and the model, and fails on the first
// difference. Refund and Release use the lease of the last admitted Take.
type runner struct {
	tb     testing.TB
	s      *Store
	c      rueidis.Client
	m      *model
	checks []limit.Check
	lease  string
	n      int
	// counts of per-check outcomes seen, to show a scenario covers both
	allowed, denied, never int
}

func newRunner(tb testing.TB, c rueidis.Client, s *Store, checks []limit.Check) *runner {
	return &runner{tb: tb, s: s, c: c, m: newModel(), checks: checks}
}

func (r *runner) run(steps ...step) {
	r.tb.Helper()
	for _, st := range steps {
		r.do(st)
	}
}

func (r *runner) do(st step) {
	r.tb.Helper()
	r.n++
	ctx := ctxT(r.tb)
	if st.checks != nil {
		r.checks = st.checks
	}
	cost := max(st.cost, 1)
	r.s.offset.Add(st.advance.Microseconds())
	switch st.op {
	case opTakeStep:
		began := time.Now()
		got, lease, now, err := r.s.take(ctx, r.checks, cost)
		if err != nil {
			r.tb.Fatalf("step %d: take(cost %d): %v", r.n, cost, err)
		}
		want := r.m.take(r.checks, now, cost, lease)
		for i := range want {
			if !reflect.DeepEqual(got[i], want[i]) {
				r.tb.Fatalf("step %d: take(cost %d) at %d, check %d (%s %+v):\n got  %+v\n want %+v",
					r.n, cost, now, i, r.checks[i].Rule.Algorithm, r.checks[i].Rule, got[i], want[i])
			}
			switch {
			case want[i].RetryAfter == limit.Never:
				r.never++
			case want[i].Allowed:
				r.allowed++
			default:
				r.denied++
			}
		}
		d := limit.Combine(r.checks, got, lease)
		if d.Allowed {
			if d.Lease != "" {
				r.lease = d.Lease
			}
			for i, c := range r.checks {
				if got[i].Allowed {
					r.checkTTL(c.Key, r.m.state(c.Key).ExpiresAt-now, began)
				}
			}
		}
	case opRefundStep:
		now, err := r.s.refundAt(ctx, r.checks, cost, r.lease, -1)
		if err != nil {
			r.tb.Fatalf("step %d: refund: %v", r.n, err)
		}
		r.m.refund(r.checks, now, cost, r.lease)
	case opReleaseStep:
		if err := r.s.Release(ctx, r.checks, r.lease); err != nil {
			r.tb.Fatalf("step %d: release: %v", r.n, err)
		}
		r.m.release(r.checks, r.lease)
	}
}

// checkTTL verifies that a key just written expires when algo says its
// state is fresh again: ttlUS after the script's now, in ms rounded up.
func (r *runner) checkTTL(key string, ttlUS int64, began time.Time) {
	r.tb.Helper()
	ctx := ctxT(r.tb)
	want := max(1, (ttlUS+999)/1000)
	got, err := r.c.Do(ctx, r.c.B().Pttl().Key(key).Build()).AsInt64()
	if err != nil {
		r.tb.Fatalf("PTTL %s: %v", key, err)
	}
	elapsed := time.Since(began).Milliseconds() + 1
	switch {
	case got == -2 && elapsed >= want: // expired meanwhile
	case got < 0 || got > want || got < want-elapsed:
		r.tb.Fatalf("step %d: PTTL %s = %d ms, want %d ms (minus the %d ms elapsed)", r.n, key, got, want, elapsed)
	}
}

// allKeysExpire fails unless every key in the database has a TTL.
func allKeysExpire(tb testing.TB, c rueidis.Client) int {
	tb.Helper()
	ctx := ctxT(tb)
	n := 0
	var cursor uint64
	for {
		e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Count(1000).Build()).AsScanEntry()
		if err != nil {
			tb.Fatalf("SCAN: %v", err)
		}
		for _, k := range e.Elements {
			ttl, err := c.Do(ctx, c.B().Pttl().Key(k).Build()).AsInt64()
			if err != nil {
				tb.Fatalf("PTTL %s: %v", k, err)
			}
			if ttl == -1 {
				tb.Errorf("key %s has no TTL", k)
			}
			n++
		}
		if cursor = e.Cursor; cursor == 0 {
			return n
		}
	}
}

// commandCalls returns the calls and failed calls of cmd in INFO
// commandstats.
func commandCalls(tb testing.TB, c rueidis.Client, cmd string) (calls, failed int64) {
	tb.Helper()
	info, err := c.Do(ctxT(tb), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(field, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				calls = n
			case "failed_calls", "rejected_calls":
				failed += n
			}
		}
	}
	return calls, failed
}

func rule(name string, a limit.Algorithm, lim int64, p time.Duration) limit.Rule {
	return limit.Rule{Name: name, Algorithm: a, Limit: lim, Period: p}
}

func (r *runner) String() string {
	return fmt.Sprintf("%d steps: %d allowed, %d denied, %d never", r.n, r.allowed, r.denied, r.never)
}

// libCalls counts the calls of the store's library the server ran, as a
// function (FCALL) or a script (EVALSHA, EVAL).
func libCalls(tb testing.TB, c rueidis.Client) (calls, failed int64) {
	tb.Helper()
	for _, cmd := range []string{"fcall", "evalsha", "eval"} {
		n, f := commandCalls(tb, c, cmd)
		calls += n
		failed += f
	}
	return calls, failed
}
