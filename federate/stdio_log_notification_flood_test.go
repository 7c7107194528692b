package federate_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/federate"
	"github.com/mcpgate/mcpgate/internal/testenv"
)

// logFloodEnv makes the test binary a bare stdio server that, for each
// tools/call, writes logFloodLines notifications/message to stdout before
// its answer (a server logging in a loop through MCP rather than stderr).
const logFloodEnv = "FEDERATE_TEST_LOG_FLOOD_SERVER"

const logFloodLines = 20000

func init() {
	if os.Getenv(logFloodEnv) == "" {
		return
	}
	serveBare("flood", `{"tools":{},"logging":{}}`, func(out io.Writer, _ int, method string) {
		if method == "tools/call" {
			for i := range logFloodLines {
				fmt.Fprintf(out, `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"error","data":"flood %d"}}`+"\n", i)
			}
		}
	})
	os.Exit(0)
}

// countingHandler counts the records whose message is msg.
type countingHandler struct {
	msg string
	n   atomic.Int64
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.n.Add(1)
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

// A stdio server's MCP log messages (notifications/message on the shared
// session, which go to the gateway's log: relayLog) are bounded as its
// stderr is (stderrPerSecond, 1000 lines a second, "so that a server
// logging in a loop cannot flood the log"): of 20,000 written in one burst,
// fewer than all become gateway log records. (Once, they had no bound at
// all: every one became a record, at error level.)
func TestStdioLogNotificationFloodIsBounded(t *testing.T) {
	h := &countingHandler{msg: "upstream log message"}
	_, url := serve(t, federate.Options{
		Logger: slog.New(h),
		Upstreams: []federate.Upstream{
			{Name: "l", Command: stdioCommand(t), Env: map[string]string{logFloodEnv: "1"}, Prefix: "l__", Timeout: time.Minute},
		},
	})
	cs := connect(t, url, newClient("tenant", nil))
	if got, isErr := callText(t, cs, "l__echo", nil); got != "done" || isErr {
		t.Fatalf("l__echo = %q (isError %v)", got, isErr)
	}
	// The answer waits for the notifications read before it (wireCount);
	// let the rest, if any, be handled.
	testenv.Eventually(t, 30*time.Second, "the log messages to be handled", func() bool {
		n := h.n.Load()
		time.Sleep(200 * time.Millisecond)
		return h.n.Load() == n
	})
	if n := h.n.Load(); n >= logFloodLines {
		t.Errorf("%d of the stdio server's %d log notifications written in one burst became gateway log records: no bound (stderr has %d a second)", n, logFloodLines, 1000)
	}
}
