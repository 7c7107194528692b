package upstream

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ResourceURIs lists the demo resources, in documentation order: two under
// file:///docs/ and one under file:///secret/, so that scopes such as
// "resources:file:///docs/*" have something to hide.
var ResourceURIs = []string{"file:///docs/readme.md", "file:///docs/guide.md", "file:///secret/keys.txt"}

// ResourceTemplates lists the demo resource templates; reading any URI
// they expand to returns a text naming that URI.
var ResourceTemplates = []string{"file:///docs/{name}", "file:///secret/{name}"}

// PromptNames lists the demo prompts, in documentation order.
var PromptNames = []string{"summarize", "review", "internal_plan"}

func (s *Server) addResources() {
	read := func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		uri := req.Params.URI
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{
			{URI: uri, MIMEType: "text/plain", Text: "contents of " + uri},
		}}, nil
	}
	for _, uri := range ResourceURIs {
		s.sdk.AddResource(&mcp.Resource{URI: uri, Name: uri[len("file:///"):], MIMEType: "text/plain"}, read)
	}
	for _, tmpl := range ResourceTemplates {
		s.sdk.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: tmpl, Name: tmpl, MIMEType: "text/plain"}, read)
	}
}

func (s *Server) addPrompts() {
	for _, name := range PromptNames {
		s.sdk.AddPrompt(&mcp.Prompt{Name: name, Description: "Demo prompt " + name + ".",
			Arguments: []*mcp.PromptArgument{{Name: "text", Description: "what the prompt is about"}}},
			func(_ context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
				return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{
					Role:    "user",
					Content: &mcp.TextContent{Text: fmt.Sprintf("%s: %s", name, req.Params.Arguments["text"])},
				}}}, nil
			})
	}
}
