package gateway

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/internal/clip"
	"github.com/mcpgate/mcpgate/mcp"
)

// maxDeniedName bounds the tool name, resource URI or prompt name quoted in
// a 403: it comes from the caller and may be as long as the body.
const maxDeniedName = 256

// denial is a request the caller's scopes do not allow.
type denial struct {
	kind  string // "tool", "resource" or "prompt": the data member naming it
	name  string // the tool, resource URI or prompt, cut to maxDeniedName
	scope string // the scope that would allow it (auth.NeededScope)
	// invalid, when set, refuses a request the gateway cannot read: no
	// scope would let it through, so it is answered as it is (a 400),
	// with no kind, name, scope or challenge.
	invalid *mcp.Error
}

// authorize checks msg against the caller's scopes and returns the list
// filter msg's answer needs (the zero Filter for none), or the denial. tools/call, resources/read and
// prompts/get outside the scopes are denied, and so are resources/subscribe,
// resources/unsubscribe and subscriptions/listen of a resource outside them (zero trust: a kind the scopes
// do not mention is wholly denied); tools/list, resources/list,
// resources/templates/list and prompts/list answers are trimmed to what the
// scopes allow (see auth.Scopes.AllowsResourceTemplate for templates).
// Other methods pass unchanged.
func authorize(p auth.Principal, msg *mcp.Message) (mcp.Filter, *denial) {
	sc := p.Scopes
	deny := func(kind string, allowed bool) (mcp.Filter, *denial) {
		if allowed {
			return mcp.Filter{}, nil
		}
		return mcp.Filter{}, &denial{kind: kind, name: clip.String(msg.Name, maxDeniedName), scope: auth.NeededScope(kind, msg.Name)}
	}
	switch msg.Method {
	case mcp.MethodToolsCall:
		return deny("tool", sc.AllowsTool(msg.Name))
	case mcp.MethodResourcesRead, mcp.MethodResourcesSubscribe, mcp.MethodResourcesUnsubscribe:
		return deny("resource", sc.AllowsResource(msg.Name))
	case mcp.MethodPromptsGet:
		return deny("prompt", sc.AllowsPrompt(msg.Name))
	case mcp.MethodCompletionComplete:
		return mcp.Filter{}, authorizeCompletion(sc, msg)
	case mcp.MethodSubscriptionsListen:
		return mcp.Filter{}, authorizeListen(sc, msg)
	case mcp.MethodToolsList:
		return mcp.Filter{List: mcp.ToolsList, Allow: sc.AllowsTool}, nil
	case mcp.MethodResourcesList:
		return mcp.Filter{List: mcp.ResourcesList, Allow: sc.AllowsResource}, nil
	case mcp.MethodResourceTemplatesList:
		return mcp.Filter{List: mcp.ResourceTemplatesList, Allow: sc.AllowsResourceTemplate}, nil
	case mcp.MethodPromptsList:
		return mcp.Filter{List: mcp.PromptsList, Allow: sc.AllowsPrompt}, nil
	}
	return mcp.Filter{}, nil
}

// authorizeCompletion scopes completion/complete like what it completes: a
// prompt's arguments need the prompt, a resource template's need the
// template. A ref the gateway cannot read unambiguously, or of another
// type, is a bad request: no scope would let it through.
func authorizeCompletion(sc auth.Scopes, msg *mcp.Message) *denial {
	kind, name, err := mcp.CompletionRef(msg)
	switch {
	case err != nil:
		return &denial{invalid: err}
	case kind == "prompt" && !sc.AllowsPrompt(name):
		return &denial{kind: kind, name: clip.String(name, maxDeniedName), scope: auth.NeededScope(kind, name)}
	case kind == "resource" && !sc.AllowsResourceTemplate(name):
		return &denial{kind: kind, name: clip.String(name, maxDeniedName), scope: auth.NeededTemplateScope(name)}
	}
	return nil
}

// authorizeListen scopes a subscriptions/listen (MCP 2026-07-28) like the
// resources/subscribe it replaces: every resource it asks updates of must
// be in the scopes, or the whole request is denied, naming the first that
// is not. A request the gateway cannot read strictly is a bad request.
func authorizeListen(sc auth.Scopes, msg *mcp.Message) *denial {
	uris, err := mcp.ListenResources(msg)
	if err != nil {
		return &denial{invalid: err}
	}
	var d *denial
	var scopes []string
	for _, uri := range uris {
		if sc.AllowsResource(uri) {
			continue
		}
		if d == nil {
			d = &denial{kind: "resource", name: clip.String(uri, maxDeniedName)}
		}
		scopes = append(scopes, auth.NeededScope("resource", uri))
	}
	if d != nil {
		d.scope = listenScope(scopes)
	}
	return d
}

// listenScope joins the scopes of every resource a subscriptions/listen
// was refused, so that one step-up grants them all (a client retries once):
// "resources:*" when one of them is, or when the list is longer than a
// challenge should carry.
func listenScope(scopes []string) string {
	slices.Sort(scopes)
	scopes = slices.Compact(scopes)
	s := strings.Join(scopes, " ")
	if slices.Contains(scopes, "resources:*") || len(s) > maxListenScope {
		return "resources:*"
	}
	return s
}

// maxListenScope bounds the scope a subscriptions/listen's challenge names:
// its URIs come from the caller and may fill the body.
const maxListenScope = 2048

// authorized runs authorize for msg, the message of request r whose caller
// is p, and returns the list filter of its answer; it answers a denial
// itself (403, a JSON-RPC error naming what was refused, nothing
// forwarded; a 400 for a request it cannot read) and then returns ok false. With authorization servers
// configured the 403 also carries an insufficient_scope challenge (RFC
// 6750 §3.1) naming the scope needed and the metadata, from which a client
// can ask the authorization server for it (MCP's step-up authorization).
func (g *Gateway) authorized(w http.ResponseWriter, r *http.Request, rt *runtime, p auth.Principal, msg *mcp.Message) (_ mcp.Filter, ok bool) {
	filter, d := authorize(p, msg)
	if d == nil {
		return filter, true
	}
	if d.invalid != nil {
		g.metrics.Requests.WithLabelValues(methodClass(msg), "bad_request").Inc()
		d.invalid.Respond(w)
		return mcp.Filter{}, false
	}
	if meta := g.resourceMetadataURL(rt, r); meta != "" {
		w.Header().Set("WWW-Authenticate", auth.Challenge{
			Realm: "mcpgate", Error: "insufficient_scope", Scope: d.scope, ResourceMetadata: meta,
		}.String())
	}
	g.metrics.Requests.WithLabelValues(methodClass(msg), "forbidden").Inc()
	mcp.WriteError(w, http.StatusForbidden, msg.ID, CodeForbidden,
		fmt.Sprintf("%s %q is not in the caller's scopes", d.kind, d.name), map[string]any{d.kind: d.name})
	return mcp.Filter{}, false
}

// listFilters are the filters authorize sets for a tools/list,
// resources/list, resources/templates/list and prompts/list of a caller
// with scopes sc, all four: the Forward.ReplayFilters of that caller's
// requests, so that a list answer replayed on a resumed stream (GET with
// Last-Event-ID) is trimmed as its POST's answer was.
func listFilters(sc auth.Scopes) []mcp.Filter {
	return []mcp.Filter{
		{List: mcp.ToolsList, Allow: sc.AllowsTool},
		{List: mcp.ResourcesList, Allow: sc.AllowsResource},
		{List: mcp.ResourceTemplatesList, Allow: sc.AllowsResourceTemplate},
		{List: mcp.PromptsList, Allow: sc.AllowsPrompt},
	}
}
