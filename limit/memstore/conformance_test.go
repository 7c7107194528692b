package memstore_test

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit/limittest"
	"github.com/mcpgate/mcpgate/limit/memstore"
)

// TestConformance holds the memory store to the suite every store passes.
// Each subtest gets its own store on a fake clock that moves only when the
// suite advances it, so every duration is checked to the microsecond.
func TestConformance(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		limittest.RunConformance(t, func(t *testing.T) limittest.Harness {
			clk := limittest.NewFakeClock(time.Date(2025, 3, 14, 15, 9, 26, 535897000, time.UTC))
			s, err := memstore.New(&memstore.Options{Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return limittest.Harness{
				Store:   s,
				Advance: clk.Advance,
				Now:     clk.Now,
				TTLs: func(t *testing.T) map[string]time.Duration {
					// Expired counters are dropped by Sweep (or when next
					// touched); what remains must be live.
					s.Sweep()
					out := map[string]time.Duration{}
					for _, k := range s.Keys() {
						ttl, ok := s.TTL(k)
						if !ok {
							ttl = 0 // held, but not a live counter: the suite reports it
						}
						out[k] = ttl
					}
					return out
				},
			}
		})
	})
}
