package gateway

import (
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/internal/ident"
)

// FuzzSessionBinder: for any two principals that authentication could
// produce (tenant and subject pass ident.Check), any upstream session id and
// lease:
//   - an id issued to p (wrap or wrapLease) unwraps for p to exactly the
//     upstream id and lease it was issued with;
//   - it never unwraps for another principal (other tenant or subject);
//   - answer gives the client its own id back when the upstream repeats it;
//   - any client string that unwraps for p is canonical: re-issuing the
//     unwrapped (id, lease) gives that very string (no second spelling of a
//     session, which would let one session take two slots or dodge a lease).
func FuzzSessionBinder(f *testing.F) {
	f.Add("acme", "u1", "acme", "u2", "sess-1", "lease1", true, "sess-1.lease1.xxxxxxxxxxxxxxxxxxxxxx")
	f.Add("acme", "u1", "acme2", "u1", "a.b", "", false, ".")
	f.Add("a", "b", "a", "b", "", "x.y", true, "")
	f.Add("t", "", "t", "", "x.", ".", true, "x..AAAAAAAAAAAAAAAAAAAAAA")
	b := newSessionBinder([]byte("0123456789abcdef0123456789abcdef"))
	f.Fuzz(func(t *testing.T, t1, s1, t2, s2, upstream, lease string, useLease bool, client string) {
		if t1 == "" || t2 == "" || ident.Check(t1, ident.MaxTenantBytes) != nil || ident.Check(t2, ident.MaxTenantBytes) != nil ||
			ident.Check(s1, auth.MaxSubjectBytes) != nil || ident.Check(s2, auth.MaxSubjectBytes) != nil {
			return
		}
		p1 := auth.Principal{Tenant: t1, Subject: s1}
		p2 := auth.Principal{Tenant: t2, Subject: s2}
		var id, wantLease string
		if useLease {
			id = b.wrapLease(p1, upstream, lease)
			if lease != "" && !strings.Contains(lease, ".") {
				wantLease = lease
			}
		} else {
			id = b.wrap(p1, upstream)
		}
		up, l, ok := b.unwrap(p1, id)
		if !ok || up != upstream || l != wantLease {
			t.Fatalf("issued %q for (%q, %q): unwraps to (%q, %q, %v)", id, upstream, lease, up, l, ok)
		}
		if got := b.answer(p1, id, up)(up); got != id {
			t.Fatalf("answer repeating %q gives %q", id, got)
		}
		if t1 != t2 || s1 != s2 {
			if up2, l2, ok := b.unwrap(p2, id); ok {
				t.Fatalf("id %q of %+v unwraps for %+v to (%q, %q)", id, p1, p2, up2, l2)
			}
		}
		if cu, cl, ok := b.unwrap(p1, client); ok {
			re := b.wrap(p1, cu)
			if cl != "" {
				re = b.wrapLease(p1, cu, cl)
			}
			if re != client {
				t.Fatalf("client id %q unwraps to (%q, %q), issued as %q", client, cu, cl, re)
			}
		}
	})
}
