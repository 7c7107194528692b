package federate

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// A Retry-After, in seconds or as an HTTP date, never takes an upstream out
// of service for more than maxRetryAfter; a bad or past one means a second.
func TestRetryAfterParse(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	for _, tc := range []struct {
		name, value string
		want        time.Duration
	}{
		{"seconds", "30", 30 * time.Second},
		{"zero seconds", "0", 0},
		{"seconds at the cap", "3600", time.Hour},
		{"seconds past the cap", "86400", time.Hour},
		{"huge seconds", "999999999", time.Hour},
		{"negative seconds", "-5", time.Second},
		{"date", date(90 * time.Second), 90 * time.Second},
		{"date at the cap", date(time.Hour), time.Hour},
		{"date a day ahead", date(24 * time.Hour), time.Hour},
		{"date years ahead", "Fri, 31 Dec 9999 23:59:59 GMT", time.Hour},
		{"date past", date(-time.Minute), time.Second},
		{"empty", "", time.Second},
		{"garbage", "soon", time.Second},
	} {
		if got := retryAfter(tc.value, now).Sub(now); got != tc.want {
			t.Errorf("%s: retryAfter(%q) = now+%v, want now+%v", tc.name, tc.value, got, tc.want)
		}
	}
}

// A caller's 429 back-off is keyed by the identity the upstream received
// (forwarded, or set by Upstream.Headers over it); a request with none
// keys the whole upstream's.
func TestCallerKey(t *testing.T) {
	plain := newUpstream(nil, Upstream{Name: "a"})
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	if k := plain.callerKey(nil); k != "" {
		t.Errorf("no headers: key %q, want the whole upstream's", k)
	}
	if k := plain.callerKey(hdr("Traceparent", "00-x")); k != "" {
		t.Errorf("trace context only: key %q, want the whole upstream's", k)
	}
	keys := map[string]bool{}
	for _, h := range []http.Header{
		hdr("X-Mcp-Tenant", "a"), hdr("X-Mcp-Tenant", "b"), hdr("X-Mcp-Subject", "a"),
		hdr("X-Mcp-Tenant", "a", "X-Mcp-Subject", "u1"), hdr("X-Mcp-Tenant", "a", "X-Mcp-Subject", "u2"),
	} {
		k := plain.callerKey(h)
		if k == "" || keys[k] {
			t.Errorf("%v: key %q, want one of its own", h, k)
		}
		keys[k] = true
	}
	fixed := newUpstream(nil, Upstream{Name: "a", Headers: map[string]string{"x-mcp-tenant": "svc"}})
	if fixed.callerKey(hdr("X-Mcp-Tenant", "a")) != fixed.callerKey(hdr("X-Mcp-Tenant", "b")) {
		t.Errorf("a tenant set by Upstream.Headers does not key the back-off")
	}
}

// The callers' back-offs are bounded: expired ones go first, then the one
// that ends first; the whole upstream's is apart.
func TestLimitedCallersAreBounded(t *testing.T) {
	up := newUpstream(&Federator{opts: Options{Failures: 1}}, Upstream{Name: "a"})
	now := time.Now()
	key := func(i int) string { return fmt.Sprintf("tenant-%d", i) }
	for i := range MaxLimitedCallers {
		up.rateLimited(key(i), now.Add(time.Hour+time.Duration(i)*time.Millisecond))
	}
	up.rateLimited(key(MaxLimitedCallers), now.Add(2*time.Hour))
	if n := len(up.limitedBy); n != MaxLimitedCallers {
		t.Fatalf("%d callers remembered, want %d", n, MaxLimitedCallers)
	}
	if _, ok := up.limitedBy[key(0)]; ok {
		t.Errorf("the back-off ending first was kept at the bound")
	}
	if r := up.failure(key(MaxLimitedCallers), "x"); r.retry.IsZero() {
		t.Errorf("the newest caller's back-off was forgotten")
	}
	// Expired back-offs make room first.
	up.mu.Lock()
	up.limitedBy[key(5)] = now.Add(-time.Second)
	up.limitedBy[key(6)] = now.Add(-time.Second)
	up.mu.Unlock()
	up.rateLimited("new", now.Add(time.Minute))
	for _, k := range []string{key(5), key(6)} {
		if _, ok := up.limitedBy[k]; ok {
			t.Errorf("expired %s kept", k)
		}
	}
	if _, ok := up.limitedBy[key(1)]; !ok || len(up.limitedBy) != MaxLimitedCallers-1 {
		t.Errorf("a live back-off was dropped while expired ones made room (%d callers)", len(up.limitedBy))
	}
	// A caller's back-off is not the whole upstream's.
	if _, r := up.admit(now, ""); r != nil {
		t.Errorf("a call without identity refused: %+v", r)
	}
	if _, r := up.admit(now, "new"); r == nil || r.reason != reason429 {
		t.Errorf("the limited caller's call admitted: %+v", r)
	}
	if h := up.health(); h.State != StateUp {
		t.Errorf("state %s while only callers are limited, want up", h.State)
	}
}
