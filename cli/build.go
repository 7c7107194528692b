package cli

import (
	"context"
	"log/slog"
	"reflect"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/setup"
)

// buildAuth builds the authenticator of cfg's auth section (see setup.Auth).
func buildAuth(ctx context.Context, cfg *policy.Config, log *slog.Logger) (*auth.Authenticator, error) {
	return setup.Auth(ctx, cfg, log)
}

// keepsAuth reports whether the authenticator built for old serves next
// unchanged, so that a reload keeps it: both verify against the same JWKS
// URL with the same options. A JWKS URL's key set refreshes itself;
// building a new authenticator only adds a fetch, which refuses the whole
// reload (a rate limit changed, say) while the identity provider is down.
// Other key sources are built again on every reload: re-reading a key
// file is how an operator rotates it.
func keepsAuth(old, next *policy.Config) bool {
	quiet := slog.New(slog.DiscardHandler)
	a, errA := setup.AuthOptions(old, quiet)
	b, errB := setup.AuthOptions(next, quiet)
	if errA != nil || errB != nil || a.JWKSURL == "" {
		return false
	}
	a.Logger, b.Logger = nil, nil
	return reflect.DeepEqual(a, b)
}
