package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/mcp"
	"github.com/mcpgate/mcpgate/usage"
)

// JSON-RPC error codes of the gateway's own answers. They sit outside the
// ranges JSON-RPC (-32768..-32000) and MCP reserve, so they cannot collide
// with an upstream's codes.
const (
	CodeRateLimited  = -33029 // 429: rate limit, quota or breaker
	CodeUnauthorized = -33001 // 401: no or bad credentials
	CodeForbidden    = -33003 // 403: tool, resource or prompt outside the caller's scopes
	CodeUnavailable  = -33503 // 503: limit store unavailable under a closed policy
)

// releaseTimeout bounds the release of concurrency slots after a call.
const releaseTimeout = time.Second

func (g *Gateway) serveMCP(w http.ResponseWriter, r *http.Request) {
	// First, before auth: every later stage reads these headers, and a
	// repeated or empty one could be read differently upstream.
	if herr := mcp.CheckRequestHeaders(r.Header); herr != nil {
		g.metrics.Requests.WithLabelValues("any", "bad_request").Inc()
		herr.Respond(w)
		return
	}
	rt := g.rt.Load()
	switch r.Method {
	case http.MethodPost, http.MethodGet, http.MethodDelete:
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		mcp.WriteError(w, http.StatusMethodNotAllowed, nil, mcp.CodeInvalidRequest, "method not allowed: use POST, GET or DELETE", nil)
		return
	}
	p, err := rt.auth.FromRequest(r.Context(), r)
	if err != nil {
		g.unauthorized(w, r, err)
		return
	}
	fwd := mcp.Forward{Header: g.identityHeaders(rt, p), SessionID: func(upstream string) string {
		return g.sessions.wrap(p, upstream)
	}, ReplayFilters: listFilters(p.Scopes)} // a resumed GET replays earlier list answers unfiltered
	if id := r.Header.Get(mcp.HeaderSessionID); id != "" {
		upstreamID, lease, ok := g.sessions.unwrap(p, id)
		if !ok {
			// Not a session this caller opened (or one from before a key
			// change): MCP's answer to an unknown session is 404, which
			// tells the client to start a new one.
			g.metrics.Requests.WithLabelValues("any", "bad_session").Inc()
			mcp.WriteError(w, http.StatusNotFound, nil, mcp.CodeInvalidRequest, "session not found", nil)
			return
		}
		r.Header.Set(mcp.HeaderSessionID, upstreamID)
		if r.Method == http.MethodGet {
			// Recorded as soon as the session is known: a POST the client
			// sent right after this GET must not overtake it upstream.
			accepted := g.order.open(upstreamID)
			defer accepted()
			fwd.OnResponse = accepted
		}
		var done func()
		var live bool
		w, done, live = g.useSession(w, r, rt, p, upstreamID, lease)
		if !live {
			return
		}
		defer done()
	}
	if r.Method == http.MethodGet {
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		defer context.AfterFunc(g.streams, cancel)()
		r = r.WithContext(ctx)
	}
	if r.Method != http.MethodPost {
		// GET opens the server-initiated stream, DELETE ends a session:
		// nothing to limit, but the caller must still be authenticated.
		g.forward(w, r, rt, fwd, "stream")
		return
	}

	body, perr := readBody(w, r, rt.cfg.Upstream.MaxBodyBytes)
	if perr != nil {
		g.metrics.Requests.WithLabelValues("any", "bad_request").Inc()
		mcp.WriteError(w, perr.HTTPStatus, perr.ID, perr.Code, perr.Message, perr.Data)
		return
	}
	msg, err := mcp.Parse(body)
	if err != nil {
		g.metrics.Requests.WithLabelValues("any", "bad_request").Inc()
		writeMCPError(w, err)
		return
	}
	if herr := mcp.CheckHeaders(r, msg); herr != nil {
		g.metrics.Requests.WithLabelValues(methodClass(msg), "bad_request").Inc()
		mcp.WriteError(w, herr.HTTPStatus, herr.ID, herr.Code, herr.Message, herr.Data)
		return
	}
	fwd.Body, fwd.Msg = body, msg
	g.trace.message(r.Context(), p, msg)
	w, r, audited := g.auditCall(w, r, rt, p, msg)
	defer audited() // the line of a governed call, once it has ended
	if !g.authorized(w, r, rt, p, &fwd) {
		return
	}
	if msg.Method != "tools/call" {
		if msg.Method == "notifications/cancelled" && !g.cancelCall(r, p, msg) {
			w.WriteHeader(http.StatusAccepted) // the cancelled call was cached: kept from the upstream
			return
		}
		g.serveMethod(w, r, rt, fwd, p, msg)
		return
	}

	tool := msg.ToolName
	if !p.Scopes.AllowsTool(tool) {
		g.metrics.Requests.WithLabelValues("tools/call", "forbidden").Inc()
		mcp.WriteError(w, http.StatusForbidden, msg.ID, CodeForbidden,
			fmt.Sprintf("tool %q is not in the caller's scopes", tool), map[string]any{"tool": tool})
		return
	}
	owner := keyspace.Owner{Tenant: p.Tenant, Subject: p.Subject, Tool: tool}
	tenantRules, globalRules := rt.cfg.RulesFor(p.Tier, tool)
	toolCost := rt.cfg.ToolCost(tool)
	cost := max(1, toolCost.Charge())
	now := g.now()
	var meter *limit.Meter
	if g.lim.meters != nil {
		_, tier, _ := rt.cfg.ResolveTier(p.Tier)
		meter = g.lim.meters.meterFor(p.Tenant, tier.MonthlyQuota, now)
		meter.Cost = cost
	}
	br := breakerSpec(rt.cfg, p, r.Header.Get(mcp.HeaderSessionID), tool, msg.Arguments)
	// Rules count calls (the config's limits are calls per period); the
	// cost goes to the usage meter and the monthly quota.
	const callUnits = 1
	v := g.lim.admit(r.Context(), buildRuleSet(tenantRules, owner), buildRuleSet(globalRules, owner), meter, br, callUnits, rt.cfg.ToolOnError(tool))
	noteVerdict(r.Context(), v, cost)
	switch {
	case v.unavailable:
		g.metrics.Requests.WithLabelValues("tools/call", "unavailable").Inc()
		w.Header().Set("Retry-After", "1")
		mcp.WriteError(w, http.StatusServiceUnavailable, msg.ID, CodeUnavailable,
			"rate-limit store unavailable and this tool fails closed; retry shortly", nil)
		return
	case v.breakerOpen:
		g.metrics.Requests.WithLabelValues("tools/call", "denied").Inc()
		g.metrics.Denials.WithLabelValues("breaker", breakerRule).Inc()
		writeCallDenied(w, rt.cfg.DenyAs(p.Tier, tool), msg.ID, breakerDecision(br, v.breaker), "breaker", now)
		return
	case v.quota:
		g.metrics.Requests.WithLabelValues("tools/call", "denied").Inc()
		g.metrics.Denials.WithLabelValues("quota", quotaRule).Inc()
		writeCallDenied(w, rt.cfg.DenyAs(p.Tier, tool), msg.ID, quotaDecision(meter, v.usage, now), "quota", now)
		return
	case !v.allowed:
		g.metrics.Requests.WithLabelValues("tools/call", "denied").Inc()
		g.metrics.Denials.WithLabelValues(string(v.scope), v.decision.Rule.Name).Inc()
		writeCallDenied(w, rt.cfg.DenyAs(p.Tier, tool), msg.ID, v.decision, string(v.scope), now)
		return
	}
	setRateHeaders(w.Header(), v.decision, now)
	switch {
	case v.pending:
		g.lim.meters.addPending(*meter, limit.Usage{Charged: cost, Calls: 1}, errors.New("admitted while the meter was unreachable"))
	case v.unmetered:
		g.lim.meters.charged(meter) // flushed if the charge did land
		g.metrics.Unmetered.Inc()
		g.log.Warn("call admitted after a meter charge with no answer: it may have been charged and is not charged again",
			"tenant", meter.Tenant, "period", meter.Period, "tool", tool, "cost", cost)
	}
	// From here on the call is the caller's to cancel (notifications/cancelled).
	caller := ownerOf(p, r)
	ctx, call := g.inflight.begin(r.Context(), caller, msg.ID)
	defer g.inflight.end(caller, call) // last: after the slots and the probe are released
	r = r.WithContext(ctx)
	var reported json.RawMessage
	var failed, outcomeReported, invalidated bool
	// The cost of an unmetered call is not corrected: a correction of a
	// charge that never landed would leave a refund without its charge.
	correct := meter != nil && toolCost.FromResult != "" && !v.unmetered
	tc := rt.caching[tool]
	if correct || br != nil || tc.invalidates != nil {
		fwd.OnResult = func(result, rpcErr json.RawMessage) {
			reported, failed = result, rpcErr != nil || isErrorResult(result)
			if br != nil {
				// Before the client sees the answer (an SSE answer is
				// flushed before Serve returns): its next call must meet
				// the breaker this outcome opens or closes.
				outcomeReported = true
				g.reportOutcome(context.WithoutCancel(r.Context()), br, v.breaker, failed)
			}
			if tc.invalidates != nil && !failed {
				// Before the answer is relayed too: a caller reading right
				// after its write must not get the entry it made stale.
				invalidated = true
				g.invalidateAfter(context.WithoutCancel(r.Context()), rt, p.Tenant, tc, msg.Arguments)
			}
		}
	}
	var status int
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), releaseTimeout)
		v.release(ctx)
		cancel()
		if correct && reported != nil {
			g.correctCost(context.WithoutCancel(r.Context()), meter, v.metered, cost, toolCost.FromResult, reported)
		}
		switch {
		case br == nil || outcomeReported:
		case r.Context().Err() == nil && status != mcp.StatusClientClosedRequest:
			g.reportOutcome(context.WithoutCancel(r.Context()), br, v.breaker, failed || status >= 500)
		default:
			// The client went away before a result, or cancelled the call
			// (its context is then cancelled too): the call says nothing of
			// the agent, and a probe's lease would refuse every call until
			// it ran out.
			g.lim.releaseProbe(r.Context(), br, v.breaker)
		}
		if tc.invalidates != nil && !invalidated && !failed && status > 0 && status < 300 {
			// a mutating tool that is also cached: cachedCall reports no
			// result on the way (a cancelled call too: it may have written)
			g.invalidateAfter(context.WithoutCancel(r.Context()), rt, p.Tenant, tc, msg.Arguments)
		}
	}()
	if tc.policy != nil {
		// Cached answers pass auth, limits, quota and the breaker like any
		// call (and are charged the tool's cost); only the load that fills
		// the cache reaches the upstream, and its reported cost corrects
		// that one call's charge.
		failed, reported, status = g.cachedCall(w, r, rt, fwd, p, tc, call)
		return
	}
	status = g.forward(w, r, rt, fwd, "tools/call")
	g.cancelAbandoned(r, p, msg.ID) // before the deferred release frees the slot
}

// breakerRule names the loop breaker in 429s and metrics.
const breakerRule = "loop_breaker"

// breakerDecision describes an open breaker as a limit.Decision, for the
// same headers and body as other denials. A refusal because another call's
// probe is in flight says retry within probeRetry, not at the end of the
// probe's lease: the probe's outcome is usually known by then.
func breakerDecision(b *limit.BreakerSpec, st limit.BreakerState) limit.Decision {
	retry := st.RetryAfter
	if st.HalfOpen {
		retry = min(retry, probeRetry)
	}
	return limit.Decision{
		Rule:       limit.Rule{Name: breakerRule, Period: max(st.Cooldown, b.Cooldown)},
		ResetAfter: retry,
		RetryAfter: retry,
	}
}

// isErrorResult reports whether a tools/call result says isError: true.
func isErrorResult(result json.RawMessage) bool {
	var r struct {
		IsError bool `json:"isError"`
	}
	return json.Unmarshal(result, &r) == nil && r.IsError
}

// reportOutcome tells the breaker how an admitted call ended. Successes are
// reported only when they change something (a probe, or failures to reset),
// so that a healthy agent costs no extra store call.
func (g *Gateway) reportOutcome(ctx context.Context, b *limit.BreakerSpec, st limit.BreakerState, failed bool) {
	if !failed && !st.Probe && st.Failures == 0 {
		return
	}
	var store limit.Store = g.lim.local
	if g.lim.shared != nil {
		store = g.lim.shared
	}
	gs, ok := store.(limit.GuardedStore)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	out, err := gs.ReportOutcome(ctx, *b, failed, st.Probe)
	if err != nil {
		g.log.Warn("reporting a call's outcome to its loop breaker failed", "key", b.Key, "err", err)
		return
	}
	g.lim.breakers.observe(b, out)
}

// quotaRule names the monthly quota in 429s and metrics.
const quotaRule = "monthly_quota"

// quotaDecision describes a quota denial as a limit.Decision, so that the
// same headers and body are written: the window is the billing period and
// the retry time its end.
func quotaDecision(m *limit.Meter, u limit.Usage, now time.Time) limit.Decision {
	start, _ := usage.PeriodStart(m.Period)
	end, _ := usage.PeriodEnd(m.Period)
	left := max(0, m.Quota-u.Used())
	return limit.Decision{
		Rule:       limit.Rule{Name: quotaRule, Period: end.Sub(start)},
		Limit:      m.Quota,
		Remaining:  left,
		ResetAfter: end.Sub(now),
		RetryAfter: max(end.Sub(now), time.Second),
	}
}

// correctCost turns the estimate charged on admission into the cost the
// tool reported in its result (a refund or an extra charge). A result
// without a valid value keeps the estimate.
func (g *Gateway) correctCost(ctx context.Context, meter *limit.Meter, metered bool, charged int64, path string, result json.RawMessage) {
	actual, err := reportedCost(result, path)
	if err != nil {
		g.metrics.CostCorrections.WithLabelValues("invalid").Inc()
		g.log.Warn("tool result reports no valid cost: the estimate stays charged", "tenant", meter.Tenant, "estimate", charged, "err", err)
		return
	}
	delta, ok := correction(charged, actual)
	if !ok {
		g.metrics.CostCorrections.WithLabelValues("unchanged").Inc()
		return
	}
	g.metrics.CostCorrections.WithLabelValues("applied").Inc()
	noteCost(ctx, actual)
	if metered {
		g.lim.meters.adjust(ctx, *meter, delta)
		return
	}
	g.lim.meters.addPending(*meter, delta, errors.New("correction of a call admitted while the meter was unreachable"))
}

func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, rt *runtime, fwd mcp.Forward, class string) int {
	start := time.Now()
	forwarded := noteForward(r.Context(), &fwd)
	status, err := g.serveOrdered(w, r, rt, fwd)
	forwarded(status, err)
	g.metrics.UpstreamSeconds.Observe(time.Since(start).Seconds())
	outcome := "admitted"
	switch {
	case errors.Is(err, mcp.ErrCancelled):
		outcome = "cancelled"
	case err != nil || status >= 500:
		outcome = "upstream_error"
		if err != nil && r.Context().Err() == nil {
			g.log.Warn("upstream call failed", "status", status, "err", err)
		}
	}
	g.metrics.Requests.WithLabelValues(class, outcome).Inc()
	if err != nil && status < 500 && !errors.Is(err, mcp.ErrClientGone) && !errors.Is(err, mcp.ErrCancelled) {
		status = http.StatusBadGateway
	}
	return status
}

// identityHeaders are X-Mcp-Tenant / X-Mcp-Subject when the config asks for
// them, encoded by headerSafe.
func (g *Gateway) identityHeaders(rt *runtime, p auth.Principal) http.Header {
	if !rt.cfg.Upstream.IdentityHeaders {
		return nil
	}
	h := make(http.Header, 2)
	h.Set("X-Mcp-Tenant", headerSafe(p.Tenant))
	h.Set("X-Mcp-Subject", headerSafe(p.Subject))
	return h
}

// headerSafe encodes an identity for a header value. Printable ASCII without
// '%' and without leading or trailing spaces is sent as is. Anything else is
// percent-encoded (url.QueryEscape with spaces as %20, so it decodes with
// url.QueryUnescape or url.PathUnescape): a header value can carry neither
// CR/LF nor arbitrary bytes, and HTTP strips the spaces around a value, which
// would make tenant "acme " arrive upstream as "acme". An encoded value
// always contains '%' and a plain one never does, so the upstream can tell
// them apart.
func headerSafe(s string) string {
	escape := len(s) > 0 && (s[0] == ' ' || s[len(s)-1] == ' ')
	for i := 0; i < len(s) && !escape; i++ {
		escape = s[i] < 0x20 || s[i] > 0x7e || s[i] == '%'
	}
	if !escape {
		return s
	}
	return strings.ReplaceAll(url.QueryEscape(s), "+", "%20")
}

// methodClass bounds the cardinality of the method metric label.
func methodClass(m *mcp.Message) string {
	switch m.Method {
	case "initialize", "tools/list", "tools/call", "ping", "resources/list", "resources/read", "prompts/list", "prompts/get":
		return m.Method
	case "":
		return "response"
	}
	if m.Kind == mcp.Notification {
		return "notification"
	}
	return "other"
}

// deniedData is the data member of a 429's JSON-RPC error.
type deniedData struct {
	Scope             string `json:"scope"`
	Rule              string `json:"rule"`
	Limit             int64  `json:"limit"`
	Remaining         int64  `json:"remaining"`
	RetryAfterSeconds int64  `json:"retry_after_seconds"`
}

// denialHeaders sets Retry-After and the rate-limit headers of a denial
// and returns the data both denial answers carry (the 429's error.data, a
// result's structuredContent).
func denialHeaders(w http.ResponseWriter, d limit.Decision, scope string, now time.Time) deniedData {
	ra := retryAfterSeconds(d)
	setRateHeaders(w.Header(), d, now)
	w.Header().Set("Retry-After", strconv.FormatInt(ra, 10))
	return deniedData{Scope: scope, Rule: d.Rule.Name, Limit: d.Limit, Remaining: d.Remaining, RetryAfterSeconds: ra}
}

// writeDenied answers a denied call: 429, Retry-After, rate-limit headers and
// a JSON-RPC error carrying the request's id and code -33029.
func writeDenied(w http.ResponseWriter, id json.RawMessage, d limit.Decision, scope string, now time.Time) {
	data := denialHeaders(w, d, scope, now)
	msg := fmt.Sprintf("rate limit exceeded (%s rule %q); retry in %ds", scope, d.Rule.Name, data.RetryAfterSeconds)
	if d.RetryAfter == limit.Never {
		msg = fmt.Sprintf("call cost exceeds the capacity of %s rule %q: it can never be admitted", scope, d.Rule.Name)
	}
	mcp.WriteError(w, http.StatusTooManyRequests, id, CodeRateLimited, msg, data)
}

// writeMCPError writes a parse error from package mcp.
func writeMCPError(w http.ResponseWriter, err error) {
	var e *mcp.Error
	if errors.As(err, &e) {
		mcp.WriteError(w, e.HTTPStatus, e.ID, e.Code, e.Message, e.Data)
		return
	}
	mcp.WriteError(w, http.StatusBadRequest, nil, mcp.CodeInvalidRequest, err.Error(), nil)
}
