package mcp

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// replayScopes hides every entry whose key mentions "secret", in all four
// lists, as the gateway's ReplayFilters do for a caller's scopes.
func replayScopes() []Filter {
	allow := func(key string) bool { return !strings.Contains(key, "secret") }
	return []Filter{
		{List: ToolsList, Allow: allow},
		{List: ResourcesList, Allow: allow},
		{List: ResourceTemplatesList, Allow: allow},
		{List: PromptsList, Allow: allow},
	}
}

// replayEvent is one event of a replayed stream and what the client must
// get for it ("" when it must be dropped).
type replayEvent struct{ sent, want string }

func msgEvent(id, data string) string {
	return "id: " + id + "\nevent: message\ndata: " + data + "\n\n"
}

// replayedStream is what an upstream with an event store sends a GET with
// Last-Event-ID: a priming event, earlier POSTs' answers as first written
// (unfiltered), and notifications.
var replayedStream = []replayEvent{
	{"id: s1_0\nevent: prime\n\n", "id: s1_0\nevent: prime\n\n"},
	{ // the tools/list answer the caller got filtered on its POST
		msgEvent("s1_1", `{"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"echo"},{"name":"secret_admin"}],"nextCursor":"n"}}`),
		msgEvent("s1_1", `{"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"echo"}],"nextCursor":"n"}}`),
	},
	{ // notifications pass byte for byte, even when they mention results
		msgEvent("s1_2", `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"secret"}}`),
		msgEvent("s1_2", `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"secret"}}`),
	},
	{
		msgEvent("s1_3", `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1,"message":"\u0073ecret","result":{"tools":["secret"]}}}`),
		msgEvent("s1_3", `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1,"message":"\u0073ecret","result":{"tools":["secret"]}}}`),
	},
	{ // a list that cannot be filtered is dropped
		msgEvent("s1_4", `{"jsonrpc":"2.0","id":4,"result":{"tools":{"name":"secret_admin"}}}`), "",
	},
	{ // and so is a case twin beside the real member, which a client may read instead
		msgEvent("s1_5", `{"jsonrpc":"2.0","id":5,"result":{"tools":[],"TOOLS":[{"name":"secret_admin"}]}}`), "",
	},
	{ // a response Parse refuses may still be read by the client: dropped
		msgEvent("s1_6", `{"jsonrpc":"2.0","id":6,"Result":{"tools":[{"name":"secret_admin"}]}}`), "",
	},
	{ // an escaped member name is still the result, and the other lists are filtered too
		msgEvent("s1_7", `{"jsonrpc":"2.0","id":7,"r\u0065sult":{"prompts":[{"name":"secret_plan"},{"name":"review"}]}}`),
		msgEvent("s1_7", `{"jsonrpc":"2.0","id":7,"result":{"prompts":[{"name":"review"}]}}`),
	},
	{
		msgEvent("s1_8", `{"jsonrpc":"2.0","id":8,"result":{"resources":[{"uri":"file:///secret/k"},{"uri":"file:///docs/a"}],"resourceTemplates":[{"uriTemplate":"file:///secret/{n}"}]}}`),
		msgEvent("s1_8", `{"jsonrpc":"2.0","id":8,"result":{"resources":[{"uri":"file:///docs/a"}],"resourceTemplates":[]}}`),
	},
	{ // results that are not lists, and errors, pass unchanged
		msgEvent("s1_9", `{"jsonrpc":"2.0","id":9,"result":{"content":[{"type":"text","text":"secret"}]}}`),
		msgEvent("s1_9", `{"jsonrpc":"2.0","id":9,"result":{"content":[{"type":"text","text":"secret"}]}}`),
	},
	{
		msgEvent("s1_10", `{"jsonrpc":"2.0","id":10,"error":{"code":-1,"message":"secret"}}`),
		msgEvent("s1_10", `{"jsonrpc":"2.0","id":10,"error":{"code":-1,"message":"secret"}}`),
	},
}

func replayUpstream(t *testing.T) string {
	return fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range replayedStream {
			io.WriteString(w, ev.sent)
		}
	}).URL
}

func getStream(t *testing.T, url string, header http.Header) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", "s")
	req.Header.Set("Last-Event-ID", "s1_0")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return readAll(t, resp)
}

// A resumed GET stream replays earlier answers as the upstream stored them:
// with ReplayFilters, list answers reach the client filtered, unfilterable
// ones not at all, and everything else unchanged.
func TestProxyReplayFilters(t *testing.T) {
	var want, sent strings.Builder
	for _, ev := range replayedStream {
		want.WriteString(ev.want)
		sent.WriteString(ev.sent)
	}
	g, gs := newGateway(t, ProxyOptions{Upstream: replayUpstream(t)})
	g.replay = replayScopes()
	if got := getStream(t, gs.URL, nil); got != want.String() {
		t.Fatalf("client got\n%s\nwant\n%s", got, want.String())
	}
	if s := g.next(t); s.status != 200 || s.err != nil {
		t.Fatalf("served %+v", s)
	}

	// Without ReplayFilters the stream is relayed as is: the upstream
	// really replays the hidden entries.
	g.replay = nil
	if got := getStream(t, gs.URL, nil); got != sent.String() {
		t.Fatalf("unfiltered relay changed the stream:\n%s", got)
	}
	g.next(t)
}

// A filtered replayed list is marked private under caching hints, as a
// filtered POST answer is.
func TestProxyReplayFiltersPrivate(t *testing.T) {
	g, gs := newGateway(t, ProxyOptions{Upstream: replayUpstream(t)})
	g.replay = replayScopes()
	got := getStream(t, gs.URL, http.Header{"Mcp-Protocol-Version": {CachingHintsVersion}})
	want := msgEvent("s1_1", `{"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"echo"}],"nextCursor":"n","cacheScope":"private"}}`)
	if !strings.Contains(got, want) || strings.Contains(got, "secret_admin") {
		t.Fatalf("client got\n%s", got)
	}
	g.next(t)
	if got := replayScopes(); got[0].Private {
		t.Fatal("Serve modified the caller's filters")
	}
}

// On a POST's stream, a response that is not the answer to the request is
// screened too; the answer itself is relayed and reported as before.
func TestProxyReplayFiltersOnPostStream(t *testing.T) {
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		writeEvent(w, `{"jsonrpc":"2.0","id":99,"result":{"tools":[{"name":"secret_admin"},{"name":"echo"}]}}`)
		writeEvent(w, `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"hi"}]}}`)
	})
	g, gs := newGateway(t, ProxyOptions{Upstream: up.URL})
	g.replay = replayScopes()
	body := readAll(t, post(t, gs.URL, callEcho, nil))
	want := "event: message\ndata: " + `{"jsonrpc":"2.0","id":99,"result":{"tools":[{"name":"echo"}]}}` + "\n\n" +
		"event: message\ndata: " + `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"hi"}]}}` + "\n\n"
	if body != want {
		t.Fatalf("client got\n%s", body)
	}
	if s := g.next(t); s.err != nil || s.reported != 1 || !strings.Contains(string(s.result), "hi") {
		t.Fatalf("served %+v", s)
	}
}

func TestMayHoldResult(t *testing.T) {
	for data, want := range map[string]bool{
		`{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"x"}}`: false,
		`{"jsonrpc":"2.0","id":1,"result":{}}`:                                     true,
		`{"jsonrpc":"2.0","id":1,"RESULT":{}}`:                                     true,
		`{"jsonrpc":"2.0","id":1,"r\u0065sult":{}}`:                                true,
		`{"jsonrpc":"2.0","method":"m","params":{"results":1}}`:                    false,
		`"result`:  false,
		`"result"`: true,
		``:         false,
	} {
		if got := mayHoldResult([]byte(data)); got != want {
			t.Errorf("mayHoldResult(%s) = %v, want %v", data, got, want)
		}
	}
}

// The request's own Filter screens the other responses of its stream even
// when ReplayFilters name its list with a nil Allow (ignored): such an
// entry must not stand in for the Filter.
func TestReplayListKeepsFilterBesideNilAllow(t *testing.T) {
	allow := func(name string) bool { return name != "secret_admin" }
	x := &Exchange{f: Forward{
		Filter:        Filter{List: ToolsList, Allow: allow},
		ReplayFilters: []Filter{{List: ToolsList}, {List: PromptsList}},
	}}
	got := x.replayList()
	if len(got) != 1 || got[0].List != ToolsList || got[0].Allow == nil {
		t.Fatalf("replayList() = %+v, want the request's Filter alone", got)
	}
	resp, err := x.screened([]byte(`{"jsonrpc":"2.0","id":9,"result":{"tools":[{"name":"secret_admin"},{"name":"echo"}]}}`), nil, nil)
	if err != nil || strings.Contains(string(resp), "secret_admin") || !strings.Contains(string(resp), "echo") {
		t.Fatalf("screened = %s, %v", resp, err)
	}
}

// A DELETE's answer carries nothing MCP reads: with ReplayFilters, a body
// that could hold a result (a list, or a shape the proxy cannot read) is
// dropped and the status kept, so that the session's end is not refused;
// any other body passes.
func TestDeleteAnswerBodyScreened(t *testing.T) {
	for _, c := range []struct{ name, body, want string }{
		{"list", `{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"secret_admin"}]}}`, ""},
		{"not JSON-RPC", `{"result":"ok"}`, ""},
		{"plain", `session ended`, `session ended`},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, c.body)
			})
			g, gs := newGateway(t, ProxyOptions{Upstream: up.URL})
			g.replay = replayScopes()
			req, _ := http.NewRequest(http.MethodDelete, gs.URL, nil)
			req.Header.Set("Mcp-Session-Id", "s")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body := readAll(t, resp)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || body != c.want {
				t.Fatalf("DELETE answered %d %q, want 200 %q", resp.StatusCode, body, c.want)
			}
			if s := g.next(t); s.status != http.StatusOK || s.err != nil {
				t.Fatalf("served %+v", s)
			}
		})
	}
}
