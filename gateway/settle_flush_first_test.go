package gateway

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
)

const settleGaveUp = "shutdown: cached calls still loading after their callers left; their cost corrections miss the final usage flush"

// While Close waits for a cached load whose caller left, the usage admitted
// so far is already in the durable store (flushed before the wait): a stop
// cut short during the wait (SIGKILL at the end of the pod's grace) loses
// that load's correction at most. The final flush then writes the
// correction.
func TestCloseFlushesBeforeWaitingForLoadsWhoseCallersLeft(t *testing.T) {
	logs := &logBuffer{}
	l := startLeftLoad(t, slog.New(slog.NewJSONHandler(logs, nil)))
	durable := func() limit.Usage {
		rec, _, err := l.st.Get(context.Background(), "acme", usage.Period(time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		return rec.Usage
	}
	// Wait (the load held) until the estimate is durable, or Close gave up
	// waiting for the load.
	for durable().Calls == 0 {
		select {
		case err := <-l.closed:
			t.Fatalf("Close returned (%v) with nothing flushed while the load was held", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if gaveUp := logs.records(t, settleGaveUp); len(gaveUp) > 0 {
		t.Fatalf("usage flushed only once Close gave up waiting for the load: %v", gaveUp)
	}
	if got, want := durable(), (limit.Usage{Charged: 1, Calls: 1}); got != want {
		t.Errorf("durable usage during the settle wait %+v, want the estimate %+v", got, want)
	}
	l.free()
	if err := <-l.closed; err != nil {
		t.Fatal(err)
	}
	if got, want := durable(), (limit.Usage{Charged: 500, Calls: 1}); got != want {
		t.Errorf("durable usage after Close %+v, want %+v: the reported cost of the call whose caller left", got, want)
	}
}
