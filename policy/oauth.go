package policy

// auth.authorization_servers and auth.resource: MCP authorization's OAuth
// discovery (RFC 9728 protected-resource metadata, RFC 8707 audience).

import (
	"net"
	"net/url"
	"strings"

	"gopkg.in/yaml.v3"
)

// authorizationServers decodes auth.authorization_servers: a list of issuer
// URLs (RFC 8414), each https (http only on a loopback host, for
// development), without query, fragment or user info, none repeated.
func (d *decoder) authorizationServers(n *yaml.Node, path string) []string {
	var out []string
	seen := map[string]bool{}
	d.list(n, path, func(_ int, v *yaml.Node, p string) {
		s, ok := d.str(v, p)
		if !ok || !d.checkOAuthURL(v, p, s, "an authorization server's issuer URL") {
			return
		}
		if seen[s] {
			d.errf(v, p, "%q is listed twice", s)
			return
		}
		seen[s] = true
		out = append(out, s)
	})
	return out
}

// resource decodes auth.resource, the resource identifier tokens must be
// issued for; "" (not set) is allowed. It must be spelled as clients
// spell it: they ask the authorization server for a token for the URL as
// a WHATWG parser writes it (the TypeScript SDK sends new URL(resource).href),
// the server puts that in aud, and aud is compared with auth.resource
// exactly (RFC 8707), so any other spelling would refuse every token.
// Refusing it says so at startup, where normalising it silently would
// publish a resource other than the one configured.
func (d *decoder) resource(n *yaml.Node, path string) string {
	s, ok := d.str(n, path)
	if !ok || s == "" || !d.checkOAuthURL(n, path, s, "the gateway's public MCP URL, e.g. https://mcp.example.com/mcp") {
		return ""
	}
	if c := canonicalURL(s); c != s {
		d.errf(n, path, "%q is not how clients spell this URL: write %q (tokens carry it in aud, compared exactly)", s, c)
		return ""
	}
	return s
}

// canonicalURL is the absolute http(s) URL s (checkOAuthURL accepted it)
// as a WHATWG URL parser serialises it, as far as the spelling of an OAuth
// resource can differ: scheme and host lower case, no default or empty
// port, "/" for an empty path.
func canonicalURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	c := *u
	c.Scheme = strings.ToLower(u.Scheme)
	c.Host = strings.ToLower(u.Host)
	if p := u.Port(); p == "" || p == defaultPorts[c.Scheme] {
		c.Host = strings.TrimSuffix(c.Host, ":"+p)
	}
	if c.Path == "" {
		c.Path, c.RawPath = "/", ""
	}
	return c.String()
}

// defaultPorts are the ports a WHATWG URL parser drops from a URL of each
// scheme.
var defaultPorts = map[string]string{"http": "80", "https": "443"}

// checkResourceAlone warns about auth.resource without
// auth.authorization_servers: the audience is checked, nothing is served.
func (d *decoder) checkResourceAlone(n *yaml.Node, path string, a *Auth) {
	if n != nil && a.Resource != "" && len(a.AuthorizationServers) == 0 {
		d.warnf(n, path, "set without auth.authorization_servers: tokens must carry it in aud, but no protected-resource metadata is served")
	}
}

// checkAudienceUnbound warns about auth.authorization_servers with no
// audience to check: MCP authorization binds a token to its resource
// (RFC 8707), and without auth.resource or auth.jwt.audience a token the
// same servers issued for any other resource is accepted here.
func (d *decoder) checkAudienceUnbound(n *yaml.Node, path string, a *Auth) {
	if n != nil && len(a.AuthorizationServers) > 0 && a.Resource == "" && a.JWT.Audience == "" {
		d.warnf(n, path, "set without auth.resource or auth.jwt.audience: aud is not checked, so a token these servers issued for another resource is accepted (set auth.resource to this gateway's public MCP URL)")
	}
}

// checkOAuthURL records why s cannot be an OAuth URL (want describes what
// is expected) and reports whether it can.
func (d *decoder) checkOAuthURL(n *yaml.Node, path, s, want string) bool {
	u, err := url.Parse(s)
	var problem string
	switch {
	case err != nil || u.Host == "" || u.Scheme != "https" && u.Scheme != "http":
		problem = "want an absolute https:// URL"
	case u.Scheme == "http" && !loopbackHost(u.Hostname()):
		problem = "must be https (http is allowed for localhost, 127.0.0.1 and [::1] only, for development)"
	case u.User != nil:
		problem = "must not carry user info"
	case u.RawQuery != "" || u.ForceQuery:
		problem = "must not have a query"
	case u.Fragment != "" || strings.Contains(s, "#"):
		problem = "must not have a fragment"
	default:
		return true
	}
	d.errf(n, path, "bad URL %q: %s (%s)", redact(s), problem, want)
	return false
}

// loopbackHost reports whether host names this machine: localhost or a
// loopback IP literal (127.0.0.1, ::1).
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && (ip.Equal(net.IPv4(127, 0, 0, 1)) || ip.Equal(net.IPv6loopback))
}
