package testenv

import (
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ToolText is the text contents of a tool result, joined: what the tests'
// echo-like tools answer.
func ToolText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}
