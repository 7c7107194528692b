package gateway

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// adminBodyPosts posts a JSON body, with the admin token, to each admin
// endpoint that reads one.
var adminBodyPosts = map[string]func(t *testing.T, base, body string) *response{
	"/admin/limits/reset": func(t *testing.T, base, body string) *response {
		return postReset(t, base, "Bearer "+testAdmin, body)
	},
	"/admin/cache/invalidate": func(t *testing.T, base, body string) *response {
		return adminInvalidate(t, base, testAdmin, body)
	},
}

// An admin JSON body is one JSON value: anything after it but white space
// (a second value, as a script concatenating requests would send) answers
// 400 and applies nothing, where the first value used to be applied (200)
// and the rest ignored.
func TestAdminBodyTrailingData(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: adminConfig})
	for _, c := range []struct {
		path, body string
		status     int
	}{
		{"/admin/limits/reset", `{"tenant":"a"}{"tenant":"b"}`, http.StatusBadRequest},
		{"/admin/limits/reset", `{"tenant":"a"} x`, http.StatusBadRequest},
		{"/admin/limits/reset", `{"tenant":"a"}]`, http.StatusBadRequest},
		{"/admin/limits/reset", "{\"tenant\":\"a\"}\r\n \t", http.StatusOK},
		{"/admin/cache/invalidate", `{"tenant":"a","tags":["x"]}{"tenant":"b","tags":["y"]}`, http.StatusBadRequest},
		{"/admin/cache/invalidate", `{"tenant":"a","tags":["x"]}` + "\n", http.StatusOK},
	} {
		if r := adminBodyPosts[c.path](t, e.base[0], c.body); r.Status != c.status {
			t.Errorf("POST %s with body %q: %d %s, want %d", c.path, c.body, r.Status, bytes.TrimSpace(r.Body), c.status)
		}
	}
}

// An admin JSON body over the bound (http.MaxBytesReader, 1 MiB) is
// answered 413 Content Too Large, as the MCP endpoint answers the same
// condition (protocol_test.go), so a client can tell an oversized request
// from a malformed one. (Once, it was answered 400 "body: http: request
// body too large".)
func TestAdminOversizeBodyIs413(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: adminConfig})
	body := `{"tenant":"acme","subject":"` + strings.Repeat("x", 2<<20) + `"}`
	for path, post := range adminBodyPosts {
		if r := post(t, e.base[0], body); r.Status != http.StatusRequestEntityTooLarge {
			t.Errorf("POST %s with a 2 MiB body: %d %s, want 413", path, r.Status, bytes.TrimSpace(r.Body))
		}
	}
}
