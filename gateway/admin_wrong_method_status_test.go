package gateway

import (
	"net/http"
	"testing"
)

// A known admin endpoint asked with the wrong method falls through to the
// "/admin/" catch-all and answers 404 "unknown admin endpoint" (no Allow
// header) instead of 405 Method Not Allowed: the catch-all matches every
// method, so net/http's own 405 (which /healthz gets, admin_test.go)
// never happens under /admin/. An operator who sends GET /admin/reload is
// told the endpoint does not exist.
func TestAdminWrongMethodIs405(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: adminConfig})
	admin := "Bearer " + testAdmin
	for _, ep := range []struct{ method, path string }{
		{http.MethodGet, "/admin/reload"},
		{http.MethodGet, "/admin/limits/reset"},
		{http.MethodPost, "/admin/limits?tenant=acme"},
		{http.MethodPost, "/admin/breakers"},
	} {
		r := adminReq(t, ep.method, e.base[0]+ep.path, admin)
		if r.Status != http.StatusMethodNotAllowed || r.Header.Get("Allow") == "" {
			t.Errorf("%s %s: %d (Allow %q) %s, want 405 with Allow", ep.method, ep.path, r.Status, r.Header.Get("Allow"), r.Body)
		}
	}
}
