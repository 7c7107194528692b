package gosdk

import (
	"errors"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/auth"
)

// authorize refuses what the scopes do not allow, for every scoped kind of
// request, naming it in the error's data; it passes the rest.
func TestAuthorizeKinds(t *testing.T) {
	sc := auth.ParseScopes("tools:echo prompts:greet resources:file:///docs/*")
	listen := func(uris ...string) *mcp.SubscriptionsListenParams {
		return &mcp.SubscriptionsListenParams{Notifications: &mcp.NotificationSubscriptions{ResourceSubscriptions: uris}}
	}
	for _, tc := range []struct {
		name   string
		params mcp.Params
		data   string // "": allowed
	}{
		{"tool allowed", &mcp.CallToolParamsRaw{Name: "echo"}, ""},
		{"tool", &mcp.CallToolParamsRaw{Name: "rm"}, `{"tool":"rm"}`},
		{"prompt allowed", &mcp.GetPromptParams{Name: "greet"}, ""},
		{"prompt", &mcp.GetPromptParams{Name: "plan"}, `{"prompt":"plan"}`},
		{"read allowed", &mcp.ReadResourceParams{URI: "file:///docs/a"}, ""},
		{"read", &mcp.ReadResourceParams{URI: "file:///etc/passwd"}, `{"resource":"file:///etc/passwd"}`},
		{"subscribe", &mcp.SubscribeParams{URI: "file:///etc/passwd"}, `{"resource":"file:///etc/passwd"}`},
		{"unsubscribe", &mcp.UnsubscribeParams{URI: "file:///etc/passwd"}, `{"resource":"file:///etc/passwd"}`},
		{"listen allowed", listen("file:///docs/a", "file:///docs/b"), ""},
		{"listen to list changes only", &mcp.SubscriptionsListenParams{Notifications: &mcp.NotificationSubscriptions{ToolsListChanged: true}}, ""},
		{"listen", listen("file:///docs/a", "file:///etc/passwd"), `{"resource":"file:///etc/passwd"}`},
		{"complete a prompt", &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "plan"}}, `{"prompt":"plan"}`},
		{"complete a template", &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/resource", URI: "file:///etc/{x}"}}, `{"resource":"file:///etc/{x}"}`},
		{"a long name is cut", &mcp.CallToolParamsRaw{Name: strings.Repeat("x", 1000)}, `{"tool":"` + strings.Repeat("x", maxDeniedName-len("…")) + `…"}`},
	} {
		err := authorize(sc, tc.params)
		var je *jsonrpc.Error
		switch {
		case tc.data == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.data != "" && (!errors.As(err, &je) || je.Code != CodeForbidden || string(je.Data) != tc.data):
			t.Errorf("%s: %v, want code %d with data %s", tc.name, err, CodeForbidden, tc.data)
		}
	}
}

// A completion ref of another type than ref/prompt or ref/resource (none,
// a case variant) is invalid params, whatever the scopes, as the gateway
// answers it: no scope could allow it.
func TestAuthorizeUnknownCompletionRef(t *testing.T) {
	for _, p := range []*mcp.CompleteParams{
		{Ref: &mcp.CompleteReference{Type: "ref/other", Name: "plan"}},
		{Ref: &mcp.CompleteReference{Type: "ref/Prompt", Name: "plan"}},
		{Ref: nil},
	} {
		var je *jsonrpc.Error
		if err := authorize(auth.ParseScopes("prompts:* resources:*"), p); !errors.As(err, &je) || je.Code != jsonrpc.CodeInvalidParams {
			t.Errorf("ref %+v: %v, want invalid params", p.Ref, err)
		}
	}
}

// Every list trim filters says cacheScope "private" (its ttlMs kept), the
// handler's own result untouched: the end-to-end test sees tools/list only.
func TestTrimmedListsArePrivate(t *testing.T) {
	sc := auth.ParseScopes("tools:echo prompts:greet resources:file:///docs/*")
	public := mcp.Cacheable{TTLMs: 60000, CacheScope: "public"}
	for _, res := range []mcp.CacheableResult{
		&mcp.ListToolsResult{Cacheable: public, Tools: []*mcp.Tool{{Name: "echo"}, {Name: "rm"}}},
		&mcp.ListPromptsResult{Cacheable: public, Prompts: []*mcp.Prompt{{Name: "greet"}}},
		&mcp.ListResourcesResult{Cacheable: public, Resources: []*mcp.Resource{{URI: "file:///etc/passwd"}}},
		&mcp.ListResourceTemplatesResult{Cacheable: public, ResourceTemplates: []*mcp.ResourceTemplate{{URITemplate: "file:///docs/{x}"}}},
	} {
		out, ok := trim(sc, res).(mcp.CacheableResult)
		if !ok || out.GetCacheScope() != "private" || out.GetTTLMs() != 60000 {
			t.Errorf("%T trimmed: %+v, want cacheScope private and ttlMs 60000", res, out)
		}
		if res.GetCacheScope() != "public" {
			t.Errorf("%T: the handler's result was modified", res)
		}
	}
}
