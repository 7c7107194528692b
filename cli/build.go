package cli

import (
	"context"
	"log/slog"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/setup"
)

// buildAuth builds the authenticator of cfg's auth section (see setup.Auth).
func buildAuth(ctx context.Context, cfg *policy.Config, log *slog.Logger) (*auth.Authenticator, error) {
	return setup.Auth(ctx, cfg, log)
}
