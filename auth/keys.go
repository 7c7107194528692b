package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"
)

// MinHS256SecretBytes is the shortest HS256 secret RFC 7518 §3.2 allows. New
// refuses an empty secret and logs a warning for a shorter one (refusing it
// would break deployments that already sign with one; the warning says to
// rotate it)
// requires an HMAC key at least as long as the hash output (256 bits).
const MinHS256SecretBytes = 32

// minRSABits is the smallest RSA modulus accepted (NIST SP 800-131A).
const minRSABits = 2048

// keyEntry is one verification key and the algorithms it may verify. The
// algorithms come from the key (its type, curve and, for a JWK, its "alg"),
// never from a token: this is what defeats alg confusion.
type keyEntry struct {
	kid  string
	algs []jwa.SignatureAlgorithm
	key  any // []byte (HMAC), *rsa.PublicKey, *ecdsa.PublicKey or ed25519.PublicKey
}

// allows returns the algorithm of the key named alg, if the key accepts it.
func (e keyEntry) allows(alg string) (jwa.SignatureAlgorithm, bool) {
	for _, a := range e.algs {
		if a.String() == alg {
			return a, true
		}
	}
	return jwa.EmptySignatureAlgorithm(), false
}

// keySource yields the keys that may verify a token whose header names kid
// ("" when the header has none).
type keySource interface {
	candidates(ctx context.Context, kid string) ([]keyEntry, error)
	close(ctx context.Context) error
}

// staticKeys is a fixed list of keys without key IDs (an HS256 secret or the
// keys of a PEM file): the token's kid is ignored and every key whose
// algorithms include the token's alg is tried.
type staticKeys []keyEntry

func (s staticKeys) candidates(context.Context, string) ([]keyEntry, error) { return s, nil }
func (staticKeys) close(context.Context) error                              { return nil }

func hmacKeys(secret []byte) (staticKeys, error) {
	if len(secret) == 0 {
		return nil, errors.New("auth: HS256 secret is empty")
	}
	// Copy so that a caller reusing its buffer cannot change the key.
	return staticKeys{{algs: []jwa.SignatureAlgorithm{jwa.HS256()}, key: append([]byte(nil), secret...)}}, nil
}

// algsForPublicKey returns the signature algorithms a public key may verify.
func algsForPublicKey(pub any) ([]jwa.SignatureAlgorithm, error) {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if k.N == nil || k.N.BitLen() < minRSABits {
			return nil, fmt.Errorf("RSA key has %d bits; at least %d are required", bitLen(k), minRSABits)
		}
		return []jwa.SignatureAlgorithm{jwa.RS256(), jwa.RS384(), jwa.RS512(), jwa.PS256(), jwa.PS384(), jwa.PS512()}, nil
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return []jwa.SignatureAlgorithm{jwa.ES256()}, nil
		case elliptic.P384():
			return []jwa.SignatureAlgorithm{jwa.ES384()}, nil
		case elliptic.P521():
			return []jwa.SignatureAlgorithm{jwa.ES512()}, nil
		}
		return nil, fmt.Errorf("unsupported ECDSA curve %s", curveName(k))
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("Ed25519 key has %d bytes", len(k))
		}
		// "EdDSA" (RFC 8037) and its fully specified successor "Ed25519" (RFC 9864).
		return []jwa.SignatureAlgorithm{jwa.EdDSA(), jwa.EdDSAEd25519()}, nil
	}
	return nil, fmt.Errorf("unsupported key type %T (want RSA, ECDSA P-256/384/521 or Ed25519)", pub)
}

func bitLen(k *rsa.PublicKey) int {
	if k.N == nil {
		return 0
	}
	return k.N.BitLen()
}

func curveName(k *ecdsa.PublicKey) string {
	if k.Curve == nil || k.Curve.Params() == nil {
		return "<nil>"
	}
	return k.Curve.Params().Name
}

// loadPEMKeys reads every public key (or certificate) of a PEM file. Private
// keys are refused: the gateway only verifies, and a private key on its disk
// is one more place to leak it from.
func loadPEMKeys(path string) (staticKeys, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: reading public key file: %w", err)
	}
	var keys staticKeys
	for n := 1; ; n++ {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		pub, err := parsePEMBlock(block)
		if err != nil {
			return nil, fmt.Errorf("auth: public key file %s, PEM block %d: %w", path, n, err)
		}
		algs, err := algsForPublicKey(pub)
		if err != nil {
			return nil, fmt.Errorf("auth: public key file %s, PEM block %d: %w", path, n, err)
		}
		keys = append(keys, keyEntry{algs: algs, key: pub})
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("auth: public key file %s holds no PEM block", path)
	}
	return keys, nil
}

func parsePEMBlock(b *pem.Block) (any, error) {
	switch b.Type {
	case "PUBLIC KEY":
		return x509.ParsePKIXPublicKey(b.Bytes)
	case "RSA PUBLIC KEY":
		return x509.ParsePKCS1PublicKey(b.Bytes)
	case "CERTIFICATE":
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		return c.PublicKey, nil
	}
	if strings.Contains(b.Type, "PRIVATE KEY") {
		return nil, fmt.Errorf("%q: a private key; give the public key (openssl pkey -pubout)", b.Type)
	}
	return nil, fmt.Errorf("unsupported PEM type %q (want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE)", b.Type)
}

// errPrivateJWK means a JWK carries private key material. A JWKS publishes
// public keys: a private key in one is a key anybody who reads the set can
// sign tokens with, for any tenant.
var errPrivateJWK = errors.New("private key: a JWKS may only hold public keys, and whoever reads this one can sign tokens with it")

// privateJWKParams are the JWK members that carry private key material
// (RFC 7518 §6.2.2 and §6.3.2, RFC 8037 §2): "d", and an RSA key's primes
// and CRT values, any of which gives d.
var privateJWKParams = map[string]bool{"d": true, "p": true, "q": true, "dp": true, "dq": true, "qi": true, "oth": true}

// keyIndex is a JWKS turned into verification keys, looked up by kid.
type keyIndex struct {
	set     jwk.Set // the set it was built from (identity, for the URL cache)
	all     []keyEntry
	byKID   map[string][]keyEntry
	skipped []string // why keys were left out, for the log (private keys aside)
	// private are the keys left out because they carry private key
	// material, each error wrapping errPrivateJWK: a leak, which a JWKS
	// file refuses and a JWKS URL logs as an error, not a warning.
	private []error
}

// reasons returns why keys were left out, private keys included.
func (ix *keyIndex) reasons() string {
	rs := append([]string(nil), ix.skipped...)
	for _, err := range ix.private {
		rs = append(rs, err.Error())
	}
	return strings.Join(rs, "; ")
}

// newKeyIndex converts the usable signing keys of set. A key is left out (and
// the reason kept in skipped, or private) when it carries private key
// material, is marked for encryption or for operations other than
// verification (use, key_ops), is symmetric (a JWKS publishes public
// keys; a shared secret there is a leak or a mistake), is weak, or names an
// "alg" its type cannot verify.
func newKeyIndex(set jwk.Set) *keyIndex {
	ix := &keyIndex{set: set, byKID: make(map[string][]keyEntry)}
	for i := range set.Len() {
		k, ok := set.Key(i)
		if !ok {
			continue
		}
		e, err := jwkEntry(k)
		if err != nil {
			kid, _ := k.KeyID()
			err = fmt.Errorf("key #%d (kid %q): %w", i, kid, err)
			if errors.Is(err, errPrivateJWK) {
				ix.private = append(ix.private, err)
			} else {
				ix.skipped = append(ix.skipped, err.Error())
			}
			continue
		}
		ix.all = append(ix.all, e)
		ix.byKID[e.kid] = append(ix.byKID[e.kid], e)
	}
	return ix
}

func jwkEntry(k jwk.Key) (keyEntry, error) {
	if jwk.IsUnsupportedKey(k) {
		return keyEntry{}, fmt.Errorf("unsupported key type %q", k.KeyType())
	}
	if hasPrivateParams(k) {
		// Not downgraded to its public half: the key is compromised.
		return keyEntry{}, errPrivateJWK
	}
	use, _ := k.KeyUsage()
	if use != "" && use != jwk.ForSignature.String() {
		return keyEntry{}, fmt.Errorf("use is %q, not %q", use, jwk.ForSignature)
	}
	if err := checkKeyOps(k, use); err != nil {
		return keyEntry{}, err
	}
	if k.KeyType() == jwa.OctetSeq() {
		return keyEntry{}, errors.New("symmetric key; a JWKS may only hold public keys")
	}
	var raw any
	if err := jwk.Export(k, &raw); err != nil {
		return keyEntry{}, err
	}
	algs, err := algsForPublicKey(raw)
	if err != nil {
		return keyEntry{}, err
	}
	if a, ok := k.Algorithm(); ok && a.String() != "" {
		var pinned []jwa.SignatureAlgorithm
		for _, cand := range algs {
			if cand.String() == a.String() {
				pinned = append(pinned, cand)
			}
		}
		if len(pinned) == 0 {
			return keyEntry{}, fmt.Errorf("alg %q does not fit a %s key", a, k.KeyType())
		}
		algs = pinned
	}
	kid, _ := k.KeyID()
	return keyEntry{kid: kid, algs: algs, key: raw}, nil
}

// checkKeyOps checks a JWK's key_ops (RFC 7517 §4.3), when it has one:
// it must include "verify", or the key is not meant to verify anything,
// whatever else it may be for (a key with key_ops ["encrypt","wrapKey"]
// is an encryption key, like one with use "enc"). With use "sig" it may
// hold nothing but "sign" and "verify": use and key_ops MUST agree (§4.3),
// and a key that says both is one whose purpose nobody can tell.
func checkKeyOps(k jwk.Key, use string) error {
	ops, ok := k.KeyOps()
	if !ok || len(ops) == 0 {
		// "key_ops": null (serializers that write every member) reads
		// as an empty list: nothing said, as when it is absent.
		return nil
	}
	verify := false
	for _, op := range ops {
		switch op {
		case jwk.KeyOpVerify:
			verify = true
		case jwk.KeyOpSign:
		default:
			if use == jwk.ForSignature.String() {
				return fmt.Errorf("key_ops %q does not agree with use %q", ops, use)
			}
		}
	}
	if !verify {
		return fmt.Errorf("key_ops %q does not include %q", ops, jwk.KeyOpVerify)
	}
	return nil
}

// hasPrivateParams reports whether k carries private key material: a
// private key type (the JWK has "d"), or an RSA prime or CRT member
// without "d", which the parser keeps on a public key.
func hasPrivateParams(k jwk.Key) bool {
	if a, ok := k.(jwk.AsymmetricKey); ok && a.IsPrivate() {
		return true
	}
	for _, name := range k.Keys() {
		if privateJWKParams[name] && !emptyMember(k, name) {
			return true
		}
	}
	return false
}

// emptyMember reports whether k's member name holds nothing: "" or [] (a
// public key serialized with every member, such as older .NET JsonWebKey
// output's "oth": []), which carries no key material.
func emptyMember(k jwk.Key, name string) bool {
	var v any
	if err := k.Get(name, &v); err != nil || v == nil {
		return err == nil
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.String, reflect.Slice, reflect.Array, reflect.Map:
		return rv.Len() == 0
	}
	return false
}

// find returns the keys for a token's kid. A token without kid is accepted
// only when the set holds exactly one usable key: guessing among several would
// let the token pick.
func (ix *keyIndex) find(kid string) ([]keyEntry, bool) {
	if kid == "" {
		if len(ix.all) == 1 {
			return ix.all, true
		}
		return nil, false
	}
	es, ok := ix.byKID[kid]
	return es, ok
}

func (ix *keyIndex) missError(kid string) error {
	if kid == "" {
		return fmt.Errorf("token has no kid and the key set holds %d usable keys", len(ix.all))
	}
	return fmt.Errorf("unknown kid %q", kid)
}

// fileKeys is a JWKS read once from a file.
type fileKeys struct{ ix *keyIndex }

func loadJWKSFile(path string) (*fileKeys, []string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("auth: reading JWKS file: %w", err)
	}
	// Strict parsing: the operator owns this file, so a broken key is an error
	// to fix, not one to skip silently.
	set, err := jwk.Parse(data)
	if err != nil {
		return nil, nil, fmt.Errorf("auth: JWKS file %s: %w", path, err)
	}
	ix := newKeyIndex(set)
	if len(ix.private) > 0 {
		// The operator owns this file: fail rather than skip, so the leak
		// is seen, and the key rotated, before anything runs with it.
		more := ""
		if n := len(ix.private); n > 1 {
			more = fmt.Sprintf(" (and %d more private keys)", n-1)
		}
		return nil, nil, fmt.Errorf("auth: JWKS file %s: %w%s; keep only the public keys there, and rotate the key: whoever read the file can sign tokens", path, ix.private[0], more)
	}
	if len(ix.all) == 0 {
		return nil, nil, fmt.Errorf("auth: JWKS file %s holds no usable signing key (%s)", path, ix.reasons())
	}
	return &fileKeys{ix: ix}, ix.skipped, nil
}

func (f *fileKeys) candidates(_ context.Context, kid string) ([]keyEntry, error) {
	es, ok := f.ix.find(kid)
	if !ok {
		return nil, f.ix.missError(kid)
	}
	return es, nil
}

func (*fileKeys) close(context.Context) error { return nil }
