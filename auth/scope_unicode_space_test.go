package auth

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// RFC 6749 §3.3: scope = scope-token *( SP scope-token ), a scope-token
// being printable ASCII. ParseScopes splits on ASCII white space, not on
// Unicode white space (U+00A0, U+2028, U+3000, U+0085...): the (invalid)
// scope value "tools:echo\u00a0tools:*", which a conforming reader takes
// as a single unknown token, does not grant every tool, parsed or in a
// verified token. (Once, strings.Fields split it into two scopes, one "tools:*".)
func TestScopeNotSplitOnUnicodeSpace(t *testing.T) {
	for _, sp := range []string{"\u00a0", "\u2028", "\u3000", "\u0085"} {
		s := ParseScopes("tools:echo" + sp + "tools:*")
		if s.AllowsTool("admin__delete_everything") {
			t.Errorf("ParseScopes(%q) grants every tool: %s", "tools:echo"+sp+"tools:*", s)
		}
	}
	// The same through a verified token.
	a := hsAuth(t, nil)
	exp := fmt.Sprint(t0.Add(time.Hour).Unix())
	tok := signRaw(t, testSecret, `{"alg":"HS256"}`,
		[]byte(`{"tenant_id":"acme","sub":"u","exp":`+exp+`,"scope":"tools:echo\u00a0tools:*"}`))
	p, err := a.Verify(context.Background(), tok)
	if err == nil && p.Scopes.AllowsTool("admin__delete_everything") {
		t.Errorf("token with scope %q grants every tool: %s", "tools:echo\\u00a0tools:*", p.Scopes)
	}
}
