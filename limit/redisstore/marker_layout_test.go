package redisstore

import (
	"testing"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// A function library keeps takeLayout's formats by shape: a metered take
// with a breaker and no checks, after a plain metered take with no checks,
// gets the layout with the breaker's block (once, keyed by -n, both shapes
// were key 0 and it got the plain one: its op placed again was answered
// with a reply the store could not read).
func TestMarkerLayoutNoChecksBreakerAfterPlain(t *testing.T) {
	_, c, s := startStore(t) // FCALL: the library keeps its layouts
	ctx := ctxT(t)

	plain := testMeter("lay-plain", 0)
	plain.Op = limit.NewOp()
	if _, mr, err := s.TakeMetered(ctx, nil, plain, 1); err != nil || !mr.Allowed {
		t.Fatalf("plain metered take: %+v, %v", mr, err)
	}

	m := testMeter("lay-brk", 0)
	m.Op = limit.NewOp()
	b := testBreaker("lay-brk", "fp")
	b.IdenticalCount = 1000
	req := limit.Request{Meter: &m, Breaker: &b, Cost: 1}
	o1, err := s.Evaluate(ctx, req)
	if err != nil || !o1.Decision.Allowed {
		t.Fatalf("metered take with a breaker: %+v, %v", o1, err)
	}
	o2, err := s.Evaluate(ctx, req) // the op placed again: answered from its marker
	if err != nil {
		v, _ := c.Do(ctx, c.B().Get().Key(keyspace.MeterOp(m.Key, m.Op)).Build()).ToString()
		t.Fatalf("the op placed again: %v (marker %q)", err, v)
	}
	if o2.Meter != o1.Meter || o2.Breaker.Denials != o1.Breaker.Denials {
		t.Errorf("the op placed again: %+v, want %+v", o2, o1)
	}
}

// The other order: after a metered take with a breaker and no checks, a
// plain metered take with no checks gets its own layout (the breaker's, 10
// values more than its reply, failed struct.pack after the meter was
// charged: the call failed though it charged).
func TestMarkerLayoutNoChecksPlainAfterBreaker(t *testing.T) {
	_, _, s := startStore(t)
	ctx := ctxT(t)

	m := testMeter("lay2-brk", 0)
	m.Op = limit.NewOp()
	b := testBreaker("lay2-brk", "fp")
	b.IdenticalCount = 1000
	if o, err := s.Evaluate(ctx, limit.Request{Meter: &m, Breaker: &b, Cost: 1}); err != nil || !o.Decision.Allowed {
		t.Fatalf("metered take with a breaker: %+v, %v", o, err)
	}

	plain := testMeter("lay2-plain", 0)
	plain.Op = limit.NewOp()
	_, mr, err := s.TakeMetered(ctx, nil, plain, 1)
	if err != nil || !mr.Allowed {
		after, _, rerr := s.ReadMeter(ctx, plain.Key)
		t.Fatalf("plain metered take after one with a breaker: %+v, %v (meter now %+v, %v)", mr, err, after.Live, rerr)
	}
}
