package memstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/mcpgate/mcpgate/keyspace"
	"github.com/mcpgate/mcpgate/limit"
)

// Reset implements limit.Resetter: the counters named by keys are deleted
// (usage meters and breakers live apart and are never touched). It reports
// how many keys held a live counter. Errors: ctx.Err(), limit.ErrNotCounter
// (nothing deleted).
func (s *Store) Reset(ctx context.Context, keys []string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	for _, k := range keys {
		if !keyspace.IsCounter(k) {
			return 0, fmt.Errorf("%w: %q", limit.ErrNotCounter, k)
		}
	}
	c := s.c
	n := 0
	for _, k := range keys {
		sh := &c.shards[c.shardOf(k)]
		sh.mu.Lock()
		if st := sh.get(k, sh.at(c.now())); st != nil {
			if st.Used {
				n++
			}
			delete(sh.m, k)
		}
		sh.mu.Unlock()
	}
	return n, nil
}

// HeldCounters implements limit.CounterLister: the keys under prefix of the
// live counters, found by walking every shard (each under its lock, one at
// a time). Errors: ctx.Err(), limit.ErrNotCounter.
func (s *Store) HeldCounters(ctx context.Context, prefix string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !keyspace.IsCounterPrefix(prefix) {
		return nil, fmt.Errorf("%w prefix: %q", limit.ErrNotCounter, prefix)
	}
	c := s.c
	var out []string
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		now := sh.at(c.now())
		for k := range sh.m {
			if strings.HasPrefix(k, prefix) {
				if st := sh.get(k, now); st != nil && st.Used {
					out = append(out, k)
				}
			}
		}
		sh.mu.Unlock()
	}
	return out, nil
}

var _ limit.CounterLister = (*Store)(nil)
