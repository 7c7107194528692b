// Command mcpgate is the MCP enforcement gateway. See the README and
// `mcpgate help` for the subcommands; all the work is in package cli.
package main

import (
	"context"
	"os"

	"github.com/mcpgate/mcpgate/cli"
)

func main() {
	os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
