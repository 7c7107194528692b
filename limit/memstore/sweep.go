package memstore

import (
	"maps"
	"time"
)

// shrinkMin is the size below which a shard's map is never rebuilt: small
// maps cost little, and rebuilding one is itself an allocation.
const shrinkMin = 1024

// Sweep drops every expired counter now. The background sweeper calls it
// every SweepInterval; call it directly to bound memory at a moment of your
// choosing. It locks one shard at a time, so it delays calls on that shard
// only for the time of scanning it.
func (s *Store) Sweep() { s.c.sweep() }

func (c *core) sweep() {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		now := sh.at(c.now())
		for k, st := range sh.m {
			if st.ExpiresAt <= now || !st.Used {
				delete(sh.m, k)
			}
		}
		for k, mt := range sh.meters {
			if mt.ExpiresAt <= now {
				delete(sh.meters, k)
			}
		}
		for k, o := range sh.ops {
			if o.exp <= now {
				delete(sh.ops, k)
			}
		}
		if sh.br != nil {
			for k, b := range sh.br.states {
				if b.ExpiresAt <= now {
					delete(sh.br.states, k)
				}
			}
			for k, n := range sh.br.calls {
				if n.ExpiresAt <= now {
					delete(sh.br.calls, k)
				}
			}
		}
		// A Go map keeps the memory of its largest size: rebuild one that
		// has emptied far below its peak, so a burst of keys is not kept
		// forever.
		if sh.peak >= shrinkMin && len(sh.m) <= sh.peak/4 {
			m := make(map[string]*counter, len(sh.m))
			maps.Copy(m, sh.m)
			sh.m, sh.peak = m, len(m)
		}
		sh.mu.Unlock()
	}
}

// Len returns the number of counters, usage meters, breakers and
// identical-calls counters held, including
// expired ones that neither Sweep nor a later call has dropped yet.
func (s *Store) Len() int {
	n := 0
	for i := range s.c.shards {
		sh := &s.c.shards[i]
		sh.mu.Lock()
		n += len(sh.m) + len(sh.meters)
		if sh.br != nil {
			n += len(sh.br.states) + len(sh.br.calls)
		}
		sh.mu.Unlock()
	}
	return n
}

// Keys returns the keys Len counts, in no particular order.
func (s *Store) Keys() []string {
	var keys []string
	for i := range s.c.shards {
		sh := &s.c.shards[i]
		sh.mu.Lock()
		for k := range sh.m {
			keys = append(keys, k)
		}
		for k := range sh.meters {
			keys = append(keys, k)
		}
		if sh.br != nil {
			for k := range sh.br.states {
				keys = append(keys, k)
			}
			for k := range sh.br.calls {
				keys = append(keys, k)
			}
		}
		sh.mu.Unlock()
	}
	return keys
}

// TTL returns the time until key's counter expires (after which it is the
// same as a fresh one), key's usage meter is dropped (its Meter.ExpireAt),
// or key's breaker state or identical-calls counter is dropped, and false
// when the store holds none of them live for key. It is
// what the Redis store sets as the key's TTL.
func (s *Store) TTL(key string) (time.Duration, bool) {
	c := s.c
	sh := &c.shards[c.shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := sh.at(c.now())
	var br breakerMaps
	if sh.br != nil {
		br = *sh.br
	}
	var at int64
	if st := sh.m[key]; st != nil && st.Used {
		at = st.ExpiresAt
	} else if mt := sh.meters[key]; mt != nil {
		at = mt.ExpiresAt
	} else if b := br.states[key]; b != nil {
		at = b.ExpiresAt
	} else if n := br.calls[key]; n != nil {
		at = n.ExpiresAt
	}
	if at <= now {
		return 0, false
	}
	return time.Duration(at-now) * time.Microsecond, true
}
