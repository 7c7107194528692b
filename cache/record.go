package cache

import (
	"encoding/binary"
	"math"
	"time"
)

// record is an entry as a store holds it, with its remaining life as the
// store saw it when it read the entry.
type record struct {
	value    []byte
	negative bool
	fence    uint64        // fence of the loader that wrote it
	delta    time.Duration // how long the load took (XFetch's recompute time)
	stale    time.Duration // stale window kept after the fresh life
	life     time.Duration // remaining life of the stored copy, stale window included
	// tags are the keys of the tag indexes the entry was registered in
	// (keyspace.CacheTag) when it was loaded. RedisStore serves the entry
	// only while each of them still lists it: Redis may evict an index
	// before its entries, and an invalidation finds entries only through
	// their indexes (see RedisStore).
	tags []string
}

// fresh returns the remaining fresh life: positive while fresh, zero or
// negative once only the stale copy is left.
func (r *record) fresh() time.Duration { return r.life - r.stale }

// entry is what a caller sees of r.
func (r *record) entry() Entry {
	return Entry{Value: r.value, Negative: r.negative, TTL: r.fresh()}
}

// Blob layouts (Redis stores an entry as one string; the scripts read the
// version byte, the flags, the fence and the stale window, which both
// layouts keep in place):
//
//	[0]      version: blobUntagged or blobTagged
//	[1]      flags (flagNegative, flagTagsKnown)
//	[2:10]   fence, big endian
//	[10:14]  delta in milliseconds, big endian
//	[14:18]  stale window in milliseconds, big endian
//	blobUntagged (flagTagsKnown set), an entry with no tags:
//	[18:]    value
//	blobTagged, an entry with tags:
//	[18:22]  number of tag index keys, big endian
//	         each: 4 bytes of length, big endian, then the key
//	         then the value
//
// The version before tag indexes were recorded wrote blobUntagged without
// flagTagsKnown, whatever the entry's tags: such a blob is read as absent
// (a miss, and the next load replaces it), since its indexes, unknown,
// cannot be checked and it may be an entry an invalidation missed. While
// instances are upgraded one by one, an upgraded one reloads each entry
// the previous version wrote, once; an untagged entry it writes is still
// read by the previous version (which ignores flags it does not know),
// a tagged one is absent to it (it does not read version blobTagged).
const (
	blobUntagged  = 1
	blobTagged    = 2
	blobHeader    = 18
	flagNegative  = 1
	flagTagsKnown = 2
)

// encodeBlob returns r's stored form. Durations are rounded up to whole
// milliseconds (at least 1ms for delta: a zero recompute time would switch
// XFetch off) and capped at what 32 bits hold.
func encodeBlob(r *record) []byte {
	n := blobHeader + len(r.value)
	if len(r.tags) > 0 {
		n += 4
		for _, k := range r.tags {
			n += 4 + len(k)
		}
	}
	b := make([]byte, blobHeader, n)
	b[0], b[1] = blobUntagged, flagTagsKnown
	if r.negative {
		b[1] |= flagNegative
	}
	binary.BigEndian.PutUint64(b[2:10], r.fence)
	binary.BigEndian.PutUint32(b[10:14], millis32(max(r.delta, time.Millisecond)))
	binary.BigEndian.PutUint32(b[14:18], millis32(r.stale))
	if len(r.tags) > 0 {
		b[0] = blobTagged
		b = binary.BigEndian.AppendUint32(b, uint32(len(r.tags)))
		for _, k := range r.tags {
			b = binary.BigEndian.AppendUint32(b, uint32(len(k)))
			b = append(b, k...)
		}
	}
	return append(b, r.value...)
}

// decodeBlob parses a stored entry whose key has life left; ok is false for
// a blob of another version, of the previous version (see blobUntagged) or
// a truncated one (treated as absent, so the next load overwrites it).
func decodeBlob(b []byte, life time.Duration) (r record, ok bool) {
	if len(b) < blobHeader || b[1]&flagTagsKnown == 0 {
		return record{}, false
	}
	r = record{
		negative: b[1]&flagNegative != 0,
		fence:    binary.BigEndian.Uint64(b[2:10]),
		delta:    time.Duration(binary.BigEndian.Uint32(b[10:14])) * time.Millisecond,
		stale:    time.Duration(binary.BigEndian.Uint32(b[14:18])) * time.Millisecond,
		life:     life,
	}
	rest := b[blobHeader:]
	switch b[0] {
	case blobUntagged:
	case blobTagged:
		n, ok := uint32At(&rest)
		if !ok || n == 0 || uint64(n)*4 > uint64(len(rest)) {
			return record{}, false
		}
		r.tags = make([]string, n)
		for i := range r.tags {
			l, ok := uint32At(&rest)
			if !ok || uint64(l) > uint64(len(rest)) {
				return record{}, false
			}
			r.tags[i], rest = string(rest[:l]), rest[l:]
		}
	default:
		return record{}, false
	}
	r.value = rest
	return r, true
}

// uint32At consumes a big-endian uint32 from the front of *b.
func uint32At(b *[]byte) (uint32, bool) {
	if len(*b) < 4 {
		return 0, false
	}
	v := binary.BigEndian.Uint32(*b)
	*b = (*b)[4:]
	return v, true
}

// fenceBytes is the fence as the blob holds it (what the refresh script
// compares).
func fenceBytes(f uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], f)
	return string(b[:])
}

// millis returns d in whole milliseconds, rounded up.
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func millis32(d time.Duration) uint32 {
	return uint32(min(max(millis(d), 0), math.MaxUint32))
}
