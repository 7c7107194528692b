package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/mcpgate/mcpgate/policy"
)

func runCheck(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("check", stderr)
	path := fs.String("config", "", "config file to validate (required)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		fmt.Fprintln(stderr, "mcpgate check: --config FILE is required")
		return errUsage
	}
	cfg, err := policy.Load(*path)
	if err != nil {
		// policy errors print one "file:line: field: problem" per line.
		fmt.Fprintln(stderr, err)
		return errReported
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintln(stderr, "warning:", w)
	}
	fmt.Fprintf(stdout, "%s: ok\n", *path)
	return nil
}
