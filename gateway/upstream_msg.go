package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/internal/redact"
	"github.com/mcpgate/mcpgate/mcp"
)

// sendUpstream makes a request of the gateway's own to the upstream, in
// session (its upstream id): a DELETE that ends an idle session, or a
// notification. It carries the configured upstream headers and, when the
// config asks for them, the identity headers of tenant and subject. The
// answer's body is discarded.
func (g *Gateway) sendUpstream(ctx context.Context, hc *http.Client, method, tenant, subject, session, protocol string, body []byte) error {
	_, err := g.askUpstream(ctx, hc, method, tenant, subject, session, protocol, body)
	return err
}

// askUpstream is sendUpstream for a caller that reads the answer's status:
// whether the upstream did what it was asked is for the caller to judge.
func (g *Gateway) askUpstream(ctx context.Context, hc *http.Client, method, tenant, subject, session, protocol string, body []byte) (status int, err error) {
	rt := g.rt.Load()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, rt.cfg.Upstream.URL, rd)
	if err != nil {
		return 0, err
	}
	for k, v := range rt.cfg.Upstream.Headers {
		req.Header.Set(k, v)
	}
	if rt.cfg.Upstream.IdentityHeaders {
		req.Header.Set(mcp.HeaderTenant, headerSafe(tenant))
		req.Header.Set(mcp.HeaderSubject, headerSafe(subject))
	}
	req.Header.Set(mcp.HeaderSessionID, session)
	if protocol != "" {
		req.Header.Set(mcp.HeaderProtocolVersion, protocol)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, redact.URLError(err) // the URL may carry the upstream's credential
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, resp.Body.Close()
}

// cancelTimeout bounds the cancellation the gateway sends for a call whose
// client went away.
const cancelTimeout = 2 * time.Second

// cancelAbandoned tells the upstream to stop a call whose client went away
// before its answer (a notifications/cancelled in the call's session), so
// that the call's concurrency slot, freed right after, is not freed while
// the upstream still works on it: an upstream on MCP 2025 sessions (the Go
// SDK's) goes on running a tool whose HTTP request was closed. A call the
// client cancelled itself needs nothing (its own notification went
// upstream), nor one without a session (nothing can cancel it upstream:
// its answer is read to its end, see outlivesClient).
func (g *Gateway) cancelAbandoned(r *http.Request, p auth.Principal, id json.RawMessage) {
	session := r.Header.Get(mcp.HeaderSessionID)
	if r.Context().Err() == nil || errors.Is(context.Cause(r.Context()), mcp.ErrCancelled) || session == "" || len(id) == 0 {
		return
	}
	body, err := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "method": "notifications/cancelled",
		"params": map[string]any{"requestId": id, "reason": "the client went away"},
	})
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), cancelTimeout)
	defer cancel()
	if err := g.sendUpstream(ctx, g.tracker.hc, http.MethodPost, p.Tenant, p.Subject, session, r.Header.Get(mcp.HeaderProtocolVersion), body); err != nil {
		g.log.Warn("cancelling an abandoned call upstream failed", "tenant", p.Tenant, "err", err)
	}
}
