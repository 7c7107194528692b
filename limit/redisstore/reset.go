package redisstore

import (
	"cmp"
	"context"
	"errors"
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

// HeldCounters implements limit.CounterLister. On a Cluster every key of
// the prefix lives in its tenant's slot: the slot's owner (found as the
// detours find it, without waiting for a node that does not answer) lists
// that slot's keys (CLUSTER GETKEYSINSLOT, up to maxSlotKeys; past that it
// SCANs its keys), so a sick node elsewhere does not fail the listing.
// Standalone, it is SCAN MATCH prefix* over the server's keys. It is
// bounded by ctx alone, not by Options.Timeout: an operator's tool, not a
// hot path. Errors: limit.ErrNotCounter (nothing sent), ctx's error or the
// node's.
func (s *Store) HeldCounters(ctx context.Context, prefix string) ([]string, error) {
	if !keyspace.IsCounterPrefix(prefix) {
		return nil, fmt.Errorf("redisstore: held counters: %w prefix: %q", limit.ErrNotCounter, prefix)
	}
	if !s.cluster {
		return s.scanHeld(ctx, s.client, prefix)
	}
	slot := keyspace.Slot(prefix)
	o, ok := s.owners(ctx, []uint16{slot})[slot]
	if !ok {
		return nil, fmt.Errorf("redisstore: held counters: no node owns slot %d (%w)", slot, cmp.Or(ctx.Err(), errNoOwner))
	}
	c := o.client
	n, err := c.Do(ctx, c.B().ClusterCountkeysinslot().Slot(int64(slot)).Build()).AsInt64()
	if err != nil {
		return nil, fmt.Errorf("redisstore: held counters: %w", err)
	}
	if n > maxSlotKeys {
		return s.scanHeld(ctx, c, prefix)
	}
	keys, err := c.Do(ctx, c.B().ClusterGetkeysinslot().Slot(int64(slot)).Count(max(n, 1)).Build()).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("redisstore: held counters: %w", err)
	}
	out := keys[:0]
	for _, k := range keys {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out, nil
}

// maxSlotKeys bounds the keys HeldCounters reads of a Cluster slot in one
// reply; a slot holding more is SCANned.
const maxSlotKeys = 100_000

// errNoOwner means no node claimed the slot (a failover in progress).
var errNoOwner = errors.New("no owner")

// scanHeld SCANs c's keys for those under prefix.
func (s *Store) scanHeld(ctx context.Context, c rueidis.Client, prefix string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for cursor := uint64(0); ; {
		e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(globEscape(prefix)+"*").Count(heldScanCount).Build()).AsScanEntry()
		if err != nil {
			return nil, fmt.Errorf("redisstore: held counters: %w", err)
		}
		for _, k := range e.Elements {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
		if cursor = e.Cursor; cursor == 0 {
			return out, nil
		}
	}
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
