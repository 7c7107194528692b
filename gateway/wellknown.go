package gateway

// OAuth discovery (MCP authorization, 2025-06-18 and later): with
// auth.authorization_servers configured, the gateway is an OAuth protected
// resource that says where its tokens come from. It serves RFC 9728
// metadata, and its 401s and 403s carry resource_metadata pointing there,
// so a client holding no token (or too narrow a one) finds the
// authorization server without being told.

import (
	"encoding/json"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/mcpgate/mcpgate/auth"
)

// mcpPath is the MCP endpoint, the path of a derived resource identifier.
const mcpPath = "/mcp"

// wellKnownRoutes registers the protected-resource metadata paths. They are
// registered whatever the config says: a reload may add or remove the
// authorization servers, and without them every path answers 404.
func (g *Gateway) wellKnownRoutes(mux *http.ServeMux) {
	mux.HandleFunc(auth.WellKnownResourcePath, g.serveResourceMetadata)
	mux.HandleFunc(auth.WellKnownResourcePath+"/", g.serveResourceMetadata)
}

// serveResourceMetadata answers the RFC 9728 metadata document at the
// well-known path alone, followed by /mcp, or followed by the path of a
// configured auth.resource; every one of them serves the same document, so
// a client finds it by the 401's resource_metadata, by path insertion from
// the MCP URL, or at the root as MCP's fallback. The document is public:
// no token, any origin (CORS *, preflight answered).
func (g *Gateway) serveResourceMetadata(w http.ResponseWriter, r *http.Request) {
	rt := g.rt.Load()
	a := rt.cfg.Auth
	resource := g.resourceOf(rt, r)
	if len(a.AuthorizationServers) == 0 || resource == "" || !servesMetadataAt(r.URL.Path, a.Resource) {
		http.NotFound(w, r)
		return
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", "*")
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	case http.MethodOptions:
		h.Set("Access-Control-Allow-Methods", "GET, HEAD, OPTIONS")
		h.Set("Access-Control-Allow-Headers", "MCP-Protocol-Version")
		w.WriteHeader(http.StatusNoContent)
		return
	default:
		h.Set("Allow", "GET, HEAD, OPTIONS")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	body, err := json.Marshal(auth.ResourceMetadata{
		Resource:               resource,
		AuthorizationServers:   a.AuthorizationServers,
		ScopesSupported:        auth.ScopesSupported(slices.Collect(maps.Keys(rt.cfg.Tools))),
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "mcpgate",
	})
	if err != nil { // strings and string slices only: cannot fail
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	h.Set("Content-Type", "application/json")
	if a.Resource == "" {
		h.Set("Cache-Control", "no-store") // it follows the Host of each request
	} else {
		h.Set("Cache-Control", "max-age=300")
	}
	_, _ = w.Write(body)
}

// servesMetadataAt reports whether path is one of the metadata paths: the
// well-known path, alone or followed by /mcp or by the path of configured
// (the auth.resource setting, "" when unset).
func servesMetadataAt(path, configured string) bool {
	suffix, ok := strings.CutPrefix(path, auth.WellKnownResourcePath)
	if !ok {
		return false
	}
	if suffix == "" || suffix == mcpPath {
		return true
	}
	if u, err := url.Parse(configured); err == nil && configured != "" {
		return suffix == strings.TrimSuffix(u.Path, "/")
	}
	return false
}

// resourceOf is the gateway's resource identifier for r: auth.resource when
// set, else derived from r (see derivedResource), "" when it cannot be.
func (g *Gateway) resourceOf(rt *runtime, r *http.Request) string {
	if res := rt.cfg.Auth.Resource; res != "" {
		return res
	}
	if len(rt.cfg.Auth.AuthorizationServers) > 0 && forwarded(r) && g.proxyWarned.CompareAndSwap(false, true) {
		g.log.Warn("a request came through a proxy (it carries forwarded headers) and auth.resource is not set: "+
			"the OAuth resource and metadata URL are derived from what reached mcpgate, not what the client used; set auth.resource",
			"host", r.Host, "tls", r.TLS != nil)
	}
	return derivedResource(r)
}

// derivedResource is the URL of the MCP endpoint as r reached the gateway:
// https when r came over TLS, else http; r's Host, lower-cased (the
// listener's address if r has none); path /mcp. X-Forwarded-Proto,
// X-Forwarded-Host and Forwarded are never read: any client can send them,
// and a resource a client can choose would let it steer others' tokens'
// audience and metadata. It is "" when the result is not a valid resource
// identifier.
func derivedResource(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	host := strings.ToLower(r.Host)
	if host == "" {
		if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			host = a.String()
		}
	}
	res := (&url.URL{Scheme: scheme, Host: host, Path: mcpPath}).String()
	if host == "" || auth.CheckResource(res) != nil {
		return ""
	}
	return res
}

// forwarded reports whether r carries a proxy's forwarding headers.
func forwarded(r *http.Request) bool {
	for _, h := range []string{"Forwarded", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Forwarded-For"} {
		if r.Header.Get(h) != "" {
			return true
		}
	}
	return false
}

// resourceMetadataURL is the absolute URL of the metadata for a challenge's
// resource_metadata, "" when no authorization server is configured (the
// challenges then stay as without OAuth) or the resource is unknown.
func (g *Gateway) resourceMetadataURL(rt *runtime, r *http.Request) string {
	if len(rt.cfg.Auth.AuthorizationServers) == 0 {
		return ""
	}
	res := g.resourceOf(rt, r)
	if res == "" {
		return ""
	}
	u, err := auth.MetadataURL(res)
	if err != nil {
		return ""
	}
	return u
}
