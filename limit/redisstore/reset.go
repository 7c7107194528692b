package redisstore

import (
	"context"
	"fmt"

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
