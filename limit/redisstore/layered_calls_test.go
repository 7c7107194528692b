package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// layeredCase is one layered request shape and the outcome its rules force.
type layeredCase struct {
	name    string
	guarded bool   // a meter and a breaker ride along with the tenant checks
	denier  string // "", "tenant" or "global": the rule that denies once spent
}

// layeredCases covers the three outcomes the call layout must not depend
// on, with and without the meter and breaker that change the tenant's op.
func layeredCases() []layeredCase {
	var cases []layeredCase
	for _, guarded := range []bool{false, true} {
		for _, denier := range []string{"", "tenant", "global"} {
			name := "admitted"
			if denier != "" {
				name = denier + "_denies"
			}
			if guarded {
				name += "_meter_breaker"
			}
			cases = append(cases, layeredCase{name: name, guarded: guarded, denier: denier})
		}
	}
	return cases
}

// layeredRequest builds tc's request under fresh keys (id keeps reruns and
// other cases apart). The denying rule has one unit: the first request
// takes it, so that every request after it is denied by that rule alone.
func layeredRequest(tc layeredCase, id string) limit.Request {
	tl, gl := int64(1000), int64(1000)
	switch tc.denier {
	case "tenant":
		tl = 1
	case "global":
		gl = 1
	}
	tenant := "layered-" + tc.name + "-" + id
	req := limit.Request{Checks: tenantChecks(tenant, rule("tenant", limit.FixedWindow, tl, time.Hour)), Cost: 1}
	gr := rule("global-"+tc.name+"-"+id, limit.FixedWindow, gl, time.Hour)
	req.Global = []limit.Check{{Rule: gr, Key: keyspace.RateLimit(keyspace.PerGlobal, gr.Name, keyspace.Owner{})}}
	if tc.guarded {
		m := testMeter(tenant, 0)
		b := testBreaker(tenant, "fp")
		// The breaker must never open: a request it gates would be denied
		// by it, not by the rule the case is about.
		b.ConsecutiveDenials, b.IdenticalCount = 1000, 1000
		req.Meter, req.Breaker = &m, &b
	}
	return req
}

// checkOutcome fails unless o is what tc's rules decide once the first
// request spent the denying rule.
func checkOutcome(tb testing.TB, tc layeredCase, o limit.Outcome) {
	tb.Helper()
	d := o.Decision
	switch tc.denier {
	case "":
		if !d.Allowed {
			tb.Fatalf("denied, want admitted: %+v", o)
		}
	case "tenant":
		if d.Allowed || o.GlobalDecides || d.Rule.Name != "tenant" {
			tb.Fatalf("allowed %v, global decides %v, rule %q; want denied by the tenant rule", d.Allowed, o.GlobalDecides, d.Rule.Name)
		}
	case "global":
		if d.Allowed || !o.GlobalDecides {
			tb.Fatalf("allowed %v, global decides %v, rule %q; want denied by the global rule", d.Allowed, o.GlobalDecides, d.Rule.Name)
		}
	}
}

// On a standalone server a layered request (tenant checks, global checks,
// meter, breaker) is all-or-nothing because it is one call of the library:
// the server runs it atomically. A second call (a split like the Cluster's,
// or an extra read) would let another caller see part of it charged, and
// would cost a round trip per request. The server's own count of FCALL /
// EVALSHA / EVAL is the one observation no client-side refactoring can
// fool: it must grow by exactly one per Evaluate, whatever the outcome, as
// functions and as scripts.
func TestLayeredOneScriptCall(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t, nil) // dedicated: nobody else's calls in its stats
	c := r.Client(t)
	id := fmt.Sprint(time.Now().UnixNano())
	const n = 5
	for _, mode := range []struct {
		name        string
		noFunctions bool
	}{{"functions", false}, {"scripts", true}} {
		t.Run(mode.name, func(t *testing.T) {
			s := newStoreOpts(t, c, &Options{Timeout: testTimeout, NoFunctions: mode.noFunctions})
			for _, tc := range layeredCases() {
				t.Run(tc.name, func(t *testing.T) {
					ctx := ctxT(t)
					req := layeredRequest(tc, mode.name+"-"+id)
					align(t, c, s, time.Hour) // the spent unit stays spent during the case
					// Also loads the library (FUNCTION LOAD, or the first
					// EVALSHA's NOSCRIPT and EVAL) before counting.
					if o, err := s.Evaluate(ctx, req); err != nil || !o.Decision.Allowed {
						t.Fatalf("first request: %+v, %v; want admitted", o.Decision, err)
					}
					before, failedBefore := libCalls(t, c)
					for range n {
						o, err := s.Evaluate(ctx, req)
						if err != nil {
							t.Fatal(err)
						}
						checkOutcome(t, tc, o)
					}
					after, failedAfter := libCalls(t, c)
					if after-before != n || failedAfter != failedBefore {
						t.Errorf("%d layered Evaluates ran %d library calls (%d failed), want %d (0 failed)",
							n, after-before, failedAfter-failedBefore, n)
					}
				})
			}
		})
	}
}

// libSend is one Do or DoMulti of the store's client that carried library
// calls: the keys of each, in the order given.
type libSend struct {
	multi bool
	calls [][]string
}

// recordingClient is the store's client with every library call recorded
// as the store hands it to rueidis. (rueidishook would do the same but is a
// module of its own, outside go.mod.)
type recordingClient struct {
	rueidis.Client
	mu    sync.Mutex
	sends []libSend
}

// record keeps what cmds carry before rueidis sees them: rueidis recycles
// a command once it has been sent.
func (r *recordingClient) record(multi bool, cmds ...rueidis.Completed) {
	send := libSend{multi: multi}
	for _, cmd := range cmds {
		args := cmd.Commands()
		if len(args) < 3 {
			continue
		}
		switch strings.ToUpper(args[0]) {
		case "FCALL", "EVALSHA", "EVAL":
		default:
			continue
		}
		// FCALL function numkeys key..., EVALSHA sha numkeys key...
		k, err := strconv.Atoi(args[2])
		if err != nil || 3+k > len(args) {
			continue
		}
		send.calls = append(send.calls, slices.Clone(args[3:3+k]))
	}
	if len(send.calls) == 0 {
		return
	}
	r.mu.Lock()
	r.sends = append(r.sends, send)
	r.mu.Unlock()
}

func (r *recordingClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	r.record(false, cmd)
	return r.Client.Do(ctx, cmd)
}

func (r *recordingClient) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	r.record(true, cmds...)
	return r.Client.DoMulti(ctx, cmds...)
}

// take returns the sends recorded since the last take.
func (r *recordingClient) take() []libSend {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sends
	r.sends = nil
	return s
}

// half names the half of req whose library call has keys: "tenant" (its
// checks, meter or breaker), "global", or "both" / "none" (neither is a
// split's half).
func half(req limit.Request, keys []string) string {
	var t, g bool
	for _, k := range keys {
		for _, c := range req.Checks {
			t = t || k == c.Key
		}
		t = t || req.Meter != nil && k == req.Meter.Key
		t = t || req.Breaker != nil && (k == req.Breaker.Key || k == req.Breaker.IdenticalKey)
		for _, c := range req.Global {
			g = g || k == c.Key
		}
	}
	switch {
	case t && g:
		return "both"
	case t:
		return "tenant"
	case g:
		return "global"
	}
	return "none"
}

// halves lists the halves of send's calls, in order.
func halves(req limit.Request, send libSend) []string {
	var hs []string
	for _, keys := range send.calls {
		hs = append(hs, half(req, keys))
	}
	return hs
}

// On a Cluster whose global keys live in another slot than the tenant's,
// the two halves of a layered request are two library calls, and what
// bounds its latency to one round trip (and keeps short the time a
// concurrent caller can see one half charged while the other denies) is
// that they leave together: one DoMulti, which rueidis sends to both nodes
// at once. Two Do calls in sequence would still give every answer right;
// only the calls the store hands to its client show the difference, so the
// store runs on a client that records them. Whatever the outcome, the first
// send must be one DoMulti with the tenant half and the global half; an
// admitted request sends nothing else, and a denied one sends one more, the
// give-back of the half that admitted, to that half's node alone.
func TestClusterLayeredHalvesOneDoMulti(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t)
	c := cl.Client(t)
	rc := &recordingClient{Client: c}
	s := newStore(t, rc, testTimeout)
	if !s.cluster {
		t.Fatal("the store does not see a Cluster through the recording client: the test proves nothing")
	}
	id := fmt.Sprint(time.Now().UnixNano())
	const n = 3
	for _, tc := range layeredCases() {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			req := layeredRequest(tc, id)
			if keyspace.Slot(req.Global[0].Key) == keyspace.Slot(req.Checks[0].Key) {
				t.Fatal("the global key shares the tenant's slot: no split, the test proves nothing")
			}
			align(t, c, s, time.Hour) // the spent unit stays spent during the case
			// Also loads the library on every node before recording.
			if o, err := s.Evaluate(ctx, req); err != nil || !o.Decision.Allowed {
				t.Fatalf("first request: %+v, %v; want admitted", o.Decision, err)
			}
			rc.take()
			for i := range n {
				o, err := s.Evaluate(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				checkOutcome(t, tc, o)
				sends := rc.take()
				if len(sends) == 0 {
					t.Fatalf("request %d: no library call went through the client", i)
				}
				first := sends[0]
				if got := halves(req, first); !first.multi || !slices.Equal(got, []string{"tenant", "global"}) {
					t.Fatalf("request %d: first send is DoMulti %v carrying %v, want one DoMulti carrying [tenant global]; all sends: %+v",
						i, first.multi, got, sends)
				}
				// The give-back: one send, every call of it to the half
				// that admitted (on the guarded tenant half, its refund,
				// meter and breaker steps pipelined).
				admitted := map[string]string{"tenant": "global", "global": "tenant"}[tc.denier]
				if admitted == "" {
					if len(sends) != 1 {
						t.Errorf("request %d: admitted with %d library sends, want 1: %+v", i, len(sends), sends)
					}
					continue
				}
				if len(sends) != 2 {
					t.Fatalf("request %d: denied by the %s rule with %d library sends, want 2 (the halves, the give-back): %+v",
						i, tc.denier, len(sends), sends)
				}
				for _, h := range halves(req, sends[1]) {
					if h != admitted {
						t.Errorf("request %d: give-back carries %v, want the %s half alone", i, halves(req, sends[1]), admitted)
						break
					}
				}
			}
		})
	}
}
