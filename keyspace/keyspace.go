// Package keyspace is the one place that builds mcpgate's Redis keys.
//
// Every component that comes from outside (tenant, subject, tool, rule name)
// is escaped so that no input can forge a separator (':') or a Cluster hash tag
// ('{', '}'): two different inputs never produce the same key, and the hash tag
// of a tenant-scoped key is always exactly the escaped tenant, so all of a
// tenant's counters live in one Cluster slot and one Lua script can update
// them atomically.
//
// Layout (components escaped by Escape):
//
//	mcpgate:rl:{~g}:global:<rule>                          global rules (one shared slot)
//	mcpgate:rl:{<tenant>}:tenant:<rule>
//	mcpgate:rl:{<tenant>}:tenant_tool:<rule>:<tool>
//	mcpgate:rl:{<tenant>}:subject:<rule>:<subject>
//	mcpgate:rl:{<tenant>}:subject_tool:<rule>:<subject>:<tool>
//	mcpgate:usage:{<tenant>}:<period>                      usage meter of a billing period
//	mcpgate:op:{<tenant>}:<op>                             marker of an applied meter op (TTL limit.OpTTL)
//	mcpgate:sess:{<tenant>}:tenant                         live MCP sessions of a tenant
//	mcpgate:sess:{<tenant>}:subject:<subject>              live MCP sessions of one subject
//
// Counter builds rate-limit keys with "<algorithm>.<rule>" as the rule part.
package keyspace

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Prefix starts every key mcpgate writes.
const Prefix = "mcpgate:"

// MaxComponent is the longest escaped component kept verbatim; longer ones are
// replaced by a digest so that keys stay short whatever the input.
const MaxComponent = 96

// globalTag is the hash tag of global keys. Escape never yields it: it only
// emits '~' as the first byte of the empty and the digest forms.
const globalTag = "~g"

// Escape encodes s so that the result contains only [A-Za-z0-9._@-] and '%'
// escapes (plus a leading '~' for the two special forms below), and is
// injective: different inputs give different outputs.
//
//   - "" becomes "~" (an empty hash tag would make Redis hash the whole key).
//   - A result longer than MaxComponent becomes "~h" + 32 hex digits of its
//     SHA-256 (a collision needs a SHA-256 collision on 128 bits).
//
// Bytes outside the safe set, including '%', ':', '{', '}', '~' and any
// non-UTF-8 byte, become %XX.
func Escape(s string) string {
	if s == "" {
		return "~"
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if safe(s[i]) {
			n++
		} else {
			n += 3
		}
	}
	if n > MaxComponent {
		sum := sha256.Sum256([]byte(s))
		return "~h" + hex.EncodeToString(sum[:16])
	}
	if n == len(s) {
		return s
	}
	const hexdig = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if safe(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexdig[c>>4])
		b.WriteByte(hexdig[c&15])
	}
	return b.String()
}

func safe(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == '_' || c == '-' || c == '@'
}

// Per names the owner of a rate-limit counter.
type Per string

// The scopes a rule can be counted per.
const (
	PerGlobal      Per = "global"
	PerTenant      Per = "tenant"
	PerTenantTool  Per = "tenant_tool"
	PerSubject     Per = "subject"
	PerSubjectTool Per = "subject_tool"
)

// Valid reports whether p is a known scope.
func (p Per) Valid() bool {
	switch p {
	case PerGlobal, PerTenant, PerTenantTool, PerSubject, PerSubjectTool:
		return true
	}
	return false
}

// TenantScoped reports whether counters of this scope live in the tenant's
// slot (every scope but global).
func (p Per) TenantScoped() bool { return p != PerGlobal && p.Valid() }

// Owner identifies who a counter belongs to. Fields a scope does not use are
// ignored (Tool for PerTenant, everything for PerGlobal, ...).
type Owner struct {
	Tenant  string
	Subject string
	Tool    string
}

// RateLimit returns the key of rule's counter for owner under scope per.
// It panics on an unknown scope: scopes come from validated configuration,
// so an unknown one is a programming error.
func RateLimit(per Per, rule string, o Owner) string {
	var b strings.Builder
	b.WriteString(Prefix)
	b.WriteString("rl:{")
	if per == PerGlobal {
		b.WriteString(globalTag)
	} else {
		b.WriteString(Escape(o.Tenant))
	}
	b.WriteString("}:")
	b.WriteString(string(per))
	b.WriteByte(':')
	b.WriteString(Escape(rule))
	switch per {
	case PerGlobal, PerTenant:
	case PerTenantTool:
		b.WriteByte(':')
		b.WriteString(Escape(o.Tool))
	case PerSubject:
		b.WriteByte(':')
		b.WriteString(Escape(o.Subject))
	case PerSubjectTool:
		b.WriteByte(':')
		b.WriteString(Escape(o.Subject))
		b.WriteByte(':')
		b.WriteString(Escape(o.Tool))
	default:
		panic(fmt.Sprintf("keyspace: unknown scope %q", per))
	}
	return b.String()
}

// Counter returns the key of a rule's counter with the rule's algorithm in it:
// RateLimit with rule component "<algorithm>.<rule>". Two rules of one name
// but different algorithms (the same rule name in two tiers, a tenant moving
// between tiers, an algorithm changed by a reload) then never share a counter,
// whose state the other algorithm would misread. The algorithm name contains
// no '.', so the pair is recovered unambiguously.
func Counter(per Per, algorithm, rule string, o Owner) string {
	return RateLimit(per, algorithm+"."+rule, o)
}

// TenantCounters returns the prefix shared by the keys of every
// tenant-scoped counter of tenant (Counter and RateLimit with any scope
// but PerGlobal), and by no other key: the tenant's hash tag, closed.
func TenantCounters(tenant string) string {
	return counterPrefix + Escape(tenant) + "}:"
}

// ToolCounters returns the prefix shared by the keys of one rule's per-tool
// counters (per PerTenantTool or PerSubjectTool) for o, whatever the tool:
// Counter(per, algorithm, rule, o') starts with it for every o' that
// differs from o in Tool alone, and no other counter key does (the tool is
// the last component, and escaped components hold no ':'). It is how a
// tenant's counters for tools no configuration lists are found. It panics
// on another scope, a programming error.
func ToolCounters(per Per, algorithm, rule string, o Owner) string {
	if per != PerTenantTool && per != PerSubjectTool {
		panic(fmt.Sprintf("keyspace: scope %q has no per-tool counters", per))
	}
	o.Tool = ""
	k := Counter(per, algorithm, rule, o)
	return k[:len(k)-len(Escape(""))]
}

// ToolOf returns the tool a per-tool counter key (one under a
// ToolCounters prefix) counts, as Unescape reads its last component.
func ToolOf(key string) (tool string, ok bool) {
	i := strings.LastIndexByte(key, ':')
	if i < 0 || !IsCounter(key) {
		return "", false
	}
	return Unescape(key[i+1:])
}

// Unescape reverses Escape. ok is false when s is not an output of Escape,
// or is the digest form of a long component, which cannot be reversed.
func Unescape(s string) (string, bool) {
	switch {
	case s == "~":
		return "", true
	case s == "" || s[0] == '~' || len(s) > MaxComponent:
		return "", false
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case safe(c):
			b.WriteByte(c)
		case c == '%' && i+2 < len(s) && upperHex(s[i+1]) && upperHex(s[i+2]):
			v, _ := hex.DecodeString(s[i+1 : i+3])
			if safe(v[0]) { // Escape keeps safe bytes as they are
				return "", false
			}
			b.WriteByte(v[0])
			i += 2
		default:
			return "", false
		}
	}
	return b.String(), true
}

func upperHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'A' && c <= 'F' }

// counterPrefix starts every rate-limit counter key (RateLimit, Counter).
const counterPrefix = Prefix + "rl:{"

// IsCounter reports whether key has the form of a rate-limit counter key
// (RateLimit, Counter), as opposed to a usage meter, breaker, session or
// cache key: stores check it before dropping counters on an operator's
// request, so that no such call can reach usage data.
func IsCounter(key string) bool { return strings.HasPrefix(key, counterPrefix) }

// IsCounterPrefix reports whether prefix starts counter keys of one hash
// tag: IsCounter, with the tag closed. Stores check it before listing the
// counters under a prefix (limit.CounterLister), so that a listing stays
// within one Cluster slot's counters.
func IsCounterPrefix(prefix string) bool {
	return IsCounter(prefix) && strings.Contains(prefix[len(counterPrefix):], "}:")
}

// Usage returns the key of a tenant's usage meter for one billing period
// (e.g. "2026-11"): mcpgate:usage:{<tenant>}:<period>. It shares the tenant's
// hash tag, so the meter is charged in the same script as the tenant's limits.
func Usage(tenant, period string) string {
	return Prefix + "usage:{" + Escape(tenant) + "}:" + Escape(period)
}

// Breaker returns the key of a loop breaker's state: the breaker of identity
// id (for example "subject:" + sub) of tenant, in the tenant's slot so that
// it is evaluated in the tenant's decision script.
func Breaker(tenant, id string) string {
	return breakerPrefix + "{" + Escape(tenant) + "}:" + Escape(id)
}

// breakerPrefix starts every breaker key (Breaker, BreakerCall).
const breakerPrefix = Prefix + "br:"

// IsBreaker reports whether key has the form Breaker gives a breaker's
// state: breakerPrefix, the hash tag (the escaped tenant), then one escaped
// component (the id). Escaped components hold no ':' and no braces, so an
// identical-calls counter (BreakerCall), which adds ":call:<fingerprint>",
// fails it, as does every key of another kind. Stores are handed only such
// keys on an operator's reset, so that none reaches another kind's data.
func IsBreaker(key string) bool {
	tag := HashTag(key)
	id, ok := strings.CutPrefix(key, breakerPrefix+"{"+tag+"}:")
	return ok && escapedComponent(tag) && escapedComponent(id)
}

// escapedComponent reports whether s could be one output of Escape: not
// empty, without the separator or braces.
func escapedComponent(s string) bool {
	return s != "" && !strings.ContainsAny(s, ":{}")
}

// BreakerCall returns the key counting one call fingerprint (a hash of the
// tool and its canonical arguments) of a breaker.
func BreakerCall(tenant, id, fingerprint string) string {
	return Breaker(tenant, id) + ":call:" + Escape(fingerprint)
}

// TenantSessions returns the key of the concurrency counter of tenant's live
// MCP sessions: mcpgate:sess:{<tenant>}:tenant. It is apart from every rule's
// counter (a rule of any name cannot reach it) and in the tenant's slot, so
// it is taken in one batch with SubjectSessions.
func TenantSessions(tenant string) string {
	return Prefix + "sess:{" + Escape(tenant) + "}:tenant"
}

// SubjectSessions returns the key of the concurrency counter of the live MCP
// sessions of one subject of tenant: mcpgate:sess:{<tenant>}:subject:<subject>.
func SubjectSessions(tenant, subject string) string {
	return Prefix + "sess:{" + Escape(tenant) + "}:subject:" + Escape(subject)
}

// BreakerPattern matches breaker keys (and their call counters, which carry
// ":call:") for SCAN.
const BreakerPattern = breakerPrefix + "*"

// UsagePattern matches every usage meter key (for SCAN).
const UsagePattern = Prefix + "usage:*"

// HashTag returns the part of key that Redis Cluster hashes: the bytes between
// the first '{' and the next '}' when that is not empty, else the whole key.
func HashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// Slot returns the Redis Cluster slot of key (CRC16 of its hash tag mod 16384).
func Slot(key string) uint16 {
	return crc16(HashTag(key)) & 16383
}

// crc16 is CRC-16/XMODEM, the checksum Redis Cluster uses for slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// Cache keys.
//
// Every cache entry has its own hash tag, made of its scope, tool and
// arguments hash, so an entry, its loader lock, its fence and its wake-up
// channel share one Cluster slot (one script can update them atomically)
// while a tenant's entries spread over every slot (one hot tenant does not
// make one hot slot). A tag index has its own hash tag, made of its scope and
// tag:
//
//	mcpgate:cache:{<scope>:<tool>:<args hash>}          entry (value)
//	mcpgate:cache:{<scope>:<tool>:<args hash>}:lock     loader lock (owner token)
//	mcpgate:cache:{<scope>:<tool>:<args hash>}:fence    fence counter
//	mcpgate:cache:{<scope>:<tool>:<args hash>}:ch       shard channel waking waiters
//	mcpgate:ctag:{<scope>:<tag>}                        tag index (sorted set of entry keys)
//	mcpgate:ctag:{<scope>:<tag>}:drain                  an invalidated index, being emptied
//
// <scope> is the escaped tenant, or "~shared" for entries every tenant sees:
// Escape never yields "~shared", so no tenant name reaches shared entries.
// The components are escaped, so they contain no ':' and the hash tag splits
// back into them unambiguously.

// sharedScope is the scope component of shared cache entries. Escape only
// emits '~' first in "~" and "~h"+32 hex digits, never this.
const sharedScope = "~shared"

// CacheScope says whose cache entries a key belongs to: one tenant's, or the
// entries shared by every tenant. It is a distinct type, not a string, so a
// tenant name can never be mistaken for the shared scope. The zero CacheScope
// is the scope of the tenant "".
type CacheScope struct {
	tenant string
	shared bool
}

// TenantCache returns the scope of tenant's own cache entries.
func TenantCache(tenant string) CacheScope { return CacheScope{tenant: tenant} }

// SharedCache returns the scope of the cache entries every tenant shares.
func SharedCache() CacheScope { return CacheScope{shared: true} }

// Shared reports whether s is the shared scope.
func (s CacheScope) Shared() bool { return s.shared }

// Tenant returns the tenant of a tenant scope, "" for the shared scope.
func (s CacheScope) Tenant() string { return s.tenant }

// String returns the scope's key component: the escaped tenant, or "~shared".
func (s CacheScope) String() string {
	if s.shared {
		return sharedScope
	}
	return Escape(s.tenant)
}

// CacheEntry returns the key of the cache entry of tool called with arguments
// whose canonical form hashes to argsHash (hex SHA-256), in scope. The key is
// its own hash tag: mcpgate:cache:{<scope>:<tool>:<args hash>}.
func CacheEntry(scope CacheScope, tool, argsHash string) string {
	sc, tl, h := scope.String(), Escape(tool), Escape(argsHash)
	var b strings.Builder
	b.Grow(len(Prefix) + len("cache:{::}") + len(sc) + len(tl) + len(h))
	b.WriteString(Prefix)
	b.WriteString("cache:{")
	b.WriteString(sc)
	b.WriteByte(':')
	b.WriteString(tl)
	b.WriteByte(':')
	b.WriteString(h)
	b.WriteByte('}')
	return b.String()
}

// CacheLock returns the key of the loader lock of the entry whose key is
// entry (from CacheEntry); it is in the entry's slot.
func CacheLock(entry string) string { return entry + ":lock" }

// CacheFence returns the key of the fence counter of the entry whose key is
// entry (from CacheEntry); it is in the entry's slot.
func CacheFence(entry string) string { return entry + ":fence" }

// CacheChannel returns the (shard) pub/sub channel that announces a value
// landing in, or a lock leaving, the entry whose key is entry (from
// CacheEntry). It hashes to the entry's slot, so SPUBLISH from the entry's
// scripts and SSUBSCRIBE reach the same node.
func CacheChannel(entry string) string { return entry + ":ch" }

// CacheTag returns the key of the index of scope's cache entries tagged tag:
// mcpgate:ctag:{<scope>:<tag>}, its own hash tag.
func CacheTag(scope CacheScope, tag string) string {
	return Prefix + "ctag:{" + scope.String() + ":" + Escape(tag) + "}"
}

// CacheTagDrain returns the key an invalidation moves the tag index whose
// key is index (from CacheTag) to while it drops the index's entries; it is
// in the index's slot.
func CacheTagDrain(index string) string { return index + ":drain" }

// CachePattern matches every cache entry, lock, fence and channel (for SCAN).
const CachePattern = Prefix + "cache:*"

// MeterOp is the key of the marker of op applied to the meter key (see
// limit.Meter.Op): in the meter's slot (its hash tag), so that one script
// charges the meter and records the op. op is an id of [0-9A-Za-z_-]
// (limit.ValidateOp), written as is.
func MeterOp(meterKey, op string) string {
	return Prefix + "op:{" + HashTag(meterKey) + "}:" + op
}
