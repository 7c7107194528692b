package federate_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/federate"
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
	in := bufio.NewReader(os.Stdin)
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
			result = `{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"chatty","version":"1"}}`
		case "tools/list":
			result = `{"tools":[{"name":"echo","inputSchema":{"type":"object"}}]}`
		case "tools/call":
			result = `{"content":[{"type":"text","text":"done"}]}`
		}
		fmt.Println(chatter[n%len(chatter)])
		fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":%s}`+"\n", m.ID, result)
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
