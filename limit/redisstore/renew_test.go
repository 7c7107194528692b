package redisstore

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit/limittest"
)

func TestRenew(t *testing.T) {
	c := testenv.StartRedis(t, nil).Client(t)
	limittest.RunRenew(t, func(t *testing.T) limittest.Harness {
		s, err := New(c, &Options{Timeout: testTimeout})
		if err != nil {
			t.Fatal(err)
		}
		return limittest.Harness{Store: s, Advance: func(d time.Duration) { s.offset.Add(d.Microseconds()) }}
	})
}
