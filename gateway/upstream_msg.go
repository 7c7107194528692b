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

// cancelTimeout bounds the cancellation the gateway sends for a call the
// upstream may still be running.
const cancelTimeout = 2 * time.Second

// stopUpstream is called before a request whose ticket holds concurrency
// slots is settled (its slots freed), for a request the upstream may still
// be working on: its client went away before the answer, or the gateway
// cut its upstream request (cut, see cutUpstream: a timeout, or the bound
// on a detached call's answer). In the request's session it tells the
// upstream to stop it (a notifications/cancelled naming id): an upstream
// on MCP 2025 sessions (the Go SDK's) goes on running a tool whose HTTP
// request was closed, and the freed slot would let another call run beside
// it ("call, hang up, call again" under a limit of one). A request the
// client cancelled itself needs nothing more (its own notification went
// upstream), nor one without a session whose client left (its answer was
// read to its end, see outlivesClient).
//
// It reports whether the upstream may still be running the request all
// the same (enforce.Outcome.Running: its slots stay held until their lease
// lapses): cut without a session (nothing can stop it), or cut or left
// and its cancellation could not be sent.
func (g *Gateway) stopUpstream(r *http.Request, p auth.Principal, id json.RawMessage, cut bool) (running bool) {
	session := r.Header.Get(mcp.HeaderSessionID)
	abandoned := r.Context().Err() != nil && !errors.Is(context.Cause(r.Context()), mcp.ErrCancelled)
	if !cut && (!abandoned || session == "") {
		return false
	}
	if session == "" || len(id) == 0 {
		return cut
	}
	reason := "the client went away"
	if cut {
		reason = "the gateway's upstream timeout"
	}
	body, err := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "method": "notifications/cancelled",
		"params": map[string]any{"requestId": id, "reason": reason},
	})
	if err != nil {
		return true
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), cancelTimeout)
	defer cancel()
	if err := g.sendUpstream(ctx, g.tracker.hc, http.MethodPost, p.Tenant, p.Subject, session, r.Header.Get(mcp.HeaderProtocolVersion), body); err != nil {
		g.log.Warn("cancelling a call upstream failed: its slots stay held until their lease lapses", "tenant", p.Tenant, "err", err)
		return true
	}
	return false
}
