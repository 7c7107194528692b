package mcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const toolsList = `{"jsonrpc":"2.0","id":"L","method":"tools/list"}`

func toolsListUpstream(t *testing.T, sse bool, result string) *httptest.Server {
	return fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		resp := `{"jsonrpc":"2.0","id":"L","result":` + result + `}`
		if !sse {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, resp)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		// Pretty-printed over several data lines, with an id and a comment.
		var pretty bytes.Buffer
		_ = json.Indent(&pretty, []byte(resp), "", "  ")
		io.WriteString(w, ": hello\n\nid: ev-1\nevent: message\n")
		for _, line := range strings.Split(pretty.String(), "\n") {
			io.WriteString(w, "data: "+line+"\n")
		}
		io.WriteString(w, "\n")
	})
}

func TestProxyToolsListFilter(t *testing.T) {
	const result = `{"tools":[{"name":"a","inputSchema":{"type":"object"}},{"name":"secret","description":"x"},{"name":"c"},{"nameless":true}],"nextCursor":"n2","_meta":{"k":1}}`
	for _, sse := range []bool{false, true} {
		t.Run(fmt.Sprintf("sse=%v", sse), func(t *testing.T) {
			g, gs := newGateway(t, ProxyOptions{Upstream: toolsListUpstream(t, sse, result).URL})
			g.allow = func(name string) bool { return name != "secret" }
			resp := post(t, gs.URL, toolsList, nil)
			body := readAll(t, resp)
			data := body
			if sse {
				if !strings.HasPrefix(body, ": hello\n\nid: ev-1\nevent: message\ndata: {") || !strings.HasSuffix(body, "}\n\n") {
					t.Fatalf("rewritten stream %q", body)
				}
				data = strings.TrimSuffix(strings.SplitN(body, "data: ", 2)[1], "\n\n")
			}
			m, err := Parse([]byte(data))
			if err != nil || m.Kind != Response || string(m.ID) != `"L"` {
				t.Fatalf("body %s: %v", body, err)
			}
			want := `{"tools":[{"name":"a","inputSchema":{"type":"object"}},{"name":"c"}],"nextCursor":"n2","_meta":{"k":1}}`
			if string(m.Result) != want {
				t.Fatalf("result %s\nwant   %s", m.Result, want)
			}
			s := g.next(t)
			if s.err != nil || s.reported != 1 || string(s.result) != want {
				t.Fatalf("served %+v", s)
			}
		})
	}
}

func TestProxyToolsListUnfilterableFailsClosed(t *testing.T) {
	for _, result := range []string{`{"tools":{"name":"secret"}}`, `{"tools":[],"tools":[{"name":"secret"}]}`, `[]`, `{"tools":["secret"]}`} {
		for _, sse := range []bool{false, true} {
			g, gs := newGateway(t, ProxyOptions{Upstream: toolsListUpstream(t, sse, result).URL})
			g.allow = func(string) bool { return true }
			resp := post(t, gs.URL, toolsList, nil)
			body := readAll(t, resp)
			if strings.Contains(body, "secret") || !strings.Contains(body, "-32603") {
				t.Fatalf("result %s sse=%v: client got %d %s", result, sse, resp.StatusCode, body)
			}
			if !sse && resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if s := g.next(t); !errors.Is(s.err, ErrBadUpstreamResponse) || s.reported != 1 {
				t.Fatalf("served %+v", s)
			}
		}
	}
}

func listUpstream(t *testing.T, sse bool, id, result string) *httptest.Server {
	return fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		resp := `{"jsonrpc":"2.0","id":` + id + `,"result":` + result + `}`
		if !sse {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, resp)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: message\ndata: "+resp+"\n\n")
	})
}

// Every list Filter names trims its own method's answer, by its own key, in
// JSON and SSE answers, and leaves other methods' answers alone.
func TestProxyListFilters(t *testing.T) {
	hidden := func(key string) bool { return !strings.Contains(key, "secret") }
	cases := []struct {
		list           List
		result, want   string
		otherMethodRaw bool // a request of another method passes unfiltered
	}{
		{ResourcesList,
			`{"resources":[{"uri":"file:///docs/a","name":"a"},{"uri":"file:///secret/k","name":"k"},{"name":"no uri"},{"uri":"file:///docs/b","URI":"file:///secret/x"}],"nextCursor":"c"}`,
			`{"resources":[{"uri":"file:///docs/a","name":"a"}],"nextCursor":"c"}`, true},
		{ResourceTemplatesList,
			`{"resourceTemplates":[{"uriTemplate":"file:///docs/{n}","name":"d"},{"uriTemplate":"file:///secret/{n}","name":"s"},{"uri":"file:///docs/x"}]}`,
			`{"resourceTemplates":[{"uriTemplate":"file:///docs/{n}","name":"d"}]}`, true},
		{PromptsList,
			`{"prompts":[{"name":"summarize","arguments":[{"name":"secret"}]},{"name":"secret-plan"},{"name":"review","name":"secret"}]}`,
			`{"prompts":[{"name":"summarize","arguments":[{"name":"secret"}]}]}`, true},
		{ToolsList, `{"tools":[{"name":"a"},{"name":"secret"}]}`, `{"tools":[{"name":"a"}]}`, true},
	}
	for _, c := range cases {
		for _, sse := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/sse=%v", c.list.Method, sse), func(t *testing.T) {
				g, gs := newGateway(t, ProxyOptions{Upstream: listUpstream(t, sse, `7`, c.result).URL})
				g.filter = Filter{List: c.list, Allow: hidden}
				resp := post(t, gs.URL, `{"jsonrpc":"2.0","id":7,"method":"`+c.list.Method+`"}`, nil)
				body := readAll(t, resp)
				if sse {
					body = strings.TrimSuffix(strings.TrimPrefix(body, "event: message\ndata: "), "\n\n")
				}
				m, err := Parse([]byte(body))
				if err != nil || string(m.Result) != c.want {
					t.Fatalf("result %s (%v)\nwant   %s", body, err, c.want)
				}
				if s := g.next(t); s.err != nil || string(s.result) != c.want {
					t.Fatalf("served %+v", s)
				}
				// Another method's answer is relayed as is.
				other := `{"jsonrpc":"2.0","id":7,"method":"other/list"}`
				resp = post(t, gs.URL, other, nil)
				if body := readAll(t, resp); !strings.Contains(body, "secret") {
					t.Fatalf("other method filtered: %s", body)
				}
				g.next(t)
			})
		}
	}
}

func TestProxyListFilterUnfilterableFailsClosed(t *testing.T) {
	for _, result := range []string{`{"prompts":{"name":"secret"}}`, `{"prompts":[],"prompts":[{"name":"secret"}]}`, `{"prompts":[],"Prompts":[{"name":"secret"}]}`, `{"other":"secret"}`, `{"prompts":["secret"]}`} {
		for _, sse := range []bool{false, true} {
			g, gs := newGateway(t, ProxyOptions{Upstream: listUpstream(t, sse, `1`, result).URL})
			g.filter = Filter{List: PromptsList, Allow: func(string) bool { return true }}
			resp := post(t, gs.URL, `{"jsonrpc":"2.0","id":1,"method":"prompts/list"}`, nil)
			body := readAll(t, resp)
			if strings.Contains(body, "secret") || !strings.Contains(body, "-32603") {
				t.Fatalf("result %s sse=%v: client got %d %s", result, sse, resp.StatusCode, body)
			}
			if s := g.next(t); !errors.Is(s.err, ErrBadUpstreamResponse) {
				t.Fatalf("served %+v", s)
			}
		}
	}
}
