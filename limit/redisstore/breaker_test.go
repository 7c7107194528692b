package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// testBreaker is a breaker of tenant on every trigger, with fingerprint fp.
func testBreaker(tenant, fp string) limit.BreakerSpec {
	return limit.BreakerSpec{
		Key: keyspace.Breaker(tenant, "subject:s"), Tenant: tenant, Subject: "s", ID: "subject:s",
		ConsecutiveDenials: 3, ConsecutiveFailures: 3,
		IdenticalKey: keyspace.BreakerCall(tenant, "subject:s", fp), IdenticalCount: 3, IdenticalWithin: time.Minute,
		Cooldown: 30 * time.Second, MaxCooldown: 5 * time.Minute, ProbeLease: 10 * time.Second,
	}
}

// The script is limit.lua with breaker.lua spliced in once.
func TestScriptSplice(t *testing.T) {
	if strings.Contains(librarySource, breakerMark) || strings.Count(librarySource, breakerSource) != 1 ||
		!strings.HasPrefix(librarySource, limitSource[:strings.Index(limitSource, breakerMark)]) {
		t.Error("librarySource is not limit.lua with breaker.lua in place of its mark")
	}
	for name, src := range map[string]string{"script": scriptSource, "function": functionSource} {
		if strings.Count(src, librarySource) != 1 {
			t.Errorf("the %s form does not hold the library once", name)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("splice without its mark did not panic")
		}
	}()
	splice("no mark", breakerMark, "x")
}

// A call with a breaker is one EVALSHA; without one, Evaluate runs Take or
// TakeMetered and no breaker command; Take keeps its layout (checked by
// TestTakeDoesNoMeterWork).
func TestBreakerOneScript(t *testing.T) {
	_, c, s := startStore(t)
	ctx := ctxT(t)
	checks := tenantChecks("one", rule("fw", limit.FixedWindow, 100, time.Hour), rule("tb", limit.TokenBucket, 100, time.Hour))
	m := testMeter("one", 0)
	b := testBreaker("one", "fp")
	b.IdenticalCount = 1000
	if _, err := s.Evaluate(ctx, limit.Request{Checks: checks, Meter: &m, Breaker: &b, Cost: 1}); err != nil {
		t.Fatal(err) // loads the script
	}
	scripts, _ := libCalls(t, c)
	for range 10 {
		o, err := s.Evaluate(ctx, limit.Request{Checks: checks, Meter: &m, Breaker: &b, Cost: 1})
		if err != nil || !o.Decision.Allowed {
			t.Fatalf("Evaluate: %+v, %v", o, err)
		}
	}
	if after, _ := libCalls(t, c); after-scripts != 10 {
		t.Errorf("10 guarded calls ran %d scripts, want 10", after-scripts)
	}
	var before [3]int64
	for i, cmd := range []string{"hmget", "del", "hset"} {
		before[i], _ = commandCalls(t, c, cmd)
	}
	for range 10 {
		if _, err := s.Evaluate(ctx, limit.Request{Checks: checks, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	for i, cmd := range []string{"hmget", "del", "hset"} {
		if after, _ := commandCalls(t, c, cmd); after != before[i] {
			t.Errorf("10 Evaluates without breaker nor meter ran %s %d times", cmd, after-before[i])
		}
	}
}

// Every key of a guarded call is in the breaker's slot, before any I/O.
func TestBreakerCrossSlot(t *testing.T) {
	_, c, s := startStore(t)
	ctx := ctxT(t)
	before, _ := libCalls(t, c)
	alice, bob := testBreaker("alice", "fp"), testBreaker("bob", "fp")
	checks := tenantChecks("alice", rule("fw", limit.FixedWindow, 5, time.Second))
	m := testMeter("alice", 0)
	mixed := alice
	mixed.IdenticalKey = bob.IdenticalKey
	for name, req := range map[string]limit.Request{
		"breaker of another tenant":   {Checks: checks, Breaker: &bob, Cost: 1},
		"meter of another tenant":     {Meter: &m, Breaker: &bob, Cost: 1},
		"identical key of another":    {Checks: checks, Breaker: &mixed, Cost: 1},
		"breaker alone, mixed tenant": {Breaker: &mixed, Cost: 1},
	} {
		if _, err := s.Evaluate(ctx, req); !errors.Is(err, ErrCrossSlot) || !strings.HasPrefix(err.Error(), "redisstore: ") {
			t.Errorf("%s: %v, want ErrCrossSlot", name, err)
		}
	}
	if after, _ := libCalls(t, c); after != before {
		t.Errorf("refused calls ran %d scripts", after-before)
	}
}

// The breaker hash holds the documented fields, its TTL is its expiry, and
// a reset deletes the counter that opened it.
func TestBreakerHash(t *testing.T) {
	_, c, s := startStore(t)
	ctx := ctxT(t)
	b := testBreaker("hash", "fp")
	var first, now int64
	for k := range 3 {
		o, n, err := s.evaluate(ctx, limit.Request{Breaker: &b, Cost: 1})
		if err != nil || o.Breaker.Opened != (k == 2) {
			t.Fatalf("call %d: %+v, %v", k, o, err)
		}
		if k == 0 {
			first = n
		}
		now = n
	}
	h := hgetall(t, c, b.Key)
	until := now + b.Cooldown.Microseconds()
	x := until + b.MaxCooldown.Microseconds()
	want := map[string]string{
		"s": "1", "u": fmt.Sprint(until), "pu": "0", "cd": fmt.Sprint(b.Cooldown.Microseconds()), "d": "0", "f": "0",
		"r": limit.ReasonIdentical, "ik": b.IdenticalKey, "ic": "3", "x": fmt.Sprint(x), "t": "hash", "sb": "s", "id": "subject:s",
	}
	if fmt.Sprint(h) != fmt.Sprint(want) {
		t.Errorf("breaker hash\n %v\nwant\n %v", h, want)
	}
	ttl, err := c.Do(ctx, c.B().Pttl().Key(b.Key).Build()).AsInt64()
	if wantMS := (x - now) / 1000; err != nil || ttl > wantMS || ttl < wantMS-2000 {
		t.Errorf("PTTL %d, %v; want about %d ms", ttl, err, wantMS)
	}
	// the window ends IdenticalWithin after the first call
	calls, err := c.Do(ctx, c.B().Get().Key(b.IdenticalKey).Build()).ToString()
	if want := fmt.Sprintf("%d 3", first+b.IdenticalWithin.Microseconds()); err != nil || calls != want {
		t.Errorf("identical counter %q, %v; want %q", calls, err, want)
	}
	if ok, err := s.ResetBreaker(ctx, b.Key); !ok || err != nil {
		t.Fatalf("ResetBreaker: %v, %v", ok, err)
	}
	n, err := c.Do(ctx, c.B().Exists().Key(b.Key, b.IdenticalKey).Build()).AsInt64()
	if err != nil || n != 0 {
		t.Errorf("after ResetBreaker, %d of the breaker and its counter exist (%v)", n, err)
	}
}

// A ListBreakers with a canceled context is an error, not a silent empty
// listing.
func TestListBreakersErrors(t *testing.T) {
	_, _, s := startStore(t)
	ctx := ctxT(t)
	b := testBreaker("list", "fp")
	b.ConsecutiveFailures = 1
	if _, err := s.ReportOutcome(ctx, b, true, false); err != nil {
		t.Fatal(err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.ListBreakers(canceled, func(limit.BreakerInfo) error { return nil }); err == nil {
		t.Error("ListBreakers with a canceled context: no error")
	}
	n := 0
	if err := s.ListBreakers(ctx, func(limit.BreakerInfo) error { n++; return nil }); err != nil || n != 1 {
		t.Errorf("ListBreakers: %d listed, %v", n, err)
	}
}
