package cli

import (
	"log/slog"
	"os"
	"strings"

	"github.com/mcpgate/mcpgate/policy"
)

// adminToken is the admin bearer token cfg names: the value of the
// variable auth.admin_token_env, or "" (admin API disabled, with a warning
// when the variable is named but empty). It is read at start and on every
// reload; a process's environment is fixed when it starts, so a reload can
// switch to another variable that was set then, or turn the API off.
//
// Surrounding whitespace is dropped, with a warning: a variable filled from
// a secret file usually ends in a newline, which no client can send in an
// Authorization header, so the token would refuse everyone.
func adminToken(cfg *policy.Config, log *slog.Logger) string {
	env := cfg.Auth.AdminTokenEnv
	if env == "" {
		return ""
	}
	raw := os.Getenv(env)
	tok := strings.TrimSpace(raw)
	switch {
	case tok == "":
		log.Warn("admin API disabled: environment variable is empty", "env", env)
	case tok != raw:
		log.Warn("admin token: surrounding whitespace dropped", "env", env)
	}
	return tok
}
