//lint:file-ignore SA1019 logging is deprecated in MCP 2026-07-28 but still served; the federation relays it.
package federate

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// recordingHandler keeps the records it is given.
type recordingHandler struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

// The log messages of a shared session are logged up to stderrPerSecond a
// window; the first one logged after the drops says how many there were.
func TestRelayLogOfASharedSessionIsBudgeted(t *testing.T) {
	h := &recordingHandler{}
	f := &Federator{log: slog.New(h)}
	up := &upstream{cfg: Upstream{Name: "s"}}
	var budget lineBudget
	p := &mcp.LoggingMessageParams{Level: "error", Data: "x"}
	for range stderrPerSecond + 3 {
		f.relayLog(nil, nil, up, p, &budget)
	}
	if len(h.recs) != stderrPerSecond {
		t.Fatalf("%d records of %d messages in one window; want %d", len(h.recs), stderrPerSecond+3, stderrPerSecond)
	}
	budget.window = time.Time{} // the window is over
	f.relayLog(nil, nil, up, p, &budget)
	if len(h.recs) != stderrPerSecond+1 {
		t.Fatalf("the message after the window was not logged")
	}
	var dropped int64
	h.recs[len(h.recs)-1].Attrs(func(a slog.Attr) bool {
		if a.Key == "dropped_before" {
			dropped = a.Value.Int64()
		}
		return true
	})
	if dropped != 3 {
		t.Errorf("dropped_before = %d; want 3", dropped)
	}
}
