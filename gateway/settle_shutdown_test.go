package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
)

// A cached call whose caller left is settled when its load ends, on the
// load's result (the tool ran for that call: leaving must not cut its bill
// to the estimate), and that may be during the shutdown: Close waits for
// it before the final flush, so the cost the result reports is billed.
func TestShutdownWaitsForLoadsWhoseCallersLeft(t *testing.T) {
	l := startLeftLoad(t, nil)
	time.Sleep(100 * time.Millisecond) // Close is under way before the load ends
	l.free()
	select {
	case err := <-l.closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(maxSettleWait):
		t.Fatal("Close did not return")
	}
	rec, _, err := l.st.Get(context.Background(), "acme", usage.Period(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if want := (limit.Usage{Charged: 500, Calls: 1}); rec.Usage != want {
		t.Errorf("durable usage %+v, want %+v: the reported cost of the call whose caller left", rec.Usage, want)
	}
}
