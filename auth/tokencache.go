package auth

import (
	"strings"
	"sync"
	"time"
)

// Bounds of the verified-token cache (see Verify).
const (
	TokenCacheSize = 10_000
	TokenCacheTTL  = time.Minute
)

// tokenCache remembers verified tokens until a deadline. The zero value is
// ready to use; it is safe for concurrent use.
type tokenCache struct {
	mu sync.Mutex
	m  map[string]cachedToken
}

type cachedToken struct {
	p     Principal
	until time.Time
}

func (c *tokenCache) get(token string, now time.Time) (Principal, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[token]
	if !ok {
		return Principal{}, false
	}
	if !now.Before(e.until) {
		delete(c.m, token)
		return Principal{}, false
	}
	return e.p, true
}

func (c *tokenCache) put(token string, p Principal, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]cachedToken)
	}
	if len(c.m) >= TokenCacheSize {
		// Drop about half, arbitrary entries (map order): a bound, not an
		// LRU; a dropped token is simply verified again.
		n := 0
		for k := range c.m {
			delete(c.m, k)
			if n++; n >= TokenCacheSize/2 {
				break
			}
		}
	}
	// A copy: token is often a substring of a larger string (FromRequest
	// cuts it from the Authorization header, which may be padded up to
	// net/http's 1 MB), and a key that shared its memory would keep all of
	// it alive, breaking the cache's bound of TokenCacheSize tokens of at
	// most MaxTokenBytes.
	c.m[strings.Clone(token)] = cachedToken{p: p, until: until}
}
