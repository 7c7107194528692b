package auth

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/lestrrat-go/jwx/v3/jwt"
	"github.com/mcpgate/mcpgate/internal/ident"
)

// claims validates the verified payload and extracts the Principal.
func (a *Authenticator) claims(payload []byte) (Principal, error) {
	// Decode the payload as claims only: a payload that is itself a JWS is
	// not unwrapped (no nested tokens).
	if p := bytes.TrimLeft(payload, " \t\r\n"); len(p) == 0 || p[0] != '{' {
		return Principal{}, invalid("payload is not a JSON object")
	}
	tok := jwt.New()
	if err := json.Unmarshal(payload, tok); err != nil {
		return Principal{}, invalid("bad claims: %v", err)
	}
	if err := numericDates(payload); err != nil {
		return Principal{}, invalid("bad claims: %v", err)
	}
	if err := jwt.Validate(tok, a.validate...); err != nil {
		return Principal{}, invalid("%s", validationReason(err))
	}

	var p Principal
	tenant, ok, err := stringClaim(tok, a.tenantClaim)
	switch {
	case err != nil:
		return Principal{}, invalid("tenant claim %q: %v", a.tenantClaim, err)
	case !ok || tenant == "":
		return Principal{}, invalid("missing tenant claim %q", a.tenantClaim)
	}
	if err := ident.CheckAdmitted(tenant, MaxTenantBytes); err != nil {
		return Principal{}, invalid("tenant claim %q: %v", a.tenantClaim, err)
	}
	p.Tenant = tenant

	sub, ok, err := stringClaim(tok, jwt.SubjectKey)
	switch {
	case err != nil:
		return Principal{}, invalid("sub claim: %v", err)
	case (!ok || sub == "") && a.requireSub:
		// "sub": null reads as "": no subject either, the shared bucket
		// of sub-less tokens RequireSubject keeps them out of.
		return Principal{}, invalid("missing sub claim")
	}
	if err := ident.CheckAdmitted(sub, MaxSubjectBytes); err != nil {
		return Principal{}, invalid("sub claim: %v", err)
	}
	p.Subject = sub

	tier, _, err := stringClaim(tok, a.tierClaim)
	if err != nil {
		return Principal{}, invalid("tier claim %q: %v", a.tierClaim, err)
	}
	if err := ident.CheckAdmitted(tier, MaxTenantBytes); err != nil {
		return Principal{}, invalid("tier claim %q: %v", a.tierClaim, err)
	}
	p.Tier = orDefault(tier, a.defaultTier)

	p.Scopes, err = scopeClaim(tok, a.scopeClaim)
	if err != nil {
		return Principal{}, invalid("scope claim %q: %v", a.scopeClaim, err)
	}
	p.Expiry, _ = tok.Expiration()
	return p, nil
}

// numericDates refuses an exp, nbf or iat that is not a JSON number (RFC
// 7519's NumericDate). The jwt library reads strings too (RFC 3339, digits),
// which other verifiers do not: a token must mean the same to all of them.
func numericDates(payload []byte) error {
	var c map[string]json.RawMessage
	if err := json.Unmarshal(payload, &c); err != nil {
		return err
	}
	for _, name := range []string{jwt.ExpirationKey, jwt.NotBeforeKey, jwt.IssuedAtKey} {
		if v, ok := c[name]; ok && (len(v) == 0 || v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
			var x any
			_ = json.Unmarshal(v, &x)
			return fmt.Errorf("%s is a %s, want a number (NumericDate)", name, jsonKind(x))
		}
	}
	return nil
}

// validationReason names the failed check in words an operator greps for.
func validationReason(err error) string {
	switch {
	case errors.Is(err, jwt.TokenExpiredError()):
		return "expired: " + err.Error()
	case errors.Is(err, jwt.TokenNotYetValidError()):
		return "not yet valid: " + err.Error()
	case errors.Is(err, jwt.InvalidIssuedAtError()):
		return "issued in the future: " + err.Error()
	case errors.Is(err, jwt.InvalidIssuerError()):
		return "wrong issuer: " + err.Error()
	case errors.Is(err, jwt.InvalidAudienceError()):
		return "wrong audience: " + err.Error()
	case errors.Is(err, jwt.MissingRequiredClaimError()):
		return "missing claim: " + err.Error()
	}
	return "invalid claims: " + err.Error()
}

// stringClaim returns the named claim; ok is false when it is absent, and err
// set when it is present but not a string.
func stringClaim(tok jwt.Token, name string) (string, bool, error) {
	if !tok.Has(name) {
		return "", false, nil
	}
	var v any
	if err := tok.Get(name, &v); err != nil {
		return "", false, err
	}
	s, ok := v.(string)
	if !ok {
		return "", true, fmt.Errorf("is a %s, want a string", jsonKind(v))
	}
	return s, true, nil
}

func scopeClaim(tok jwt.Token, name string) (Scopes, error) {
	if !tok.Has(name) {
		return Scopes{}, nil
	}
	var v any
	if err := tok.Get(name, &v); err != nil {
		return Scopes{}, err
	}
	switch v := v.(type) {
	case string:
		return ParseScopes(v), nil
	case []string:
		return parseScopeList(v), nil
	case []any:
		list := make([]string, 0, len(v))
		for _, e := range v {
			s, ok := e.(string)
			if !ok {
				return Scopes{}, fmt.Errorf("array holds a %s, want strings", jsonKind(e))
			}
			list = append(list, splitScopes(s)...)
		}
		return parseScopeList(list), nil
	}
	return Scopes{}, fmt.Errorf("is a %s, want a string or an array of strings", jsonKind(v))
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case float64, json.Number, int, int64:
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}
