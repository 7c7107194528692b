// Package auth turns a bearer JWT into a Principal: who is calling (tenant,
// subject), on which tier, and which tools, resources and prompts they may
// use.
//
// Verification is strict by construction:
//
//   - The algorithms a token may use come from the configured key (its type,
//     curve, and for a JWK its "alg"), never from the token header: "none" is
//     always refused, an HS256 secret never verifies an RS256 token and an RSA
//     public key is never used as an HMAC secret (alg confusion).
//   - Tokens longer than MaxTokenBytes are refused before any parsing, only
//     the JWS compact form is accepted, each segment in canonical base64url
//     (no padding, no standard alphabet, no set unused bits: one token, one
//     spelling), and a "crit" header is refused.
//   - exp, nbf and iat are checked with a small leeway, iss and aud when
//     configured, and the tenant claim must be a non-empty string. A token
//     without exp is refused only with Options.RequireExpiry (the zero
//     value accepts it; mcpgate's config sets it by default).
//
// Claims map to the Principal as follows. The tenant claim is required (a
// string of at most MaxTenantBytes, no control characters, since it travels
// upstream in a header, and no U+FFFD, which the JSON decoder makes of a
// raw invalid byte and of a lone surrogate escape alike, merging claims
// other verifiers tell apart). The same rules hold for sub and tier. A missing sub is accepted as Subject "" unless
// Options.RequireSubject is set: every sub-less token of a tenant then shares
// one per-subject limit and breaker, which errs on the restrictive side, and
// identity providers that issue client-credential tokens without sub keep
// working. A missing tier claim means Options.DefaultTier. A missing scope
// claim grants no tool, resource or prompt (see Scopes).
//
// With a JWKS URL the key set is fetched once by New (which fails if it
// cannot be fetched: fail fast), refreshed in the background, and refreshed
// on demand when a token names an unknown kid, at most once per
// MissRefreshInterval so forged kids cannot hammer the identity provider.
//
// Every verification failure wraps ErrInvalidToken with the reason (expired,
// bad signature, unknown kid, missing tenant claim, ...); the reason is meant
// for logs, not for the caller.
package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jws"
	"github.com/lestrrat-go/jwx/v3/jws/jwsbb"
	"github.com/lestrrat-go/jwx/v3/jwt"
	"github.com/mcpgate/mcpgate/internal/ident"
)

// ErrNoToken means the request carries no bearer token: no Authorization
// header, or one with another scheme.
var ErrNoToken = errors.New("auth: no bearer token")

// ErrInvalidToken means a token was presented but not accepted. The wrapping
// error says why.
var ErrInvalidToken = errors.New("auth: invalid token")

const (
	// MaxTokenBytes is the longest token Verify accepts; longer ones are
	// refused before parsing, so a huge header cannot cost CPU or memory.
	MaxTokenBytes = 16 << 10
	// MaxTenantBytes bounds the tenant and tier claims.
	MaxTenantBytes = ident.MaxTenantBytes
	// MaxSubjectBytes bounds the sub claim (URN- or SPIFFE-style subjects run
	// longer than tenant IDs).
	MaxSubjectBytes = 1024
	// DefaultLeeway is the clock skew allowed on exp, nbf and iat when
	// Options.Leeway is zero.
	DefaultLeeway = 30 * time.Second
	// MaxLeeway is the largest Options.Leeway New accepts.
	MaxLeeway = 5 * time.Minute
)

// Principal is an authenticated caller.
type Principal struct {
	// Tenant is the tenant claim: never empty.
	Tenant string
	// Tier is the tier claim, or Options.DefaultTier when the token has none.
	Tier string
	// Subject is the sub claim; "" when the token has none (see Options.RequireSubject).
	Subject string
	// Scopes are the tools, resources and prompts the caller may use.
	Scopes Scopes
	// Expiry is the exp claim; zero when the token has none. Verifiers
	// downstream (the go-sdk's bearer middleware) take it from here rather
	// than reading the token again, so that they agree with Verify.
	Expiry time.Time
}

// Options configures an Authenticator. Exactly one key source (HS256Secret,
// PublicKeyFile, JWKSFile, JWKSURL) must be set.
type Options struct {
	// HS256Secret verifies HS256 tokens; not empty, and MinHS256SecretBytes
	// long or more (a shorter one is accepted with a warning).
	// HS384 and HS512 are not accepted.
	HS256Secret []byte
	// PublicKeyFile is a PEM file of one or more public keys or certificates:
	// RSA (RS256/384/512, PS256/384/512, at least 2048 bits), ECDSA (ES256 on
	// P-256, ES384 on P-384, ES512 on P-521) or Ed25519 (EdDSA, Ed25519).
	// The token's kid is ignored; each key that fits the token's alg is tried.
	PublicKeyFile string
	// JWKSFile is a JSON Web Key Set read once by New. A token with a kid is
	// verified by the key with that kid; a token without kid only when the set
	// holds a single usable key. Symmetric keys, keys with use "enc" and
	// keys whose key_ops lacks "verify" (or, with use "sig", names an
	// operation other than sign and verify) are ignored; a key's "alg", when
	// present, is the only algorithm it accepts.
	// A private key (a JWK with "d", or an RSA JWK with its primes) fails
	// New: a key set is public material, and the private half is a leak.
	JWKSFile string
	// JWKSURL is a JSON Web Key Set fetched by New (New fails if it cannot be
	// fetched) and refreshed in the background; key selection is as for
	// JWKSFile. Keys the library cannot parse are skipped, not fatal; so are
	// private keys, which are logged as an error since anyone who fetched
	// the set can sign tokens with them.
	JWKSURL string

	// Issuer, when not empty, must equal the iss claim.
	Issuer string
	// Audience, when not empty, must be one of the aud claim's values.
	Audience string
	// Resource, when not empty, is the OAuth resource identifier of this
	// gateway (RFC 8707, RFC 9728): it must be one of the aud claim's
	// values too, compared as exact strings. With both Audience and
	// Resource set a token must name both (an aud array holding the two, or
	// one value when they are equal). New refuses a Resource CheckResource
	// refuses.
	Resource string

	// TenantClaim names the tenant claim; "" means "tenant_id". A token
	// without it, or where it is not a non-empty string, is refused.
	TenantClaim string
	// TierClaim names the tier claim; "" means "tier". When present it must
	// be a string.
	TierClaim string
	// ScopeClaim names the scope claim; "" means "scope". It is a
	// space-separated string or a JSON array of strings (see ParseScopes);
	// missing means no tools, resources or prompts.
	ScopeClaim string
	// DefaultTier is the tier of a token without (or with an empty) tier claim.
	DefaultTier string

	// RequireSubject refuses tokens without a sub claim. By default such a
	// token is accepted with Subject "", so all of a tenant's tokens without
	// sub share one per-subject limit and breaker: restrictive, not a bypass.
	RequireSubject bool
	// RequireExpiry refuses tokens without an exp claim. The zero value
	// (false) accepts them for ever, which only suits service tokens that are
	// revoked by rotating the key; callers should set it. mcpgate's config
	// turns it on unless auth.jwt.require_expiry is false.
	RequireExpiry bool

	// Leeway is the clock skew allowed on exp, nbf and iat: 0 means
	// DefaultLeeway (30s), a negative value means none. At most MaxLeeway.
	Leeway time.Duration

	// HTTPClient fetches JWKSURL; nil means a client with a 10s timeout.
	// Unless the client has a CheckRedirect of its own, a redirect from
	// https to plain http is refused (the fetch fails, naming both URLs)
	// and one to another host is logged as a warning.
	HTTPClient *http.Client
	// JWKSRefresh is the minimum interval between background refreshes of
	// JWKSURL; 0 means DefaultJWKSRefresh (15m). A longer Cache-Control
	// max-age is honoured up to one hour (or JWKSRefresh if longer). A token
	// with an unknown kid triggers one immediate refresh, at most one per
	// MissRefreshInterval (10s) however many such tokens arrive.
	JWKSRefresh time.Duration

	// Now is the clock for exp/nbf/iat and for the refresh rate limit; nil
	// means time.Now.
	Now func() time.Time
	// Logger receives JWKS refresh failures and skipped keys; nil means
	// slog.Default().
	Logger *slog.Logger
}

// Authenticator verifies bearer tokens. It is safe for concurrent use; its
// configuration is fixed at New (build a new one to reload).
type Authenticator struct {
	cache       tokenCache
	keys        keySource
	now         func() time.Time
	validate    []jwt.ValidateOption
	tenantClaim string
	tierClaim   string
	scopeClaim  string
	defaultTier string
	requireSub  bool
	closeOnce   sync.Once
	closeErr    error
}

// New validates opts and loads the keys. With JWKSURL it fetches the key set
// once before returning and fails with the reason if that fetch fails (fail
// fast: a gateway that cannot verify any token should not start); ctx bounds
// that fetch. Close releases the background refresh.
func New(ctx context.Context, opts Options) (*Authenticator, error) {
	leeway, err := checkOptions(&opts)
	if err != nil {
		return nil, err
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	a := &Authenticator{
		now:         now,
		tenantClaim: orDefault(opts.TenantClaim, "tenant_id"),
		tierClaim:   orDefault(opts.TierClaim, "tier"),
		scopeClaim:  orDefault(opts.ScopeClaim, "scope"),
		defaultTier: opts.DefaultTier,
		requireSub:  opts.RequireSubject,
	}
	if a.validate, err = validateOptions(&opts, now, leeway); err != nil {
		return nil, err
	}
	if a.keys, err = loadKeys(ctx, &opts, log, now); err != nil {
		return nil, err
	}
	return a, nil
}

// checkOptions checks what opts says of the key sources, the leeway and the
// JWKS refresh interval, and returns the leeway to allow: 0 in opts means
// DefaultLeeway, a negative one means none.
func checkOptions(opts *Options) (time.Duration, error) {
	sources := 0
	for _, set := range []bool{len(opts.HS256Secret) > 0, opts.PublicKeyFile != "", opts.JWKSFile != "", opts.JWKSURL != ""} {
		if set {
			sources++
		}
	}
	if sources != 1 {
		return 0, fmt.Errorf("auth: exactly one of HS256Secret, PublicKeyFile, JWKSFile and JWKSURL must be set (%d are)", sources)
	}
	leeway := opts.Leeway
	switch {
	case leeway == 0:
		leeway = DefaultLeeway
	case leeway < 0:
		leeway = 0
	case leeway > MaxLeeway:
		return 0, fmt.Errorf("auth: leeway %s is more than %s", leeway, MaxLeeway)
	}
	if opts.JWKSRefresh < 0 {
		return 0, fmt.Errorf("auth: negative JWKS refresh interval %s", opts.JWKSRefresh)
	}
	return leeway, nil
}

// validateOptions returns the checks of a token's claims that opts asks
// for, on the clock now with leeway. A Resource is an audience too, unless
// it is the Audience already; an invalid Resource is an error.
func validateOptions(opts *Options, now func() time.Time, leeway time.Duration) ([]jwt.ValidateOption, error) {
	validate := []jwt.ValidateOption{
		jwt.WithClock(jwt.ClockFunc(now)),
		jwt.WithAcceptableSkew(leeway),
	}
	if opts.Issuer != "" {
		validate = append(validate, jwt.WithIssuer(opts.Issuer))
	}
	if opts.Audience != "" {
		validate = append(validate, jwt.WithAudience(opts.Audience))
	}
	if opts.Resource != "" {
		if err := CheckResource(opts.Resource); err != nil {
			return nil, err
		}
		if opts.Resource != opts.Audience {
			validate = append(validate, jwt.WithAudience(opts.Resource))
		}
	}
	if opts.RequireExpiry {
		validate = append(validate, jwt.WithRequiredClaim(jwt.ExpirationKey))
	}
	return validate, nil
}

// loadKeys loads the keys of the one source opts sets (checkOptions made
// sure there is exactly one), logging what is weak or skipped. A JWKS URL
// is fetched once before loadKeys returns, within ctx.
func loadKeys(ctx context.Context, opts *Options, log *slog.Logger, now func() time.Time) (keySource, error) {
	switch {
	case len(opts.HS256Secret) > 0:
		keys, err := hmacKeys(opts.HS256Secret)
		if n := len(opts.HS256Secret); err == nil && n < MinHS256SecretBytes {
			log.Warn("HS256 secret is shorter than RFC 7518 requires; rotate it to a random secret of at least 32 bytes", "bytes", n, "want", MinHS256SecretBytes)
		}
		return keys, err
	case opts.PublicKeyFile != "":
		return loadPEMKeys(opts.PublicKeyFile)
	case opts.JWKSFile != "":
		keys, skipped, err := loadJWKSFile(opts.JWKSFile)
		for _, s := range skipped {
			log.Warn("auth: JWKS key skipped", "file", opts.JWKSFile, "reason", s)
		}
		return keys, err
	default:
		return newRemoteKeys(ctx, opts, log, now)
	}
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// Close stops the background refresh of a JWKS URL. Verify keeps working with
// the keys already loaded but never refreshes them again. Close is idempotent.
func (a *Authenticator) Close() error {
	a.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.closeErr = a.keys.close(ctx)
	})
	return a.closeErr
}

// FromRequest verifies the bearer token of r's Authorization header. It
// returns ErrNoToken when there is no such header or its scheme is not Bearer
// (compared case-insensitively, RFC 7235), and an ErrInvalidToken error when
// there are several Authorization headers or the token fails Verify.
func (a *Authenticator) FromRequest(ctx context.Context, r *http.Request) (Principal, error) {
	vals := r.Header.Values("Authorization")
	if len(vals) == 0 {
		return Principal{}, ErrNoToken
	}
	if len(vals) > 1 {
		return Principal{}, invalid("%d Authorization headers", len(vals))
	}
	scheme, token, _ := strings.Cut(strings.TrimSpace(vals[0]), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return Principal{}, ErrNoToken
	}
	return a.Verify(ctx, strings.TrimSpace(token))
}

// Verify checks token (a JWS compact serialization) and returns its
// Principal. Every failure wraps ErrInvalidToken. ctx bounds the one JWKS
// refresh that an unknown kid may trigger.
//
// A verified token is remembered (up to TokenCacheSize of them) for at most
// TokenCacheTTL and never past its exp: agents send one token with every
// call, and verifying it again each time is the largest part of the
// gateway's own cost. A key removed from a JWKS therefore stops being
// honoured for tokens already seen up to TokenCacheTTL later.
func (a *Authenticator) Verify(ctx context.Context, token string) (Principal, error) {
	now := a.now()
	if p, ok := a.cache.get(token, now); ok {
		return p, nil
	}
	p, err := a.verifyToken(ctx, token)
	if err != nil {
		return p, err
	}
	until := now.Add(TokenCacheTTL)
	if !p.Expiry.IsZero() && p.Expiry.Before(until) {
		until = p.Expiry
	}
	a.cache.put(token, p, until)
	return p, nil
}

func (a *Authenticator) verifyToken(ctx context.Context, token string) (Principal, error) {
	fail := func(err error) (Principal, error) { return Principal{}, err }
	if token == "" {
		return fail(invalid("empty token"))
	}
	if len(token) > MaxTokenBytes {
		return fail(invalid("token is %d bytes, more than %d", len(token), MaxTokenBytes))
	}
	if err := checkCompact(token); err != nil {
		return fail(invalid("not a JWS compact token: %v", err))
	}
	raw := []byte(token)
	hdrB64, _, _, err := jwsbb.SplitCompact(raw)
	if err != nil {
		return fail(invalid("not a JWS compact token: %v", err))
	}
	hdr := jwsbb.HeaderParseCompact(hdrB64)
	alg, err := jwsbb.HeaderGetString(hdr, jws.AlgorithmKey)
	if err != nil {
		return fail(invalid("header has no usable alg: %v", err))
	}
	if alg == "" || strings.EqualFold(alg, jwa.NoSignature().String()) {
		return fail(invalid("alg %q is never accepted", alg))
	}
	// We understand no critical extension (RFC 7515 §4.1.11), and "b64"
	// (RFC 7797) changes what the signature covers.
	for _, h := range []string{jws.CriticalKey, "b64"} {
		if jwsbb.HeaderHas(hdr, h) {
			return fail(invalid("header %q is not supported", h))
		}
	}
	kid, err := jwsbb.HeaderGetString(hdr, jws.KeyIDKey)
	if err != nil && !errors.Is(err, jwsbb.ErrHeaderNotFound()) && !errors.Is(err, jwsbb.ErrFieldNotFound()) {
		return fail(invalid("bad kid header: %v", err))
	}

	keys, err := a.keys.candidates(ctx, kid)
	if err != nil {
		return fail(invalid("%v", err))
	}
	var payload []byte
	var tried []string
	var lastErr error
	for _, k := range keys {
		salg, ok := k.allows(alg)
		if !ok {
			for _, x := range k.algs {
				tried = append(tried, x.String())
			}
			continue
		}
		// VerifyCompactFast also refuses "crit" and "b64" headers and checks
		// that the header's alg equals the one we chose.
		payload, lastErr = jws.VerifyCompactFast(k.key, raw, salg)
		if lastErr == nil {
			break
		}
	}
	if payload == nil {
		if lastErr == nil {
			return fail(invalid("alg %q is not accepted by the configured key (accepted: %s)", alg, strings.Join(dedupe(tried), ", ")))
		}
		return fail(invalid("bad signature: %v", lastErr))
	}
	return a.claims(payload)
}

// b64urlValues maps a byte to its value in the base64url alphabet (RFC 4648
// §5), or to -1 when it is not in it.
var b64urlValues = func() (v [256]int8) {
	for i := range v {
		v[i] = -1
	}
	for i, c := range "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_" {
		v[c] = int8(i)
	}
	return v
}()

// segmentNames name the three segments of a JWS compact token, for errors.
var segmentNames = [3]string{"header", "payload", "signature"}

// checkCompact checks that token is three segments separated by dots, each
// the canonical base64url encoding of its bytes (RFC 7515 §2, §7.1): only
// the base64url alphabet, no padding, and the unused low bits of the last
// character zero. The JWS library's decoder is lenient (it takes padding,
// the standard alphabet, line breaks and non-zero trailing bits), which
// would give one token several accepted spellings: each a separate cache
// entry, none matched by a denylist of the string issued, and refused by
// stricter verifiers. A byte loop, without allocation for a valid token.
func checkCompact(token string) error {
	seg, start := 0, 0
	for i := 0; i < len(token); i++ {
		c := token[i]
		if c == '.' {
			if seg == 2 {
				return errors.New("more than three segments")
			}
			if !canonicalTail(token[start:i]) {
				return fmt.Errorf("%s segment is not canonical base64url", segmentNames[seg])
			}
			seg, start = seg+1, i+1
			continue
		}
		if b64urlValues[c] < 0 {
			return fmt.Errorf("byte %q in the %s segment is not base64url (no padding, no standard alphabet, no white space)", c, segmentNames[seg])
		}
	}
	if seg != 2 {
		return fmt.Errorf("%d segments, want 3", seg+1)
	}
	if !canonicalTail(token[start:]) {
		return fmt.Errorf("%s segment is not canonical base64url", segmentNames[seg])
	}
	return nil
}

// canonicalTail reports whether seg, made of base64url characters, has a
// length unpadded base64 can have and its last character's unused low bits
// (4 after two characters of a quantum, 2 after three) zero: whether seg is
// what encoding its decoded bytes would give back.
func canonicalTail(seg string) bool {
	switch len(seg) % 4 {
	case 1:
		return false
	case 2:
		return b64urlValues[seg[len(seg)-1]]&0x0f == 0
	case 3:
		return b64urlValues[seg[len(seg)-1]]&0x03 == 0
	}
	return true
}

// invalid is a verification failure: ErrInvalidToken with the reason.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidToken, fmt.Sprintf(format, args...))
}

func dedupe(s []string) []string {
	seen := make(map[string]bool, len(s))
	out := s[:0]
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// SignHS256 signs claims as an HS256 JWT in compact form, with header
// {"alg":"HS256","typ":"JWT"}. It is meant for tests and the demo command;
// the secret must not be empty (New wants MinHS256SecretBytes). Give exp, nbf
// and iat as Unix seconds: a time.Time would encode as a string and be refused.
func SignHS256(secret []byte, claims map[string]any) (string, error) {
	if len(secret) == 0 {
		return "", errors.New("auth: empty HS256 secret")
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("auth: encoding claims: %w", err)
	}
	hdr := jws.NewHeaders()
	if err := hdr.Set(jws.TypeKey, "JWT"); err != nil {
		return "", err
	}
	out, err := jws.Sign(payload, jws.WithKey(jwa.HS256(), secret, jws.WithProtectedHeaders(hdr)))
	if err != nil {
		return "", fmt.Errorf("auth: signing: %w", err)
	}
	return string(out), nil
}
