package gateway

import (
	"bytes"
	"net/http"
	"testing"
)

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
		req, err := http.NewRequest(http.MethodPost, e.base[0]+c.path, bytes.NewBufferString(c.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+testAdmin)
		req.Header.Set("Content-Type", "application/json")
		r, err := do(req)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != c.status {
			t.Errorf("POST %s with body %q: %d %s, want %d", c.path, c.body, r.Status, bytes.TrimSpace(r.Body), c.status)
		}
	}
}
