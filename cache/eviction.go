package cache

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
)

// Role is what a Redis server is used for, as CheckEviction judges it.
type Role string

// Roles of a Redis server.
const (
	// RoleStore holds rate-limit counters, breakers and usage meters:
	// nothing may be evicted (maxmemory-policy noeviction).
	RoleStore Role = "store"
	// RoleCache holds cache entries: when memory is full, entries should
	// be evicted rather than writes refused.
	RoleCache Role = "cache"
)

// ErrInvalidRole means CheckEviction was given an unknown Role.
var ErrInvalidRole = errors.New("cache: invalid role")

// CheckEviction reads maxmemory and maxmemory-policy (CONFIG GET) from every
// node client knows (all nodes of a cluster) and returns the policy and a
// warning when the setting does not suit role ("" when it does):
//
//   - RoleStore: with a memory limit, any policy but noeviction can evict
//     counters (every mcpgate key has a TTL, so volatile-* policies evict
//     them too), and an evicted counter admits calls it should deny.
//   - RoleCache: noeviction with a memory limit makes cache writes fail once
//     memory is full (the cache keeps working, without storing).
//
// A server may refuse CONFIG (ElastiCache renames it, an ACL may deny it):
// then policy is "", warning says the check could not run, and err is nil;
// log it once at startup. err is for failures to reach the server.
// When one instance serves both roles, check both: no policy suits both.
func CheckEviction(ctx context.Context, client rueidis.Client, role Role) (policy, warning string, err error) {
	if role != RoleStore && role != RoleCache {
		return "", "", fmt.Errorf("%w %q", ErrInvalidRole, role)
	}
	if client == nil {
		return "", "", errors.New("cache: nil Redis client")
	}
	nodes := client.Nodes()
	addrs := make([]string, 0, len(nodes))
	for a := range nodes {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	var policies []string
	var warnings []string
	for _, addr := range addrs {
		n := nodes[addr]
		kv, err := n.Do(ctx, n.B().ConfigGet().Parameter("maxmemory*").Build()).AsStrMap()
		if err != nil {
			if _, refused := rueidis.IsRedisErr(err); refused {
				return "", fmt.Sprintf("cannot read maxmemory-policy on %s (CONFIG GET refused: %v); "+
					"make sure the %s server's eviction policy suits it (see docs/deploy.md, \"Redis: two roles, two eviction policies\")", addr, err, role), nil
			}
			return "", "", fmt.Errorf("cache: CONFIG GET maxmemory on %s: %w", addr, err)
		}
		p := kv["maxmemory-policy"]
		limit, _ := strconv.ParseInt(kv["maxmemory"], 10, 64)
		if !slices.Contains(policies, p) {
			policies = append(policies, p)
		}
		if w := evictionWarning(role, p, limit); w != "" {
			warnings = append(warnings, addr+": "+w)
		}
	}
	return strings.Join(policies, ","), strings.Join(warnings, "; "), nil
}

func evictionWarning(role Role, policy string, maxmemory int64) string {
	if maxmemory <= 0 {
		return "" // no memory limit: nothing is evicted, no write refused
	}
	switch {
	case role == RoleStore && policy != "noeviction":
		return fmt.Sprintf("maxmemory-policy %s with maxmemory %d can evict rate-limit, breaker and usage keys "+
			"(an evicted counter admits calls it should deny); use noeviction for store.redis and a separate "+
			"cache.redis with allkeys-lfu", policy, maxmemory)
	case role == RoleCache && policy == "noeviction":
		return fmt.Sprintf("maxmemory-policy noeviction with maxmemory %d makes cache writes fail once memory "+
			"is full; use allkeys-lfu or volatile-lru for cache.redis", maxmemory)
	}
	return ""
}
