package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/examples/upstream"
)

// teeWriter keeps a copy of what the upstream answers a GET.
type teeWriter struct {
	http.ResponseWriter
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (w teeWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	w.buf.Write(b)
	w.mu.Unlock()
	return w.ResponseWriter.Write(b)
}

func (w teeWriter) Flush()                      { w.ResponseWriter.(http.Flusher).Flush() }
func (w teeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// The reviewer's scenario, against the real go-sdk upstream with an event
// store: a caller holding only some scopes POSTs a list and gets it
// filtered, then resumes that stream with GET and Last-Event-ID. The
// upstream replays the answer it stored, unfiltered; the caller must get it
// filtered again.
// Not parallel: see TestResourceAndPromptScopes.
func TestResumedStreamReplaysFilteredLists(t *testing.T) {
	up := upstream.New(nil)
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return up.MCPServer() },
		&sdk.StreamableHTTPOptions{EventStore: sdk.NewMemoryEventStore(nil)})
	var mu sync.Mutex
	var replayed bytes.Buffer // every GET answer of the upstream
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			w = teeWriter{w, &mu, &replayed}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(us.Close)
	e := newEnv(t, setup{UpstreamURL: us.URL + "/mcp"})
	tok := sign(t, claims("acme", "alice", "tools:echo resources:file:///docs/* prompts:summarize"))

	const protocol = "2025-11-25" // event ids and a priming event: resumable streams
	hdr := http.Header{"Mcp-Protocol-Version": {protocol}}
	init := post(t, e.mcpURL(0), tok, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"`+protocol+`","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`, hdr)
	session := init.Header.Get("Mcp-Session-Id")
	if init.Status != http.StatusOK || session == "" {
		t.Fatalf("initialize: %d %s", init.Status, init.Body)
	}
	hdr.Set("Mcp-Session-Id", session)
	if r := post(t, e.mcpURL(0), tok, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, hdr); r.Status != http.StatusAccepted {
		t.Fatalf("initialized: %d %s", r.Status, r.Body)
	}

	cases := []struct {
		method, member, key string
		want                []string
		hidden              string // listed by the upstream, outside the scopes
	}{
		{"tools/list", "tools", "name", []string{"echo"}, "search"},
		{"resources/list", "resources", "uri", []string{"file:///docs/guide.md", "file:///docs/readme.md"}, "file:///secret/keys.txt"},
		{"resources/templates/list", "resourceTemplates", "uriTemplate", []string{"file:///docs/{name}"}, "file:///secret/{name}"},
		{"prompts/list", "prompts", "name", []string{"summarize"}, "internal_plan"},
	}
	for i, c := range cases {
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": i + 1, "method": c.method})
		r := post(t, e.mcpURL(0), tok, string(body), hdr)
		if got := listedKeys(t, r, c.member, c.key); !slices.Equal(got, c.want) {
			t.Fatalf("POST %s listed %q, want %q", c.method, got, c.want)
		}
		prime := firstEventID(t, r.Body)

		mu.Lock()
		replayed.Reset()
		mu.Unlock()
		req, _ := http.NewRequest(http.MethodGet, e.mcpURL(0), nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", protocol)
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("Last-Event-ID", prime)
		g, err := do(req)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		upstreamSent := replayed.String()
		mu.Unlock()
		if !strings.Contains(upstreamSent, c.hidden) {
			t.Fatalf("%s: the upstream did not replay its unfiltered answer (the test proves nothing): %q", c.method, upstreamSent)
		}
		if got := listedKeys(t, g, c.member, c.key); !slices.Equal(got, c.want) || strings.Contains(string(g.Body), c.hidden) {
			t.Fatalf("GET Last-Event-ID %s after %s: listed %q, want %q\n%s", prime, c.method, got, c.want, g.Body)
		}
	}
}

// listedKeys returns the key of every entry of the list member of r's
// JSON-RPC result.
func listedKeys(t *testing.T, r *response, member, key string) []string {
	t.Helper()
	var res map[string]json.RawMessage
	var entries []map[string]any
	if r.Status != http.StatusOK || json.Unmarshal(r.Msg.Result, &res) != nil || json.Unmarshal(res[member], &entries) != nil {
		t.Fatalf("no %s result: %d %s", member, r.Status, r.Body)
	}
	var keys []string
	for _, entry := range entries {
		s, _ := entry[key].(string)
		keys = append(keys, s)
	}
	slices.Sort(keys)
	return keys
}

// firstEventID returns the id of the first event of an SSE body that has
// one: the priming event, which precedes the answer.
func firstEventID(t *testing.T, body []byte) string {
	t.Helper()
	for _, ev := range parseEvents(body) {
		for _, line := range strings.Split(ev.raw, "\n") {
			if id, ok := strings.CutPrefix(line, "id: "); ok && id != "" {
				return id
			}
		}
	}
	t.Fatalf("no event id in %s", body)
	return ""
}
