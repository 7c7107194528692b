package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/setup"
)

// runCheck is serve's preflight: it fails on what would stop serve at once
// for a reason in the file (policy errors, an unusable key file) and warns
// of what depends on the environment check may not share with serve (an
// unset secret variable, as an unset upstream header variable), but
// touches no network.
func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("check", stderr)
	path := fs.String("config", "", "config file to validate (required)")
	embedded := fs.Bool("embedded", false, "validate the config of an MCP server embedding the engine (examples/sdkserver): upstream may be absent")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		fmt.Fprintln(stderr, "mcpgate check: --config FILE is required")
		return errUsage
	}
	load := policy.Load
	if *embedded {
		load = policy.LoadEmbedded
	}
	cfg, err := load(*path)
	if err != nil {
		// policy errors print one "file:line: field: problem" per line.
		fmt.Fprintln(stderr, err)
		return errReported
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintln(stderr, "warning:", w)
	}
	switch err := setup.CheckAuth(ctx, cfg); {
	case errors.Is(err, setup.ErrSecretUnset):
		fmt.Fprintf(stderr, "warning: %s: %v (serve refuses to start without it)\n", *path, err)
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v\n", *path, err)
		return errReported
	}
	fmt.Fprintf(stdout, "%s: ok\n", *path)
	return nil
}
