package mcp

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

func TestHasCachingHints(t *testing.T) {
	for v, want := range map[string]bool{
		"2026-07-28": true, "2026-12-01": true, "2027-01-01": true,
		"2025-11-25": false, "2025-06-18": false, "": false,
		"2026-07-2": false, "9999-99-9x": false, "2026/07/28": false, "latest!!!!": false,
	} {
		if got := HasCachingHints(v); got != want {
			t.Errorf("HasCachingHints(%q) = %v, want %v", v, got, want)
		}
	}
}

// A list the proxy filters for a 2026-07-28 caller says cacheScope
// "private" whatever the upstream said (public, a case-insensitive twin,
// nothing), keeps the upstream's ttlMs, in JSON and SSE answers, for each
// of the four list methods. Older protocol versions get the result as
// before, without the member added.
func TestProxyFilteredListIsPrivate(t *testing.T) {
	hidden := func(key string) bool { return !strings.Contains(key, "secret") }
	lists := []struct {
		list  List
		entry string // one allowed entry
	}{
		{ToolsList, `{"name":"a"}`},
		{ResourcesList, `{"uri":"file:///a"}`},
		{ResourceTemplatesList, `{"uriTemplate":"file:///{n}"}`},
		{PromptsList, `{"name":"a"}`},
	}
	hints := []struct {
		name, upstream, want string // members around the list member
	}{
		{"public", `"ttlMs":60000,"cacheScope":"public"`, `"ttlMs":60000,"cacheScope":"private"`},
		{"twin", `"ttlMs":5,"cacheScope":"public","CacheScope":"public"`, `"ttlMs":5,"cacheScope":"private","CacheScope":"private"`},
		{"absent", `"ttlMs":0`, `"ttlMs":0,"cacheScope":"private"`},
	}
	for _, l := range lists {
		for _, h := range hints {
			for _, sse := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/sse=%v", l.list.Method, h.name, sse), func(t *testing.T) {
					result := `{` + h.upstream + `,"` + l.list.Member + `":[` + l.entry + `,{"` + l.list.Key + `":"secret"}]}`
					g, gs := newGateway(t, ProxyOptions{Upstream: listUpstream(t, sse, `7`, result).URL})
					g.filter = Filter{List: l.list, Allow: hidden}
					call := `{"jsonrpc":"2.0","id":7,"method":"` + l.list.Method + `"}`
					unwrap := func(body string) string {
						if sse {
							body = strings.TrimSuffix(strings.TrimPrefix(body, "event: message\ndata: "), "\n\n")
						}
						m, err := Parse([]byte(body))
						if err != nil {
							t.Fatalf("body %s: %v", body, err)
						}
						return string(m.Result)
					}
					kept := `"` + l.list.Member + `":[` + l.entry + `]`
					want := `{` + h.want + `,` + kept + `}`
					if h.name == "absent" {
						want = `{"ttlMs":0,` + kept + `,"cacheScope":"private"}`
					}
					got := unwrap(readAll(t, post(t, gs.URL, call, http.Header{"Mcp-Protocol-Version": {"2026-07-28"}})))
					if got != want {
						t.Fatalf("2026-07-28: result %s\nwant             %s", got, want)
					}
					if s := g.next(t); string(s.result) != want {
						t.Fatalf("reported %s", s.result)
					}
					old := `{` + h.upstream + `,` + kept + `}`
					if got := unwrap(readAll(t, post(t, gs.URL, call, http.Header{"Mcp-Protocol-Version": {"2025-11-25"}}))); got != old {
						t.Fatalf("2025-11-25: result %s\nwant             %s", got, old)
					}
					g.next(t)
				})
			}
		}
	}
}

// An unfiltered answer (no Filter for the method) is relayed as the
// upstream sent it, cacheScope included: the gateway only marks what it
// shaped for one caller.
func TestProxyUnfilteredListKeepsScope(t *testing.T) {
	result := `{"ttlMs":1000,"cacheScope":"public","tools":[{"name":"a"}]}`
	g, gs := newGateway(t, ProxyOptions{Upstream: listUpstream(t, false, `7`, result).URL})
	body := readAll(t, post(t, gs.URL, `{"jsonrpc":"2.0","id":7,"method":"tools/list"}`, http.Header{"Mcp-Protocol-Version": {"2026-07-28"}}))
	if want := `{"jsonrpc":"2.0","id":7,"result":` + result + `}`; body != want {
		t.Fatalf("body %s\nwant %s", body, want)
	}
	g.next(t)
}
