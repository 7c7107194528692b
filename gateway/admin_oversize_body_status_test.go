package gateway

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// The admin API bounds its JSON bodies with http.MaxBytesReader (1 MiB),
// but a body over the bound is answered 400 "body: http: request body too
// large" instead of 413 Content Too Large, which the MCP endpoint answers
// for the same condition (protocol_test.go): a client cannot tell an
// oversized request from a malformed one.
func TestAdminOversizeBodyIs413(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: adminConfig})
	body := `{"tenant":"acme","subject":"` + strings.Repeat("x", 2<<20) + `"}`
	for _, path := range []string{"/admin/limits/reset", "/admin/cache/invalidate"} {
		req, err := http.NewRequest(http.MethodPost, e.base[0]+path, bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+testAdmin)
		req.Header.Set("Content-Type", "application/json")
		r, err := do(req)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != http.StatusRequestEntityTooLarge {
			t.Errorf("POST %s with a 2 MiB body: %d %s, want 413", path, r.Status, bytes.TrimSpace(r.Body))
		}
	}
}
