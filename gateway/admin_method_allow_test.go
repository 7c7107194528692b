package gateway

import (
	"net/http"
	"testing"
)

// A known admin path asked with another method answers 405 with the
// methods it serves in Allow, after the token check: without the token it
// is 401 like every admin request, and a path that is not an endpoint
// stays 404 whatever the method. (The "/admin/" catch-all of unknown
// paths matches every method, so net/http's own 405, which /healthz gets,
// admin_test.go, never happens under /admin/: a known endpoint asked with
// the wrong method used to answer 404 "unknown admin endpoint".)
func TestAdminWrongMethodAllow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: adminConfig})
	admin := "Bearer " + testAdmin
	for _, c := range []struct {
		method, path, authz string
		status              int
		allow               string
	}{
		{http.MethodGet, "/admin/reload", admin, http.StatusMethodNotAllowed, "POST"},
		{http.MethodGet, "/admin/limits/reset", admin, http.StatusMethodNotAllowed, "POST"},
		{http.MethodPost, "/admin/limits?tenant=acme", admin, http.StatusMethodNotAllowed, "GET, HEAD"},
		{http.MethodPost, "/admin/breakers", admin, http.StatusMethodNotAllowed, "GET, HEAD"},
		{http.MethodPut, "/admin/limits", admin, http.StatusMethodNotAllowed, "GET, HEAD"},
		{http.MethodGet, "/admin/breakers/x", admin, http.StatusMethodNotAllowed, "DELETE"},
		{http.MethodDelete, "/admin/breakers", admin, http.StatusMethodNotAllowed, "GET, HEAD"},
		{http.MethodGet, "/admin/reload", "", http.StatusUnauthorized, ""},
		{http.MethodGet, "/admin/breakers/x/y", admin, http.StatusNotFound, ""},
		{http.MethodPost, "/admin/nope", admin, http.StatusNotFound, ""},
	} {
		r := adminReq(t, c.method, e.base[0]+c.path, c.authz)
		if r.Status != c.status || r.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s (authorization %q): %d, Allow %q; want %d, Allow %q", c.method, c.path, c.authz, r.Status, r.Header.Get("Allow"), c.status, c.allow)
		}
	}
}
