package gosdk

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	sdkauth "github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/policy"
)

// Keys of auth.TokenInfo.Extra (the go-sdk's auth package) under which
// SetIdentity records the caller, and TokenIdentity reads it: each a string.
const (
	ExtraTenant  = "mcpgate.tenant"
	ExtraTier    = "mcpgate.tier"
	ExtraSubject = "mcpgate.subject"
)

// ErrUnauthenticated means a request carries no authenticated caller: no
// auth.TokenInfo, or one without a tenant (see TokenIdentity).
var ErrUnauthenticated = errors.New("gosdk: the request has no authenticated caller")

// SetIdentity records id in info: the tenant, tier and subject under
// ExtraTenant, ExtraTier and ExtraSubject, and UserID the tenant and
// subject together ("acme"/"alice", each quoted), so that the SDK's
// Streamable HTTP handler binds a session to the tenant's subject that
// opened it, never to a same-named subject of another tenant.
func SetIdentity(info *sdkauth.TokenInfo, id Identity) {
	if info.Extra == nil {
		info.Extra = make(map[string]any, 3)
	}
	info.Extra[ExtraTenant] = id.Tenant
	info.Extra[ExtraTier] = id.Tier
	info.Extra[ExtraSubject] = id.Subject
	info.UserID = strconv.Quote(id.Tenant) + "/" + strconv.Quote(id.Subject)
}

// TokenIdentity is the default Options.Identity: the caller SetIdentity
// recorded in the request's auth.TokenInfo (req.GetExtra().TokenInfo, which
// the SDK's Streamable HTTP handler takes from auth.RequireBearerToken). A
// request without TokenInfo, or whose TokenInfo names no tenant, is
// refused with ErrUnauthenticated.
func TokenIdentity(_ context.Context, req mcp.Request) (Identity, error) {
	info := tokenInfo(req)
	if info == nil {
		return Identity{}, ErrUnauthenticated
	}
	tenant, _ := info.Extra[ExtraTenant].(string)
	if tenant == "" {
		return Identity{}, ErrUnauthenticated
	}
	tier, _ := info.Extra[ExtraTier].(string)
	subject, _ := info.Extra[ExtraSubject].(string)
	return Identity{Tenant: tenant, Tier: tier, Subject: subject}, nil
}

func tokenInfo(req mcp.Request) *sdkauth.TokenInfo {
	if req == nil {
		return nil
	}
	if extra := req.GetExtra(); extra != nil {
		return extra.TokenInfo
	}
	return nil
}

// TokenVerifier is an auth.TokenVerifier (the go-sdk's) that verifies a
// bearer JWT with a (mcpgate's JWT verification: keys, issuer, audience,
// expiry, tenant claim) and fills the TokenInfo: Scopes the token's scopes
// in canonical form (auth.Scopes.String, split), Expiration the exp a
// read (auth.Principal.Expiry, zero without one: the go-sdk then agrees
// with a on every token), and the caller through SetIdentity. A token a
// refuses is sdkauth.ErrInvalidToken, whose text is all the caller sees:
// the reason is not given away.
func TokenVerifier(a *auth.Authenticator) sdkauth.TokenVerifier {
	return func(ctx context.Context, token string, _ *http.Request) (*sdkauth.TokenInfo, error) {
		p, err := a.Verify(ctx, token)
		if err != nil {
			return nil, sdkauth.ErrInvalidToken
		}
		info := &sdkauth.TokenInfo{Scopes: strings.Fields(p.Scopes.String()), Expiration: p.Expiry}
		SetIdentity(info, Identity{Tenant: p.Tenant, Tier: p.Tier, Subject: p.Subject})
		return info, nil
	}
}

// BearerOptions are the go-sdk's RequireBearerToken options that agree with
// cfg's auth.jwt section: a token without exp is let through when
// require_expiry is false (the authenticator decides), and the clock skew
// on exp is auth.jwt.leeway.
func BearerOptions(cfg *policy.Config) *sdkauth.RequireBearerTokenOptions {
	return &sdkauth.RequireBearerTokenOptions{
		AllowMissingExpiration: !cfg.Auth.JWT.RequireExpiry,
		ClockSkew:              max(cfg.Auth.JWT.Leeway, 0),
	}
}

// RequireBearerToken is HTTP middleware that lets through only requests
// with a bearer token a verifies, and puts the caller in the request's
// auth.TokenInfo for the SDK's Streamable HTTP handler, where Middleware and
// ScopeMiddleware read it: the go-sdk's auth.RequireBearerToken with
// TokenVerifier(a) and BearerOptions(cfg). Other requests get 401 with
// `WWW-Authenticate: Bearer realm="mcpgate"` and a body that names no
// failed check. OAuth discovery (auth.authorization_servers) is the
// gateway's: no resource metadata is served or pointed at.
func RequireBearerToken(a *auth.Authenticator, cfg *policy.Config) func(http.Handler) http.Handler {
	require := sdkauth.RequireBearerToken(TokenVerifier(a), BearerOptions(cfg))
	return func(h http.Handler) http.Handler {
		inner := require(h)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inner.ServeHTTP(&challenger{ResponseWriter: w}, r)
		})
	}
}

// challenger adds a Bearer challenge to a 401 that has none.
type challenger struct {
	http.ResponseWriter
	wrote bool
}

func (c *challenger) WriteHeader(code int) {
	if !c.wrote && code == http.StatusUnauthorized && c.Header().Get("WWW-Authenticate") == "" {
		c.Header().Set("WWW-Authenticate", auth.Challenge{Realm: "mcpgate"}.String())
	}
	c.wrote = true
	c.ResponseWriter.WriteHeader(code)
}

func (c *challenger) Write(b []byte) (int, error) {
	c.wrote = true
	return c.ResponseWriter.Write(b)
}

// Flush passes on to the wrapped writer: the SDK streams SSE answers.
func (c *challenger) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the wrapped writer.
func (c *challenger) Unwrap() http.ResponseWriter { return c.ResponseWriter }
