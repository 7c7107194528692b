package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/mcpgate/mcpgate/enforce"
	"github.com/mcpgate/mcpgate/internal/jsonscan"
	"github.com/mcpgate/mcpgate/mcp"
)

// serveCall governs a tools/call: the engine admits it (breaker, limits,
// quota), the answer comes from the cache or the upstream, and the engine
// settles it (slots, cost, breaker, invalidations) once it has ended.
func (g *Gateway) serveCall(x *exchange) {
	msg := x.msg
	t, d := g.eng.Admit(x.r.Context(), enforce.Call{Tenant: x.p.Tenant, Tier: x.p.Tier, Subject: x.p.Subject,
		Session: x.r.Header.Get(mcp.HeaderSessionID), Name: msg.ToolName, Arguments: msg.Arguments})
	noteDecision(x.r.Context(), d)
	if !g.admitted(x, "tools/call", d) {
		return
	}
	setRateHeaders(x.w.Header(), d.Limit, g.now())
	// From here on the call is the caller's to cancel (notifications/cancelled).
	caller := ownerOf(x.p, x.r)
	ctx, call := g.inflight.begin(x.r.Context(), caller, msg.ID, outlivesClient(x.r))
	var orphan *leaderWriter  // a cached call's own load that outlives it
	var refresh *leaderWriter // an early refresh its hit started, under its slots
	x.after(func() {          // last: after the call is settled
		g.inflight.release(call)
		if orphan == nil {
			g.inflight.remove(caller, call)
		}
		// else: its id stays registered while its load runs upstream in
		// its session, so that a cancellation naming it is never forwarded
		// there (it would end the flight of every caller waiting on it).
	})
	x.r = x.r.WithContext(ctx)

	var a answer
	x.after(func() {
		if orphan != nil {
			// Settled when the load ends, on the load's result: the tool
			// ran for this call, and its reported cost is this call's
			// (see cachedCall). The audit line is written before, with
			// the estimate.
			status := a.status(x.r)
			g.settling.Go(func() {
				<-orphan.done
				_, result, _ := orphan.outcome()
				t.Done(ctx, enforce.Outcome{Status: status, Result: result, Running: orphan.running.Load()})
				g.inflight.remove(caller, call)
			})
			return
		}
		if refresh != nil {
			// Settled on its own answer once the refresh its hit started
			// has ended: its slots stay held while it runs upstream.
			o := enforce.Outcome{Status: a.status(x.r), Result: a.result, Running: a.running}
			g.settling.Go(func() {
				<-refresh.done
				o.Running = o.Running || refresh.running.Load()
				t.Done(ctx, o)
			})
			return
		}
		if charged := t.Done(ctx, enforce.Outcome{Status: a.status(x.r), Result: a.result, Running: a.running}); charged != d.Cost {
			noteCost(ctx, charged)
		}
	})
	// The answer is settled on before the client sees it (relayUpstream
	// runs answered between the proxy's Answer and Finish): its next call
	// must meet the breaker this outcome opens, and no entry it made stale.
	var answered resultHook
	if t.WantsAnswer() {
		answered = func(result, rpcErr json.RawMessage) {
			// Only the outcome: the result's reported cost belongs to the
			// call whose own load produced it (Done's Outcome.Result).
			t.Answered(ctx, nil, rpcErr != nil || isErrorResult(result))
		}
		x.fwd.answered = func(result, rpcErr json.RawMessage) {
			a.result, a.failed = result, rpcErr != nil || isErrorResult(result)
			t.Answered(ctx, result, a.failed) // answered, without reading the result again
		}
	}
	plan, cached := t.CachePlan()
	switch {
	case cached && cacheableParams(x.fwd.Msg.Params):
		// Only the load that fills the cache reaches the upstream, and its
		// reported cost corrects that one call's charge. The loads' own
		// answers reach the ticket through answered only: a load may
		// outlive this call (an early refresh), and must not touch a.
		a.failed, a.result, a.code, a.running, orphan, refresh = g.cachedCall(x.w, x.r, x.p, x.rt, x.fwd, t, plan, call, answered)
		if call.cut.Load() {
			// Its own request (a bypass, after another caller's interim
			// answer) was cut; a flight's load is not the call's to stop.
			a.running = g.stopUpstream(x.r, x.p, msg.ID, true) || a.running
		}
		return
	case cached:
		a.failed, a.result, a.code = g.bypassCache(x.w, x.r, x.rt, x.fwd, call)
	default:
		a.code = g.forwardCall(x.w, x.r, x.rt, x.fwd, call)
	}
	// Before the call is settled and its slot freed.
	a.running = g.stopUpstream(x.r, x.p, msg.ID, call.cut.Load())
}

// answer is what a tools/call got: its result (nil without one), whether
// that was an error, the HTTP status written to the caller, and whether
// the upstream may still be running it (enforce.Outcome.Running).
type answer struct {
	result  json.RawMessage
	failed  bool
	code    int
	running bool
}

// status is how the call ended, for the engine.
func (a *answer) status(r *http.Request) enforce.Status {
	switch {
	case errors.Is(context.Cause(r.Context()), mcp.ErrCancelled):
		return enforce.Cancelled
	case r.Context().Err() != nil || a.code == mcp.StatusClientClosedRequest:
		return enforce.Abandoned
	case a.code >= 500:
		// No usable answer (a timeout, a 5xx, a stream cut or ended
		// without the response), even though the proxy reported an error
		// object for it: the tool may have run, and Done must drop what
		// a mutation made stale. The breaker counts either as a failure.
		return enforce.Failed
	case a.failed:
		return enforce.ToolError
	}
	return enforce.OK
}

// isErrorResult reports whether a tools/call result says isError: true,
// read as MCP clients read it: the member named exactly isError (JSON.parse,
// Python's json and the Go SDK's case-sensitive decoding ignore a case twin
// such as "ISERROR"), the last of duplicates winning. encoding/json's
// case-insensitive match could take a twin for it and see a success where
// the client sees an error.
func isErrorResult(result json.RawMessage) bool {
	s := jsonscan.New(result)
	if s.Peek() != '{' {
		return false
	}
	var v []byte
	err := s.Object(func(key string) error {
		raw, err := s.SkipValue()
		if key == "isError" {
			v = raw
		}
		return err
	})
	return err == nil && s.End() == nil && string(v) == "true"
}
