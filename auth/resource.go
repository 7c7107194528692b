package auth

// OAuth 2.0 protected-resource metadata (RFC 9728) and the Bearer challenges
// (RFC 6750 §3) that point clients at it, as MCP authorization (2025-06-18
// and later) asks of a server: a client that gets a 401 reads
// resource_metadata from WWW-Authenticate, fetches the metadata, and finds
// there the authorization servers that issue tokens for this resource.

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// WellKnownResourcePath is the path RFC 9728 §3 registers for
// protected-resource metadata. The metadata of a resource whose URL has a
// path lives at this path followed by that path (§3.1).
const WellKnownResourcePath = "/.well-known/oauth-protected-resource"

// ErrBadResource means a resource identifier cannot name an OAuth protected
// resource: not an absolute http(s) URL, or one with a fragment, query or
// user info.
var ErrBadResource = errors.New("auth: bad resource identifier")

// ResourceMetadata is the protected-resource metadata document of RFC 9728
// §2, limited to the members mcpgate publishes. The zero value is not a
// valid document: Resource and AuthorizationServers are required.
type ResourceMetadata struct {
	// Resource is the resource identifier: the URL a client's token must be
	// issued for (the RFC 8707 resource indicator, the token's aud).
	Resource string `json:"resource"`
	// AuthorizationServers are the issuer URLs (RFC 8414) of the
	// authorization servers that issue tokens for Resource.
	AuthorizationServers []string `json:"authorization_servers"`
	// ScopesSupported are the scope values a client may request.
	ScopesSupported []string `json:"scopes_supported,omitempty"`
	// BearerMethodsSupported are the ways a token may be sent; mcpgate reads
	// it from the Authorization header only.
	BearerMethodsSupported []string `json:"bearer_methods_supported"`
	// ResourceName is a human-readable name of the resource.
	ResourceName string `json:"resource_name,omitempty"`
}

// MetadataURL returns the URL of resource's metadata as RFC 9728 §3.1 forms
// it: the well-known path inserted between the host and the path, so
// "https://gw.example.com/mcp" has its metadata at
// "https://gw.example.com/.well-known/oauth-protected-resource/mcp", and a
// resource without a path (or with "/") at the well-known path alone. It
// fails with ErrBadResource when resource is not an absolute http(s) URL
// without query, fragment and user info.
func MetadataURL(resource string) (string, error) {
	u, err := parseResource(resource)
	if err != nil {
		return "", err
	}
	m := url.URL{Scheme: u.Scheme, Host: u.Host, Path: WellKnownResourcePath + strings.TrimSuffix(u.Path, "/")}
	if u.RawPath != "" {
		m.RawPath = WellKnownResourcePath + strings.TrimSuffix(u.RawPath, "/")
	}
	return m.String(), nil
}

// CheckResource reports, as an ErrBadResource error, why resource cannot be
// a resource identifier (see MetadataURL); nil when it can.
func CheckResource(resource string) error {
	_, err := parseResource(resource)
	return err
}

func parseResource(resource string) (*url.URL, error) {
	u, err := url.Parse(resource)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: %v", ErrBadResource, err)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		return nil, fmt.Errorf("%w: %q is not an absolute http(s) URL", ErrBadResource, resource)
	case u.Fragment != "" || strings.Contains(resource, "#"):
		return nil, fmt.Errorf("%w: %q has a fragment (RFC 8707 forbids one)", ErrBadResource, resource)
	case u.RawQuery != "" || u.ForceQuery:
		return nil, fmt.Errorf("%w: %q has a query", ErrBadResource, resource)
	case u.User != nil:
		return nil, fmt.Errorf("%w: %q has user info", ErrBadResource, resource)
	}
	return u, nil
}

// ChallengeScope is the scope a 401 challenge asks a client to request
// (RFC 6750 §3; MCP authorization's scope selection prefers it to
// scopes_supported): every tool, prompt and resource, the least that lets
// an agent use all the server offers. A token granting less still
// authenticates and works on what it grants; a call outside it gets an
// insufficient_scope challenge naming the scope it needs (NeededScope).
const ChallengeScope = toolScopePrefix + "* " + promptScopePrefix + "* " + resourceScopePrefix + "*"

// ScopesSupported lists the scopes mcpgate understands (see ParseScopes), as
// a metadata document's scopes_supported: "tools:*", "prompts:*" and
// "resources:*", then "tools:<name>" for each of tools, sorted, without
// duplicates. Names that cannot be written as a scope token (RFC 6749 §3.3:
// printable ASCII without space, '"' or '\') are left out; "tools:*" still
// covers them.
func ScopesSupported(tools []string) []string {
	out := []string{toolScopePrefix + "*", promptScopePrefix + "*", resourceScopePrefix + "*"}
	named := make([]string, 0, len(tools))
	for _, t := range tools {
		if s := toolScopePrefix + t; t != "" && t != "*" && validScopeToken(s) {
			named = append(named, s)
		}
	}
	slices.Sort(named)
	return append(out, slices.Compact(named)...)
}

// NeededScope is the scope that grants the tool, resource or prompt a
// caller was refused (kind "tool", "resource" or "prompt"; name is the tool
// or prompt name or the resource URI), for the scope parameter of an
// insufficient_scope challenge: a client that obtains it and retries must
// get through (MCP's step-up authorization), so it is the kind's wildcard
// ("tools:*", ...) when the exact scope cannot be written as a scope token
// (see ScopesSupported), is longer than maxNeededScope, or would not grant
// the resource (an AmbiguousURI, which only "resources:*" allows). Another
// kind yields "".
func NeededScope(kind, name string) string {
	var prefix string
	switch kind {
	case "tool":
		prefix = toolScopePrefix
	case "resource":
		prefix = resourceScopePrefix
		if AmbiguousURI(name) {
			return resourceScopePrefix + "*"
		}
	case "prompt":
		prefix = promptScopePrefix
	default:
		return ""
	}
	return scopeOrWildcard(prefix, name)
}

// NeededTemplateScope is the scope that makes AllowsResourceTemplate allow
// the resource template tmpl (as NeededScope for a template): a glob of
// the template's literal prefix up to its first '{' or '*' followed by
// '*', "resources:file:///docs/*" for "file:///docs/{name}". It is
// "resources:*" when that glob would be empty, too long or not a scope
// token, or when the prefix is an AmbiguousURI; a template without '{' is
// one URI, whose NeededScope it is.
func NeededTemplateScope(tmpl string) string {
	prefix, _, expands := strings.Cut(tmpl, "{")
	if !expands {
		return NeededScope("resource", tmpl)
	}
	if AmbiguousURI(prefix) {
		return resourceScopePrefix + "*"
	}
	lit, _, _ := strings.Cut(prefix, "*")
	return scopeOrWildcard(resourceScopePrefix, lit+"*") // "resources:*" when lit is empty
}

// scopeOrWildcard is prefix+name when that is a scope token of at most
// maxNeededScope bytes, else prefix+"*".
func scopeOrWildcard(prefix, name string) string {
	if s := prefix + name; name != "" && len(s) <= maxNeededScope && validScopeToken(s) {
		return s
	}
	return prefix + "*"
}

// maxNeededScope bounds the scope NeededScope quotes: the name comes from
// the caller and may be as long as the request body.
const maxNeededScope = 512

// validScopeToken reports whether s is a scope-token of RFC 6749 §3.3:
// one or more of %x21 / %x23-5B / %x5D-7E.
func validScopeToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// Challenge is one Bearer challenge of a WWW-Authenticate header (RFC 6750
// §3, with RFC 9728 §5.1's resource_metadata). Empty members are left out.
type Challenge struct {
	Realm            string // "mcpgate"
	Error            string // "invalid_token", "insufficient_scope" or ""
	Scope            string // space-separated scopes the request needs
	ResourceMetadata string // absolute URL of the protected-resource metadata
}

// String renders c as a header value, each member a quoted-string in the
// order realm, error, scope, resource_metadata. '"' and '\' are escaped and
// control characters dropped, so no value can end the string early or
// split the header.
func (c Challenge) String() string {
	var b strings.Builder
	b.WriteString("Bearer")
	sep := " "
	for _, p := range [...]struct{ name, value string }{
		{"realm", c.Realm}, {"error", c.Error}, {"scope", c.Scope}, {"resource_metadata", c.ResourceMetadata},
	} {
		if p.value == "" {
			continue
		}
		b.WriteString(sep)
		b.WriteString(p.name)
		b.WriteString(`="`)
		writeQuoted(&b, p.value)
		b.WriteByte('"')
		sep = ", "
	}
	return b.String()
}

func writeQuoted(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c == 0x7f:
		default:
			b.WriteByte(c)
		}
	}
}
