package memstore_test

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit/limittest"
	"github.com/mcpgate/mcpgate/limit/memstore"
)

func TestRenew(t *testing.T) {
	limittest.RunRenew(t, func(t *testing.T) limittest.Harness {
		clk := limittest.NewFakeClock(time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC))
		s, err := memstore.New(&memstore.Options{Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return limittest.Harness{Store: s, Advance: clk.Advance, Now: clk.Now}
	})
}
