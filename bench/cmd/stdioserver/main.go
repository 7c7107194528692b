// Command stdioserver is the demo upstream (examples/upstream) served over
// stdio: the stdio upstream of loadgen's -stdio targets.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	if err := upstream.New(nil).MCPServer().Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "stdioserver:", err)
		os.Exit(1)
	}
}
