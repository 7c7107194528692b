// Package cli implements the mcpgate command line: serve, demo, check,
// usage, invalidate and version. cmd/mcpgate only calls Main.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
)

// Version is set at build time with -ldflags "-X github.com/mcpgate/mcpgate/cli.Version=v1.2.3";
// otherwise the module version from the build info is used.
var Version = ""

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run the gateway: serve --config FILE", runServe},
		{"demo", "run the gateway and a demo MCP server on embedded defaults: demo [--listen ADDR]", runDemo},
		{"check", "validate a config file: check --config FILE [--embedded]", runCheck},
		{"usage", "show a tenant's usage: usage --config FILE --tenant T [--period YYYY-MM] [--tier NAME] [--json]; usage init --config FILE", runUsage},
		{"invalidate", "drop cached results by tag: invalidate --config FILE --tenant T --tag TAG [--tag TAG...]", runInvalidate},
		{"version", "print the version", runVersion},
	}
}

// errUsage marks an error already explained to the user (exit status 2).
var errUsage = errors.New("usage")

// errReported marks a failure already printed (exit status 1).
var errReported = errors.New("reported")

// Main runs the command line args (without the program name) and returns the
// process exit status: 0 success, 1 failure, 2 bad usage.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil, errors.Is(err, flag.ErrHelp): // -h asked for the help it got
			return 0
		case errors.Is(err, errUsage):
			return 2
		case errors.Is(err, errReported):
			return 1
		default:
			fmt.Fprintf(stderr, "mcpgate %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "mcpgate: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "mcpgate: an enforcement gateway for MCP tool servers.")
	fmt.Fprintln(w, "\nUsage: mcpgate COMMAND [flags]\n\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun mcpgate COMMAND -h for the flags of a command.")
}

// newFlags returns a FlagSet that reports errors on stderr without exiting.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("mcpgate "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags parses args and refuses positional leftovers.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", fs.Name(), strings.Join(fs.Args(), " "))
		return errUsage
	}
	return nil
}

func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	if err := parseFlags(newFlags("version", stderr), args); err != nil {
		return err
	}
	v := Version
	if v == "" {
		v = "(devel)"
		if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
			v = bi.Main.Version
		}
	}
	fmt.Fprintln(stdout, "mcpgate", v)
	return nil
}
