package redisstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// Reset implements limit.Resetter: one DEL per key, sent together (each
// routed to its key's node in Cluster mode; no SCAN), bounded by
// Options.Timeout. Usage meters and breakers have other keys and are never
// touched. It reports how many keys existed. Errors: limit.ErrNotCounter
// (nothing sent), context.DeadlineExceeded or the client's error (some keys
// may have been deleted).
func (s *Store) Reset(ctx context.Context, keys []string) (int, error) {
	wrap := func(err error) error { return fmt.Errorf("redisstore: reset: %w", err) }
	for _, k := range keys {
		if !keyspace.IsCounter(k) {
			return 0, wrap(fmt.Errorf("%w: %q", limit.ErrNotCounter, k))
		}
	}
	if len(keys) == 0 {
		return 0, nil
	}
	ctx, cancel := s.deadline(ctx)
	defer cancel()
	cmds := make([]rueidis.Completed, len(keys))
	for i, k := range keys {
		cmds[i] = s.client.B().Del().Key(k).Build()
	}
	n := 0
	for _, r := range s.client.DoMulti(ctx, cmds...) {
		d, err := r.AsInt64()
		if err != nil {
			return n, wrap(err)
		}
		n += int(d)
	}
	return n, nil
}

var (
	_ limit.Resetter      = (*Store)(nil)
	_ limit.CounterLister = (*Store)(nil)
)

// heldScanCount is the COUNT hint of HeldCounters' SCAN: keys examined
// per round trip.
const heldScanCount = 1000

// HeldCounters implements limit.CounterLister with SCAN MATCH prefix* on
// the Redis, or on every master of a Cluster (as ScanMeters does; a key
// seen twice across a failover or a slot migration is listed once). A
// Cluster's tenant slot is not read on its owner alone: while the slot
// migrates, some of its keys are on another node already. It is bounded
// by ctx alone, not by Options.Timeout (a scan takes one round trip per
// heldScanCount keys a node holds), and examines every key of each
// master: an operator's tool, not a hot path. A master that does not
// answer fails it. Errors: limit.ErrNotCounter (nothing sent), ctx's
// error or the first failing node's.
func (s *Store) HeldCounters(ctx context.Context, prefix string) ([]string, error) {
	if !keyspace.IsCounterPrefix(prefix) {
		return nil, fmt.Errorf("redisstore: held counters: %w prefix: %q", limit.ErrNotCounter, prefix)
	}
	seen := map[string]bool{}
	var out []string
	err := s.scanMasters(ctx, globEscape(prefix)+"*", heldScanCount, "held counters", func(keys []string) error {
		for _, k := range keys {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// globEscape escapes the bytes a Redis glob pattern gives a meaning to.
// keyspace never puts them in a key (escaped components are [A-Za-z0-9._@-%~]),
// so this only guards against a layout change.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
