package federate_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/clip"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// chattyEnv makes the test binary a bare stdio JSON-RPC server
// (serveChatty) that writes a line of its own to stdout before every
// answer, as servers printing a banner or debug output there do.
const chattyEnv = "FEDERATE_TEST_CHATTY_SERVER"

// chatter is what serveChatty prints before each answer: log lines (plain,
// "[INFO]"-prefixed, a JSON logger's), an empty line, a line of spaces.
var chatter = []string{"handling a request...", "[INFO] handling a request", `{"level":30,"msg":"handling a request"}`, "", "   "}

func serveChatty() {
	serveBare("chatty", `{"tools":{}}`, func(out io.Writer, n int, _ string) {
		fmt.Fprintln(out, chatter[n%len(chatter)])
	})
}

// serveBare makes the test binary a bare stdio JSON-RPC server named name,
// with capabilities caps, serving the tool echo (answering "done"): it
// answers each request read from stdin (and ignores other lines) on
// stdout, after what before writes there (n counts the lines read from 0,
// method is the request's), until stdin ends.
func serveBare(name, caps string, before func(out io.Writer, n int, method string)) {
	in := bufio.NewReader(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	for n := 0; ; n++ {
		line, err := in.ReadBytes('\n')
		if err != nil {
			return
		}
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(line, &m) != nil || m.ID == nil {
			continue
		}
		result := `{}`
		switch m.Method {
		case "initialize":
			result = `{"protocolVersion":"2025-11-25","capabilities":` + caps + `,"serverInfo":{"name":"` + name + `","version":"1"}}`
		case "tools/list":
			result = `{"tools":[{"name":"echo","inputSchema":{"type":"object"}}]}`
		case "tools/call":
			result = `{"content":[{"type":"text","text":"done"}]}`
		}
		before(out, n, m.Method)
		fmt.Fprintf(out, `{"jsonrpc":"2.0","id":%s,"result":%s}`+"\n", m.ID, result)
		out.Flush()
	}
}

// A stdio server that prints lines of its own on stdout (a banner, debug
// output, blank lines) keeps its session: such lines are skipped and
// logged, as the TypeScript SDK's client skips them. The Go SDK's client
// ends the session at the first one, failing the calls in flight of every
// tenant sharing the process and restarting it.
func TestStdioServerPrintingNonJSONKeepsItsSession(t *testing.T) {
	logs := &testenv.SyncBuffer{}
	f, err := federate.New(context.Background(), federate.Options{
		Logger:    slog.New(slog.NewTextHandler(logs, nil)),
		Upstreams: []federate.Upstream{{Name: "c", Command: stdioCommand(t), Env: map[string]string{chattyEnv: "1"}, Prefix: "c__", Timeout: 10 * time.Second}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeWithin(t, f, 20*time.Second) })
	ts := httptest.NewServer(f.Handler())
	t.Cleanup(ts.Close)
	cs := connect(t, ts.URL, newClient("test-client", nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 6 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "c__echo", Arguments: map[string]any{}})
		if err != nil || res.IsError || testenv.ToolText(res) != "done" {
			t.Fatalf("call %d: %v %+v", i, err, res)
		}
	}
	if h := f.Health()[0]; h.Restarts != 0 {
		t.Errorf("health = %+v, want no restart", h)
	}
	if !strings.Contains(logs.String(), "handling a request...") {
		t.Errorf("the skipped line was not logged:\n%s", logs.String())
	}
}

// jsonNoiseEnv makes the test binary a bare stdio JSON-RPC server
// (serveJSONNoise) that prints a line of JSON that is no JSON-RPC message
// to stdout before every answer to tools/call; the variable's value picks
// the line (see jsonNoiseLine).
const jsonNoiseEnv = "FEDERATE_TEST_JSON_NOISE_SERVER"

func init() {
	if kind := os.Getenv(jsonNoiseEnv); kind != "" {
		serveJSONNoise(kind)
		os.Exit(0)
	}
}

// jsonNoiseKinds are the lines serveJSONNoise may print.
var jsonNoiseKinds = []string{"array", "empty-array", "mixed-batch", "no-message", "big-json-log"}

func jsonNoiseLine(kind string) string {
	switch kind {
	case "array":
		return `["server ready"]` // console.log(JSON.stringify(["server ready"]))
	case "empty-array":
		return `[]`
	case "mixed-batch":
		return `[{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}},"ready"]`
	case "no-message":
		return `{"jsonrpc":"2.0"}`
	case "big-json-log":
		// a JSON logger's (pino) line, longer than jsonLines' 64 KiB buffer
		return `{"level":30,"msg":"request","body":"` + strings.Repeat("x", 70<<10) + `"}`
	}
	panic("unknown kind " + kind)
}

func serveJSONNoise(kind string) {
	serveBare("noisy", `{"tools":{}}`, func(out io.Writer, _ int, method string) {
		if method == "tools/call" {
			fmt.Fprintln(out, jsonNoiseLine(kind))
		}
	})
}

// A stdout line of JSON that is no JSON-RPC message (an array that is no
// batch of messages, an object with no id or method, a JSON logger's line
// longer than jsonLines' buffer) is logged and skipped like any other
// noise: passed to the SDK it would end the shared session, failing every
// tenant's calls in flight, and restart the process.
func TestStdioNonMessageJSONLineKeepsTheSession(t *testing.T) {
	for _, kind := range jsonNoiseKinds {
		t.Run(kind, func(t *testing.T) {
			logs := &testenv.SyncBuffer{}
			f, err := federate.New(context.Background(), federate.Options{
				Logger:    slog.New(slog.NewTextHandler(logs, nil)),
				Upstreams: []federate.Upstream{{Name: "c", Command: stdioCommand(t), Env: map[string]string{jsonNoiseEnv: kind}, Prefix: "c__", Timeout: 10 * time.Second}},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { closeWithin(t, f, 20*time.Second) })
			ts := httptest.NewServer(f.Handler())
			t.Cleanup(ts.Close)
			cs := connect(t, ts.URL, newClient("test-client", nil))
			for i := range 3 {
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "c__echo", Arguments: map[string]any{}})
				if err != nil || res.IsError || testenv.ToolText(res) != "done" {
					t.Fatalf("call %d: err=%v res=%+v (health %+v)", i, err, res, f.Health())
				}
			}
			if h := f.Health()[0]; h.Restarts != 0 {
				t.Errorf("health = %+v, want no restart", h)
			}
			if n := strings.Count(logs.String(), "is not a message"); n != 3 {
				t.Errorf("%d skipped lines logged, want 3:\n%s", n, clip.String(logs.String(), 4096))
			}
		})
	}
}
