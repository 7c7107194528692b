package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/mcpgate/mcpgate/enforce"

	"github.com/mcpgate/mcpgate/audit"
	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/mcp"
)

// The audit log has one line per governed call: every JSON-RPC request
// (tools/call and the other methods) that passed authentication, session
// binding and parsing, whatever the decision: admitted, cached, denied,
// forbidden or unavailable. Notifications and responses (nothing to decide)
// and GET / DELETE streams are not logged, nor requests refused before
// their caller or message was known (401, 400, 404 for an unknown session):
// those are in the request metrics. See docs/design.md, "Audit log".

// Decisions of audit lines.
const (
	auditAdmitted    = "admitted"
	auditCached      = "cached"
	auditDenied      = "denied"
	auditForbidden   = "forbidden"
	auditUnavailable = "unavailable"
)

// auditKey is the context key of a governed call's *auditNote.
type auditKey struct{}

// auditNote is what the stages of one governed call tell its audit line.
// Only the request's goroutine writes it. The note functions ignore a nil
// note (the call is not audited).
type auditNote struct {
	decided                         bool // the limiter's verdict is noted
	decision, scope, rule, degraded string
	cost                            int64
	reached                         bool  // an upstream call was made for this caller
	err                             error // how that call failed (nil: it answered)
	rpcErr, toolErr                 bool  // its answer was a JSON-RPC error, an isError result
}

func noteOf(ctx context.Context) *auditNote {
	n, _ := ctx.Value(auditKey{}).(*auditNote)
	return n
}

func noAudit() {}

// auditCall starts the audit line of msg when it is a request and an audit
// log is configured: it sets the X-Request-Id the line carries, and
// returns w wrapped to see the status, r carrying the call's note, and the
// func that writes the line. The caller defers that func where the
// governed call ends, so that it runs after the call's slots were released
// and its cost corrected. Otherwise it returns w and r as they are.
func (g *Gateway) auditCall(w http.ResponseWriter, r *http.Request, rt *runtime, p auth.Principal, msg *mcp.Message) (http.ResponseWriter, *http.Request, func()) {
	if g.audit == nil || !msg.IsCall() {
		return w, r, noAudit
	}
	start := time.Now()
	rec := audit.Record{Time: start, RequestID: requestID(w, r), Tenant: p.Tenant, Subject: p.Subject, Method: msg.Method}
	switch msg.Method {
	case mcp.MethodToolsCall:
		rec.Tool = msg.ToolName
		if rt.cfg.Audit.IncludeArguments {
			rec.Arguments = msg.Arguments
		}
	case mcp.MethodPromptsGet:
		rec.Prompt = msg.Name
	case mcp.MethodResourcesRead:
		rec.Resource = msg.Name
	}
	n := &auditNote{}
	aw := &statusWriter{ResponseWriter: w}
	r = r.WithContext(context.WithValue(r.Context(), auditKey{}, n))
	return aw, r, func() {
		rec.LatencyMS = float64(time.Since(start).Microseconds()) / 1000
		rec.Status = aw.status
		g.audit.Log(n.complete(rec, aw.Header().Get("X-Mcp-Cache")))
	}
}

// complete returns rec completed from the note, the status (already in
// rec) and the X-Mcp-Cache header of the answer.
func (n *auditNote) complete(rec audit.Record, cacheSource string) audit.Record {
	rec.Decision, rec.Scope, rec.Rule, rec.Degraded, rec.Cost = n.decision, n.scope, n.rule, n.degraded, n.cost
	rec.Cache = cacheSource
	switch {
	case !n.decided && rec.Status == http.StatusForbidden:
		// refused by authorize, before the limiter
		rec.Decision, rec.Scope, rec.Rule = auditForbidden, "scope", ""
	case !n.decided:
		rec.Decision = "refused" // not reached today: every other path is decided
	case rec.Decision != auditAdmitted:
	case cacheSource != "" && cacheSource != "miss":
		rec.Decision = auditCached
	default:
		rec.Upstream = n.upstream(rec.Status)
	}
	return rec
}

// upstream names how an admitted call's upstream exchange ended.
func (n *auditNote) upstream(status int) string {
	switch {
	case errors.Is(n.err, mcp.ErrCancelled) || errors.Is(n.err, mcp.ErrClientGone):
		return "cancelled"
	case n.err != nil:
		return "transport_error"
	case status == 0 || (!n.reached && status == http.StatusAccepted):
		// nothing written (the caller went away), or a cached call's
		// 202 to its own notifications/cancelled
		return "cancelled"
	case status/100 != 2:
		return "http_" + strconv.Itoa(status)
	case n.rpcErr:
		return "rpc_error"
	case n.toolErr:
		return "tool_error"
	}
	return "ok"
}

// noteDecision records the engine's decision on a call and, when it was
// admitted, the cost it is charged.
func noteDecision(ctx context.Context, d enforce.Decision) {
	noteTrace(ctx, d)
	n := noteOf(ctx)
	if n == nil {
		return
	}
	n.decided, n.degraded = true, string(d.Degraded)
	decision, rule, scope := d.Describe()
	switch decision {
	case "unavailable":
		n.decision = auditUnavailable
	case "denied":
		n.decision, n.scope, n.rule = auditDenied, scope, rule
	default:
		n.decision, n.rule, n.cost = auditAdmitted, rule, d.Cost
	}
}

// noteCost records the cost a call was charged after a correction.
func noteCost(ctx context.Context, cost int64) {
	if n := noteOf(ctx); n != nil {
		n.cost = cost
	}
}

// noteForward records an upstream exchange through forward: it returns fwd
// with its answered, when set, wrapped to see the answer, and what to call
// once the exchange is over. An unset answered stays unset: setting it
// would make the proxy buffer every JSON answer, so without one the line's
// upstream outcome comes from the status alone.
func noteForward(ctx context.Context, fwd relay) (relay, func(status int, err error)) {
	n := noteOf(ctx)
	if n == nil {
		return fwd, func(int, error) {}
	}
	if report := fwd.answered; report != nil {
		fwd.answered = func(result, rpcErr json.RawMessage) {
			n.sawResult(result, rpcErr)
			report(result, rpcErr)
		}
	}
	return fwd, func(_ int, err error) { n.reached, n.err = true, err }
}

// noteLeft records that the client of a call whose answer was read without
// it (see forwardCall) left: cancelled, or gone. ctx is the call's.
func noteLeft(ctx context.Context) {
	n := noteOf(ctx)
	if n == nil {
		return
	}
	n.err = cmp.Or(leaving(ctx), mcp.ErrClientGone) // gone: a write to it failed
}

// leaving tells how the client of the call whose context is ctx left:
// mcp.ErrCancelled, mcp.ErrClientGone, or nil while it is there.
func leaving(ctx context.Context) error {
	switch {
	case errors.Is(context.Cause(ctx), mcp.ErrCancelled):
		return mcp.ErrCancelled
	case ctx.Err() != nil:
		return mcp.ErrClientGone
	}
	return nil
}

func (n *auditNote) sawResult(result, rpcErr json.RawMessage) {
	n.rpcErr, n.toolErr = rpcErr != nil, isErrorResult(result)
}

// noteLoaded records the answer of a cache load that streamed to this
// caller; ctx is the call's, which tells a cancellation.
func noteLoaded(ctx context.Context, result, rpcErr json.RawMessage) {
	n := noteOf(ctx)
	if n == nil {
		return
	}
	n.reached = true
	n.sawResult(result, rpcErr)
	if err := leaving(ctx); err != nil {
		n.err = err
	}
}

// reopenWait bounds how long ReopenAudit waits for the audit writer: a
// write stuck on a stalled disk (a hung network mount, a full pipe) must
// not hold up the config reload that SIGHUP and POST /admin/reload run
// after it.
var reopenWait = 5 * time.Second

// ReopenAudit reopens the audit file (after log rotation renamed it): new
// lines go to a new file at the configured path. Lines queued before go to
// the old one. A failure is logged and returned, and the old file stays in
// use; so is a writer that has not taken the reopen within reopenWait.
// Without an audit file it does nothing.
func (g *Gateway) ReopenAudit(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, reopenWait)
	defer cancel()
	err := g.audit.Reopen(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		g.log.Error("audit file not reopened: its writer is stuck on a write (a stalled disk?); going on without waiting", "waited", reopenWait)
	}
	return err
}

// openAudit opens the audit log the config names (none for "").
func (g *Gateway) openAudit(path string) error {
	if path == "" {
		return nil
	}
	l, err := audit.Open(path, &audit.Options{OnDrop: g.metrics.AuditDropped.Inc, Logger: g.log})
	if err != nil {
		return err
	}
	g.audit = l
	return nil
}
