package gateway

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/limit/redisstore"
)

// renewCalls counts the Renew calls (renewals and slot checks) an
// instance makes to its store.
type renewCalls struct {
	*redisstore.Store
	n atomic.Int64
}

func (s *renewCalls) Renew(ctx context.Context, checks []limit.Check, lease string) (bool, error) {
	s.n.Add(1)
	return s.Store.Renew(ctx, checks, lease)
}

// vouchEnv starts two instances sharing one Redis, alice capped at one
// session, and returns each instance's Renew counter.
func vouchEnv(t *testing.T) (*env, []*renewCalls) {
	t.Helper()
	var calls []*renewCalls
	e := newEnv(t, setup{
		Redis:     testenv.StartRedis(t, nil),
		Instances: 2,
		Config:    storeYAML(true) + "sessions: {max_per_subject: 1, idle_timeout: 1h}\n",
		WrapStore: func(s *redisstore.Store) limit.GuardedStore {
			c := &renewCalls{Store: s}
			calls = append(calls, c) // instances are built one after the other
			return c
		},
	})
	return e, calls
}

// Instances share sessions without sticky routing: a session opened
// through one instance, whose lease that instance holds, is served by
// another that meets it for the first time (enter checks its lease in the
// shared store), and tracked there from then on (one check).
func TestSessionOpenedElsewhereIsServedOnFirstUse(t *testing.T) {
	t.Parallel()
	e, calls := vouchEnv(t)
	alice, id := aliceSession(t, e)
	hdr := http.Header{"Mcp-Session-Id": {id}}
	for i := range 3 {
		if r := post(t, e.mcpURL(1), alice, methodBody(2+i, "tools/list", `{}`), hdr); r.Status != http.StatusOK {
			t.Fatalf("request %d, on the instance that did not open the session: %d %s", i, r.Status, r.Body)
		}
	}
	if n := calls[1].n.Load(); n != 1 {
		t.Fatalf("the second instance asked the store %d times about the session, want once (then it tracks it)", n)
	}
}

// A session ended through one instance (its slot released) is refused by
// another that never served it, and a client naming it again and again
// costs that instance one store round trip, not one per request: the
// session is buried.
func TestEndedSessionIsRefusedElsewhereAfterOneCheck(t *testing.T) {
	t.Parallel()
	e, calls := vouchEnv(t)
	alice, id := aliceSession(t, e)
	if st := deleteSession(t, e, 0, alice, id); st/100 != 2 {
		t.Fatalf("DELETE: %d", st)
	}
	hdr := http.Header{"Mcp-Session-Id": {id}}
	for i := range 5 {
		if r := post(t, e.mcpURL(1), alice, methodBody(2+i, "tools/list", `{}`), hdr); r.Status != http.StatusNotFound {
			t.Fatalf("request %d of a session ended elsewhere: %d %s, want 404", i, r.Status, r.Body)
		}
	}
	if n := calls[1].n.Load(); n != 1 {
		t.Fatalf("the instance asked the store %d times about an ended session, want once", n)
	}
	// ...and on the instance that ended it, without asking at all.
	before := calls[0].n.Load()
	if r := post(t, e.mcpURL(0), alice, methodBody(9, "tools/list", `{}`), hdr); r.Status != http.StatusNotFound {
		t.Fatalf("the ended session, on the instance that ended it: %d, want 404", r.Status)
	}
	if n := calls[0].n.Load() - before; n != 0 {
		t.Fatalf("the instance that ended the session asked the store %d times about it, want none", n)
	}
}

// The tombstones are bounded: the oldest is replaced once maxBuried are
// kept, and a session buried again is kept once.
func TestBuriedSessionsAreBounded(t *testing.T) {
	tr := newSessionTracker(&Gateway{log: quietLogger()}, 0)
	for i := range maxBuried + 10 {
		tr.bury("s", strconv.Itoa(i))
		tr.bury("s", strconv.Itoa(i)) // again: no second grave
	}
	if len(tr.buried) != maxBuried || len(tr.graves) != maxBuried {
		t.Fatalf("%d tombstones (%d graves), want %d", len(tr.buried), len(tr.graves), maxBuried)
	}
	if _, ok := tr.buried[grave{"s", "0"}]; ok {
		t.Fatal("the oldest tombstone was kept past the bound")
	}
	if _, ok := tr.buried[grave{"s", strconv.Itoa(maxBuried + 9)}]; !ok {
		t.Fatal("the newest tombstone was not kept")
	}
}
