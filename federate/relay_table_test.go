package federate

import (
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A retired token is still relayed for progressGrace after its call ended
// (to the session, without the call), then forgotten; one of another
// upstream session never is.
func TestProgressTableGrace(t *testing.T) {
	now := time.Unix(1000, 0)
	var tb progressTable
	tb.init()
	tb.now = func() time.Time { return now }
	cs, other, ss := &mcp.ClientSession{}, &mcp.ClientSession{}, &mcp.ServerSession{}
	c := &call{cs: cs, ss: ss}

	ft := tb.add(c, "client-token")
	if e, ok := tb.lookup(cs, ft); !ok || e.c != c || e.token != "client-token" || !e.retired.IsZero() {
		t.Fatalf("running call: lookup = %+v, %v", e, ok)
	}
	if _, ok := tb.lookup(other, ft); ok {
		t.Fatal("a token of another upstream session was found")
	}
	now = now.Add(time.Hour) // a running call's token never expires
	tb.retire(tb.add(c, "x"))
	if _, ok := tb.lookup(cs, ft); !ok {
		t.Fatal("a running call's token was forgotten")
	}

	tb.retire(ft)
	retired := now
	for _, d := range []time.Duration{0, progressGrace / 2, progressGrace} {
		now = retired.Add(d)
		e, ok := tb.lookup(cs, ft)
		if !ok || e.c != nil || e.cs != cs || e.ss != ss || e.token != "client-token" || !e.retired.Equal(retired) {
			t.Fatalf("%v after retire: lookup = %+v, %v; want it known, without its call", d, e, ok)
		}
	}
	now = retired.Add(progressGrace + time.Nanosecond)
	if e, ok := tb.lookup(cs, ft); ok {
		t.Fatalf("just over progressGrace after retire: lookup = %+v, want it forgotten", e)
	}
	if _, ok := tb.m[ft]; ok {
		t.Fatal("expired token still in the table")
	}
}

// The table holds the tokens retired within progressGrace only, forgetting
// the others as calls come and go (without a lookup).
func TestProgressTableForgets(t *testing.T) {
	now := time.Unix(1000, 0)
	var tb progressTable
	tb.init()
	tb.now = func() time.Time { return now }
	c := &call{cs: &mcp.ClientSession{}, ss: &mcp.ServerSession{}}
	const perSec = 100
	var fts []string
	for i := range 120 * perSec { // 100 calls/s for 2 minutes
		now = now.Add(time.Second / perSec)
		ft := tb.add(c, i)
		tb.retire(ft)
		fts = append(fts, ft)
		if n := len(tb.m); n > int(progressGrace/time.Second)*perSec+1 {
			t.Fatalf("after %d calls: %d tokens known", i+1, n)
		}
		if live := len(tb.retired); live != len(tb.m) {
			t.Fatalf("after %d calls: %d tokens queued, %d known", i+1, live, len(tb.m))
		}
	}
	for i, ft := range fts {
		_, ok := tb.m[ft]
		if want := now.Sub(time.Unix(1000, 0).Add(time.Duration(i+1)*time.Second/perSec)) <= progressGrace; ok != want {
			t.Fatalf("token %d (of %d): known = %v, want %v", i, len(fts), ok, want)
		}
	}
	if cap(tb.retired) > 8*int(progressGrace/time.Second)*perSec {
		t.Errorf("queue capacity %d for %d tokens", cap(tb.retired), len(tb.m))
	}
}

// newest is the newest call in flight on a session.
func TestInflightNewest(t *testing.T) {
	var tb inflightTable
	cs, ss := &mcp.ClientSession{}, &mcp.ServerSession{}
	check := func(what string, want *call) {
		t.Helper()
		if c := tb.newest(cs); c != want {
			t.Fatalf("%s: newest = %p; want %p", what, c, want)
		}
	}
	check("none", nil)
	a := &call{cs: cs, ss: ss}
	tb.add(a)
	check("one call", a)
	b := &call{cs: cs, ss: ss}
	tb.add(b)
	check("two calls", b)
	d := &call{cs: cs, ss: ss}
	tb.add(d)
	tb.remove(b)
	check("the middle one ended", d)
	tb.remove(d)
	check("the newest ended", a)
	tb.remove(a)
	check("all ended", nil)
	if len(tb.m) != 0 {
		t.Fatalf("empty table holds %d sessions", len(tb.m))
	}
	tb.remove(a) // not in flight: nothing
	check("removed twice", nil)
}
