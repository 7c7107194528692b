package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/mcp"
)

// listed is what an SDK client sees of the upstream's resources, resource
// templates and prompts through the gateway.
type listed struct {
	resources, templates, prompts []string
}

func listAll(t *testing.T, cs *sdk.ClientSession) listed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var l listed
	res, err := cs.ListResources(ctx, nil)
	if err != nil {
		t.Fatalf("resources/list: %v", err)
	}
	for _, r := range res.Resources {
		l.resources = append(l.resources, r.URI)
	}
	tmpl, err := cs.ListResourceTemplates(ctx, nil)
	if err != nil {
		t.Fatalf("resources/templates/list: %v", err)
	}
	for _, r := range tmpl.ResourceTemplates {
		l.templates = append(l.templates, r.URITemplate)
	}
	pr, err := cs.ListPrompts(ctx, nil)
	if err != nil {
		t.Fatalf("prompts/list: %v", err)
	}
	for _, p := range pr.Prompts {
		l.prompts = append(l.prompts, p.Name)
	}
	for _, s := range [][]string{l.resources, l.templates, l.prompts} {
		slices.Sort(s)
	}
	return l
}

func resourceReadBody(uri string) string {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": "r", "method": "resources/read", "params": map[string]any{"uri": uri}})
	return string(b)
}

func listenBody(notifications string) string {
	return `{"jsonrpc":"2.0","id":"l","method":"subscriptions/listen","params":{"notifications":` + notifications + `}}`
}

// A subscriptions/listen passes when every resource it asks updates of is
// in the scopes, and when it asks none (list changes only).
func TestAuthorizeListen(t *testing.T) {
	sc := auth.ParseScopes("resources:file:///docs/*")
	for _, tc := range []struct {
		params string
		denied string // "": allowed
	}{
		{`{"notifications":{"toolsListChanged":true}}`, ""},
		{`{"notifications":{"resourceSubscriptions":[]}}`, ""},
		{`{"notifications":null}`, ""},
		{`{"notifications":{"resourceSubscriptions":["file:///docs/a","file:///docs/b"]}}`, ""},
		{`{"notifications":{"resourceSubscriptions":["file:///docs/a","file:///etc/passwd"]}}`, "file:///etc/passwd"},
		{`{"notifications":{"resourceSubscriptions":["file:///docs/../etc/passwd"]}}`, "file:///docs/../etc/passwd"},
		{`{"notifications":{"resourceSubscriptions":[1]}}`, "subscriptions/listen params.notifications.resourceSubscriptions must be an array of strings"},
		{`{"notifications":{"resourceSubscriptions":["\ud800"]}}`, "subscriptions/listen params.notifications.resourceSubscriptions must be an array of strings"},
		{`{"notifications":{},"notifications":{"resourceSubscriptions":["file:///etc/passwd"]}}`, `subscriptions/listen params: duplicate member "notifications"`},
	} {
		msg := &mcp.Message{Method: mcp.MethodSubscriptionsListen, Params: json.RawMessage(tc.params)}
		d := authorizeListen(sc, msg)
		switch {
		case tc.denied == "" && d != nil:
			t.Errorf("%s: denied %+v", tc.params, d)
		case tc.denied != "" && d != nil && d.invalid != nil:
			if !strings.HasPrefix(d.invalid.Message, tc.denied) {
				t.Errorf("%s: %q, want a bad request %q", tc.params, d.invalid.Message, tc.denied)
			}
		case tc.denied != "" && (d == nil || d.kind != "resource" || !strings.HasPrefix(d.name, tc.denied)):
			t.Errorf("%s: %+v, want resource %q denied", tc.params, d, tc.denied)
		}
	}
}

func completionBody(ref string) string {
	return `{"jsonrpc":"2.0","id":"c","method":"completion/complete","params":{"ref":` + ref + `,"argument":{"name":"text","value":"x"}}}`
}

func subscribeBody(method, uri string) string {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": "s", "method": method, "params": map[string]any{"uri": uri}})
	return string(b)
}

func promptBody(name string) string {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": "p", "method": "prompts/get", "params": map[string]any{"name": name, "arguments": map[string]string{"text": "x"}}})
	return string(b)
}

// Resources and prompts are scoped like tools, through a real go-sdk
// upstream, with JSON and SSE answers: lists show only what the scopes
// allow, and a read or get outside them is a 403 that never reaches the
// upstream.
// Not parallel: closing its servers drops http.DefaultTransport's idle
// connections, which breaks POSTs of tests running beside it.
func TestResourceAndPromptScopes(t *testing.T) {
	for _, jsonAnswers := range []bool{true, false} {
		t.Run(fmt.Sprintf("json=%v", jsonAnswers), func(t *testing.T) {
			e := newEnv(t, setup{Upstream: upstream.Options{Stateless: true, JSONResponse: jsonAnswers}})
			scoped := sign(t, claims("acme", "alice", "tools:echo resources:file:///docs/* prompts:summarize"))
			cases := []struct {
				scope string
				want  listed
			}{
				{"tools:echo resources:file:///docs/* prompts:summarize", listed{
					resources: []string{"file:///docs/guide.md", "file:///docs/readme.md"},
					templates: []string{"file:///docs/{name}"},
					prompts:   []string{"summarize"},
				}},
				{"tools:* resources:* prompts:*", listed{
					resources: []string{"file:///docs/guide.md", "file:///docs/readme.md", "file:///secret/keys.txt"},
					templates: []string{"file:///docs/{name}", "file:///secret/{name}"},
					prompts:   []string{"internal_plan", "review", "summarize"},
				}},
				{"tools:*", listed{}}, // zero trust: no resources or prompts scope, none shown
				{"resources:file:///secret/keys.txt resources:*.md prompts:review", listed{
					// "*.md" matches the docs but is not a prefix glob: no template
					resources: []string{"file:///docs/guide.md", "file:///docs/readme.md", "file:///secret/keys.txt"},
					prompts:   []string{"review"},
				}},
			}
			for _, c := range cases {
				cs := connect(t, e.mcpURL(0), sign(t, claims("acme", "alice", c.scope)), "")
				got := listAll(t, cs)
				if !slices.Equal(got.resources, c.want.resources) || !slices.Equal(got.templates, c.want.templates) || !slices.Equal(got.prompts, c.want.prompts) {
					t.Errorf("%q: listed %+v, want %+v", c.scope, got, c.want)
				}
			}

			// Allowed reads and gets pass, a template's expansion included.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cs := connect(t, e.mcpURL(0), scoped, "")
			for _, uri := range []string{"file:///docs/readme.md", "file:///docs/not-listed.md"} {
				res, err := cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: uri})
				if err != nil || len(res.Contents) != 1 || res.Contents[0].Text != "contents of "+uri {
					t.Fatalf("read %s: %+v, %v", uri, res, err)
				}
			}
			pr, err := cs.GetPrompt(ctx, &sdk.GetPromptParams{Name: "summarize", Arguments: map[string]string{"text": "t"}})
			if err != nil || len(pr.Messages) != 1 {
				t.Fatalf("get summarize: %+v, %v", pr, err)
			}

			// Outside the scopes: 403, named, and nothing forwarded.
			reads, gets := e.up.Requests("resources/read"), e.up.Requests("prompts/get")
			long := "file:///secret/" + strings.Repeat("x", 10_000)
			denied := []struct{ body, kind, name string }{
				{resourceReadBody("file:///secret/keys.txt"), "resource", "file:///secret/keys.txt"},
				{resourceReadBody("file:///secret/other"), "resource", "file:///secret/other"},
				{resourceReadBody("file:///docs"), "resource", "file:///docs"},
				{resourceReadBody(long), "resource", long[:maxDeniedName-len("…")] + "…"},
				// dot segments and encoded separators would leave /docs/ once
				// the upstream resolves them
				{resourceReadBody("file:///docs/../secret/keys.txt"), "resource", "file:///docs/../secret/keys.txt"},
				{resourceReadBody("file:///docs/%2e%2e/secret/keys.txt"), "resource", "file:///docs/%2e%2e/secret/keys.txt"},
				{resourceReadBody("file:///docs/a%2f..%2fsecret"), "resource", "file:///docs/a%2f..%2fsecret"},
				// subscriptions are scoped like reads
				{subscribeBody("resources/subscribe", "file:///secret/keys.txt"), "resource", "file:///secret/keys.txt"},
				{subscribeBody("resources/unsubscribe", "file:///secret/keys.txt"), "resource", "file:///secret/keys.txt"},
				// subscriptions/listen (2026-07-28) is scoped like resources/subscribe
				{listenBody(`{"resourceSubscriptions":["file:///docs/readme.md","file:///secret/keys.txt"]}`), "resource", "file:///secret/keys.txt"},
				// completions are scoped like what they complete
				{completionBody(`{"type":"ref/prompt","name":"review"}`), "prompt", "review"},
				{completionBody(`{"type":"ref/resource","uri":"file:///secret/{name}"}`), "resource", "file:///secret/{name}"},
				{promptBody("review"), "prompt", "review"},
				{promptBody("Summarize"), "prompt", "Summarize"},
				{callBody(1, "search", nil), "tool", "search"},
			}
			for _, d := range denied {
				r := post(t, e.mcpURL(0), scoped, d.body, nil)
				if r.Status != http.StatusForbidden || r.code() != CodeForbidden {
					t.Fatalf("%s %s: %d %s", d.kind, d.name[:min(len(d.name), 40)], r.Status, r.Body)
				}
				var data map[string]string
				if err := json.Unmarshal(r.Msg.Error.Data, &data); err != nil || data[d.kind] != d.name {
					t.Fatalf("%s: data %s, want %s %q", d.kind, r.Msg.Error.Data, d.kind, d.name)
				}
				if !strings.Contains(r.Msg.Error.Message, d.kind+" ") || len(r.Body) > 2*maxDeniedName+200 {
					t.Fatalf("%s: message %q (body %d bytes)", d.kind, r.Msg.Error.Message, len(r.Body))
				}
			}
			if e.up.Requests("resources/read") != reads || e.up.Requests("prompts/get") != gets || e.up.Calls("search") != 0 ||
				e.up.Requests("resources/subscribe") != 0 || e.up.Requests("resources/unsubscribe") != 0 ||
				e.up.Requests("completion/complete") != 0 || e.up.Requests("subscriptions/listen") != 0 {
				t.Fatal("a denied request reached the upstream")
			}
			// The SDK client sees the refusal as an error too.
			if _, err := cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: "file:///secret/keys.txt"}); err == nil {
				t.Fatal("SDK read of a secret resource succeeded")
			}
			m := scrape(t, e.base[0])
			if m[`mcpgate_requests_total{method="resources/read",outcome="forbidden"}`] < 4 || m[`mcpgate_requests_total{method="prompts/get",outcome="forbidden"}`] != 2 {
				t.Fatalf("forbidden metrics: %v", m)
			}
		})
	}
}
