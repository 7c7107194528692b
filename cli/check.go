package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/mcpgate/mcpgate/audit"

	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/setup"
)

// runCheck is serve's preflight: it fails on what would stop serve at once
// for a reason in the file (policy errors, an unusable key file, an audit
// file that cannot be opened) and warns
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
	if err := checkAuditFile(cfg.Audit.File); err != nil {
		fmt.Fprintf(stderr, "%s: audit.file: %v\n", *path, err)
		return errReported
	}
	fmt.Fprintf(stdout, "%s: ok\n", *path)
	return nil
}

// checkAuditFile fails when serve could not open the audit file at path
// for appending, without creating it (it is serve's to create, with its
// mode): an existing regular file is opened for appending and closed,
// writing nothing; for a missing one, its directory must exist and take a
// new file, which a probe file created there and removed at once shows (a
// permission check of the directory's mode would miss a read-only file
// system and ACLs). Standard output ("-"), no audit log (""), and files
// that are not regular (a FIFO, whose opening waits for a reader; a
// device) pass.
func checkAuditFile(path string) error {
	if path == "" || path == audit.Stdout {
		return nil
	}
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return fmt.Errorf("%s is a directory", path)
	case err == nil && fi.Mode().IsRegular():
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return fmt.Errorf("%s cannot be opened for appending: %w", path, err)
		}
		return f.Close()
	case err == nil:
		return nil
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%s cannot be opened: %w", path, err)
	}
	// A dangling symbolic link (to a volume not mounted, say): serve's
	// open creates the file where the link points, so that is what must
	// be creatable. A chain of links too long for the kernel fails there.
	for range 40 {
		target, err := os.Readlink(path)
		if err != nil {
			break
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(path), target)
		}
		path = target
	}
	dir := filepath.Dir(path)
	if di, err := os.Stat(dir); err != nil {
		return fmt.Errorf("%s cannot be created: %w", path, err)
	} else if !di.IsDir() {
		return fmt.Errorf("%s cannot be created: %s is not a directory", path, dir)
	}
	probe, err := os.CreateTemp(dir, ".mcpgate-check-*")
	if err != nil {
		return fmt.Errorf("%s cannot be created: %w", path, err)
	}
	name := probe.Name()
	return errors.Join(probe.Close(), os.Remove(name))
}
