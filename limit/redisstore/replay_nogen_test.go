package redisstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
)

// TestReplayWithoutGenerationHeldBySeed: a replay (limit.Replay) of an op
// applied in a meter of no generation (Gen "": a meter an earlier version
// wrote, whose answers carry no generation id; enforce's journal keeps that
// "" as the replay's Gen) is still guarded by the seed: when the meter is
// re-created from a seed that holds the op's usage after, the replay is
// covered, as memstore (algo.MeterReplayed) answers. (The store used to
// send no guard for such a replay, and billed the op twice.)
func TestReplayWithoutGenerationHeldBySeed(t *testing.T) {
	_, c, s := startStore(t)
	scripts := newStoreOpts(t, c, &Options{Timeout: testTimeout, NoFunctions: true})
	ctx := ctxT(t)
	for name, st := range map[string]*Store{"functions": s, "scripts": scripts} {
		m := testMeter(fmt.Sprintf("replay-nogen-%s-%d", name, time.Now().UnixNano()), 0)
		m.Seed = limit.Usage{Charged: 10, Calls: 5}
		m.Op = limit.NewOp()
		m.Replay = &limit.Replay{Gen: "", After: limit.Usage{Charged: 9, Calls: 4}}
		r, err := st.Adjust(ctx, m, limit.Usage{Charged: 2, Calls: 1})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !r.Covered || r.Allowed || r.Usage != m.Seed {
			t.Errorf("%s: replay of no generation held by the seed: %+v; want covered, usage %+v (memstore's answer)", name, r, m.Seed)
		}
	}
}
