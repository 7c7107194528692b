package cache

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
	"github.com/mcpgate/mcpgate/keyspace"
)

// Scope says whose entries a Key belongs to: one tenant's (Tenant) or every
// tenant's (Shared). Tenants never see each other's entries, and no tenant
// name reaches the shared ones.
type Scope = keyspace.CacheScope

// Tenant returns the scope of tenant's own entries.
func Tenant(tenant string) Scope { return keyspace.TenantCache(tenant) }

// Shared returns the scope of the entries every tenant shares (tools
// configured with shared: true).
func Shared() Scope { return keyspace.SharedCache() }

// ErrInvalidArguments means the arguments of a call cannot be given a
// canonical form (invalid JSON, a duplicate member, ...), so the call has no
// cache key: call the tool without the cache.
var ErrInvalidArguments = errors.New("cache: invalid arguments")

// Key names one cache entry: a scope, a tool and the SHA-256 of the
// canonical JSON of the call's arguments, so arguments that differ only in
// member order, whitespace or number format (1, 1.0, 1e0) share an entry.
// Build it with NewKey or NewKeyCanonical; the zero Key is invalid. A Key is
// a small value, safe to copy and to use from many goroutines.
type Key struct {
	scope Scope
	tool  string
	hash  string
	entry string // keyspace.CacheEntry(scope, tool, hash)
}

// NewKey returns the key of tool called with args (a tools/call "arguments"
// value; absent, empty and null are all {}) in scope. It fails with
// ErrInvalidArguments when args has no canonical form (see
// jsonscan.Canonical).
func NewKey(scope Scope, tool string, args json.RawMessage) (Key, error) {
	canon, err := jsonscan.Canonical(args)
	if err != nil {
		return Key{}, fmt.Errorf("%w: %w", ErrInvalidArguments, err)
	}
	return NewKeyCanonical(scope, tool, canon), nil
}

// NewKeyCanonical is NewKey for arguments already in canonical form (the
// output of jsonscan.Canonical), for a caller that has computed it for
// another purpose. Passing anything else gives a valid but different key.
func NewKeyCanonical(scope Scope, tool string, canonical []byte) Key {
	sum := sha256.Sum256(canonical)
	h := hex.EncodeToString(sum[:])
	return Key{scope: scope, tool: tool, hash: h, entry: keyspace.CacheEntry(scope, tool, h)}
}

// Scope returns the key's scope.
func (k Key) Scope() Scope { return k.scope }

// Tool returns the key's tool name.
func (k Key) Tool() string { return k.tool }

// ArgsHash returns the hex SHA-256 of the canonical arguments.
func (k Key) ArgsHash() string { return k.hash }

// String returns the entry's Redis key (keyspace.CacheEntry), "" for the
// zero Key.
func (k Key) String() string { return k.entry }

// IsZero reports whether k is the zero (invalid) Key.
func (k Key) IsZero() bool { return k.entry == "" }
