package mcp

import "strings"

// Caching hints of MCP 2026-07-28 (SEP-2549). The results of tools/list,
// resources/list, resources/templates/list, prompts/list and resources/read
// carry two top-level members: ttlMs (how long a client may consider the
// result fresh, in milliseconds) and cacheScope ("public": any client or
// intermediary may cache and serve it; "private": only the requesting
// user's client may; absent means "public"). tools/call results carry
// neither.
const (
	// CachingHintsVersion is the first protocol version whose results carry
	// ttlMs and cacheScope.
	CachingHintsVersion = "2026-07-28"
	// CacheScopeMember and TTLMember name the two members.
	CacheScopeMember = "cacheScope"
	TTLMember        = "ttlMs"
	// CacheScopePrivate is the cacheScope of a result shaped for one caller.
	CacheScopePrivate = "private"
)

// HasCachingHints reports whether protocol (an MCP-Protocol-Version header
// value, "YYYY-MM-DD") is CachingHintsVersion or later. Versions are dates,
// so they order as strings; a value that is not a date is not.
func HasCachingHints(protocol string) bool {
	if len(protocol) != len(CachingHintsVersion) || strings.Count(protocol, "-") != 2 {
		return false
	}
	for i := 0; i < len(protocol); i++ {
		c := protocol[i]
		if (i == 4 || i == 7) != (c == '-') || c != '-' && (c < '0' || c > '9') {
			return false
		}
	}
	return protocol >= CachingHintsVersion
}
