package auth

import (
	"context"
	"errors"
	"testing"
)

// A JSON decoder reads a raw invalid byte and an escaped lone surrogate of a
// claim alike as U+FFFD: three claims that another verifier (Python's json
// keeps the surrogate, a byte-oriented one keeps 0xff) reads as three
// tenants would be one tenant here, with one set of counters, one quota
// and one usage record. Every identity claim holding U+FFFD is refused.
func TestIdentityClaimWithReplacementCharacterRefused(t *testing.T) {
	a := newAuth(t, Options{HS256Secret: testSecret, Now: newClock().Now})
	for _, payload := range []string{
		`{"tenant_id":"a\ufffd"}`,
		`{"tenant_id":"a\udc00"}`,
		"{\"tenant_id\":\"a\xff\"}",
		`{"tenant_id":"a","sub":"u\udc00"}`,
		`{"tenant_id":"a","tier":"\udc00"}`,
	} {
		p, err := a.Verify(context.Background(), hsToken([]byte(payload)))
		if !errors.Is(err, ErrInvalidToken) {
			t.Errorf("claims %q: authenticated as %+v (err %v), want ErrInvalidToken", payload, p, err)
		}
	}
}
