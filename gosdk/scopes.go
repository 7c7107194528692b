package gosdk

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/internal/clip"
)

// maxDeniedName bounds the name or URI quoted in a refusal: it comes from
// the caller.
const maxDeniedName = 256

// TokenScopes is ScopeMiddleware's default source of scopes: the Scopes of
// the request's auth.TokenInfo (as TokenVerifier fills them), parsed with
// auth.ParseScopes. A request without TokenInfo is refused with
// ErrUnauthenticated.
func TokenScopes(_ context.Context, req mcp.Request) (auth.Scopes, error) {
	info := tokenInfo(req)
	if info == nil {
		return auth.Scopes{}, ErrUnauthenticated
	}
	return auth.ParseScopes(strings.Join(info.Scopes, " ")), nil
}

// ScopeMiddleware returns receiving middleware that holds every request to
// the caller's scopes, as the gateway does (see auth.Scopes): a tools/call,
// prompts/get, resources/read, resources/subscribe or resources/unsubscribe
// outside them, a subscriptions/listen asking updates of a resource outside
// them, and a completion/complete of a prompt or resource template
// outside them, is refused with a *jsonrpc.Error of code CodeForbidden whose
// data names what was refused ({"tool": name}, {"prompt": name} or
// {"resource": uri}); tools/list, prompts/list, resources/list and
// resources/templates/list answers are trimmed to what the scopes allow,
// and say cacheScope "private" (see trim).
// Other requests and notifications pass unchanged. scopes names the caller's
// scopes (nil: TokenScopes); its error refuses the request like
// Options.Identity's.
//
// Put it before Middleware, so that a refused call is not charged:
// server.AddReceivingMiddleware(gosdk.ScopeMiddleware(nil), gosdk.Middleware(engine, nil)).
func ScopeMiddleware(scopes func(ctx context.Context, req mcp.Request) (auth.Scopes, error)) mcp.Middleware {
	if scopes == nil {
		scopes = TokenScopes
	}
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if isNotification(method) || !scoped(method) {
				return next(ctx, method, req)
			}
			sc, err := scopes(ctx, req)
			if err != nil {
				return nil, unauthenticated(err)
			}
			if err := authorize(sc, req.GetParams()); err != nil {
				return nil, err
			}
			res, err := next(ctx, method, req)
			if err != nil {
				return res, err
			}
			return trim(sc, res), nil
		}
	}
}

// scoped reports whether requests of method are checked or trimmed.
func scoped(method string) bool {
	switch method {
	case "tools/call", "tools/list", "prompts/get", "prompts/list", "resources/read", "resources/list",
		"resources/templates/list", "resources/subscribe", "resources/unsubscribe", "completion/complete",
		"subscriptions/listen":
		return true
	}
	return false
}

// authorize refuses a request for what the scopes do not allow.
func authorize(sc auth.Scopes, params mcp.Params) error {
	switch p := params.(type) {
	case *mcp.CallToolParamsRaw:
		return allowed("tool", p != nil && sc.AllowsTool(p.Name), nameOf(p, func(p *mcp.CallToolParamsRaw) string { return p.Name }))
	case *mcp.GetPromptParams:
		return allowed("prompt", p != nil && sc.AllowsPrompt(p.Name), nameOf(p, func(p *mcp.GetPromptParams) string { return p.Name }))
	case *mcp.ReadResourceParams:
		return allowed("resource", p != nil && sc.AllowsResource(p.URI), nameOf(p, func(p *mcp.ReadResourceParams) string { return p.URI }))
	case *mcp.SubscribeParams:
		return allowed("resource", p != nil && sc.AllowsResource(p.URI), nameOf(p, func(p *mcp.SubscribeParams) string { return p.URI }))
	case *mcp.UnsubscribeParams:
		return allowed("resource", p != nil && sc.AllowsResource(p.URI), nameOf(p, func(p *mcp.UnsubscribeParams) string { return p.URI }))
	case *mcp.SubscriptionsListenParams:
		// MCP 2026-07-28's replacement of resources/subscribe: every
		// resource it asks updates of must be allowed.
		if p != nil && p.Notifications != nil {
			for _, uri := range p.Notifications.ResourceSubscriptions {
				if err := allowed("resource", sc.AllowsResource(uri), uri); err != nil {
					return err
				}
			}
		}
		return nil
	case *mcp.CompleteParams:
		// Completions are scoped like what they complete. A ref of
		// another type (none, a case variant) is no request any scope
		// could allow: invalid params, as the gateway answers it (an
		// upstream folding case would complete a prompt no scope allows).
		switch {
		case p == nil || p.Ref == nil:
		case p.Ref.Type == "ref/prompt":
			return allowed("prompt", sc.AllowsPrompt(p.Ref.Name), p.Ref.Name)
		case p.Ref.Type == "ref/resource":
			return allowed("resource", sc.AllowsResourceTemplate(p.Ref.URI), p.Ref.URI)
		}
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "completion/complete: ref must be of type ref/prompt or ref/resource"}
	}
	return nil
}

func nameOf[P any](p *P, name func(*P) string) string {
	if p == nil {
		return ""
	}
	return name(p)
}

// allowed is nil when ok, else the refusal of kind name.
func allowed(kind string, ok bool, name string) error {
	if ok {
		return nil
	}
	name = clip.String(name, maxDeniedName)
	data, _ := json.Marshal(map[string]string{kind: name})
	return &jsonrpc.Error{Code: CodeForbidden, Message: fmt.Sprintf("%s %q is not in the caller's scopes", kind, name), Data: data}
}

// trim returns a list answer without what the scopes do not allow, and
// with cacheScope "private" (MCP 2026-07-28 caching hints): the list is the
// caller's, and a shared intermediary must not serve it to another caller
// (the gateway marks the lists it filters so, mcp.Filter.Private); its
// ttlMs is kept. Other answers are unchanged. The handler's result is not
// modified.
func trim(sc auth.Scopes, res mcp.Result) mcp.Result {
	switch r := res.(type) {
	case *mcp.ListToolsResult:
		if r != nil {
			out := *r
			out.CacheScope = "private"
			out.Tools = keep(r.Tools, func(t *mcp.Tool) bool { return t != nil && sc.AllowsTool(t.Name) })
			return &out
		}
	case *mcp.ListPromptsResult:
		if r != nil {
			out := *r
			out.CacheScope = "private"
			out.Prompts = keep(r.Prompts, func(p *mcp.Prompt) bool { return p != nil && sc.AllowsPrompt(p.Name) })
			return &out
		}
	case *mcp.ListResourcesResult:
		if r != nil {
			out := *r
			out.CacheScope = "private"
			out.Resources = keep(r.Resources, func(x *mcp.Resource) bool { return x != nil && sc.AllowsResource(x.URI) })
			return &out
		}
	case *mcp.ListResourceTemplatesResult:
		if r != nil {
			out := *r
			out.CacheScope = "private"
			out.ResourceTemplates = keep(r.ResourceTemplates, func(x *mcp.ResourceTemplate) bool {
				return x != nil && sc.AllowsResourceTemplate(x.URITemplate)
			})
			return &out
		}
	}
	return res
}

// keep returns the elements of s that ok allows, in a new slice (never nil,
// so that an empty list is [] on the wire).
func keep[T any](s []T, ok func(T) bool) []T {
	out := make([]T, 0, len(s))
	for _, v := range s {
		if ok(v) {
			out = append(out, v)
		}
	}
	return out
}
