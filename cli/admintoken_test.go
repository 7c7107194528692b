package cli

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/policy"
)

// A token read from a secret file often ends in a newline, which no client
// can send in a header: the admin API would refuse every call with no hint.
func TestAdminTokenTrimsSurroundingWhitespace(t *testing.T) {
	for _, tc := range []struct{ env, want, warn string }{
		{"s3cret", "s3cret", ""},
		{"s3cret\n", "s3cret", "surrounding whitespace"},
		{" s3cret\r\n", "s3cret", "surrounding whitespace"},
		{"\n", "", "empty"},
		{"", "", "empty"},
	} {
		t.Setenv("CLI_TEST_ADMIN_TRIM", tc.env)
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, nil))
		cfg := &policy.Config{}
		cfg.Auth.AdminTokenEnv = "CLI_TEST_ADMIN_TRIM"
		if got := adminToken(cfg, log); got != tc.want {
			t.Errorf("env %q: token %q, want %q", tc.env, got, tc.want)
		}
		if tc.warn == "" && buf.Len() > 0 || tc.warn != "" && !strings.Contains(buf.String(), tc.warn) {
			t.Errorf("env %q: log %q, want a warning containing %q", tc.env, buf.String(), tc.warn)
		}
	}
}
