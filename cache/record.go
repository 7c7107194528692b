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
}

// fresh returns the remaining fresh life: positive while fresh, zero or
// negative once only the stale copy is left.
func (r *record) fresh() time.Duration { return r.life - r.stale }

// entry is what a caller sees of r.
func (r *record) entry() Entry {
	return Entry{Value: r.value, Negative: r.negative, TTL: r.fresh()}
}

// Blob layout (Redis stores an entry as one string; the scripts read the
// version byte, the fence and the stale window):
//
//	[0]      version (blobVersion)
//	[1]      flags (flagNegative)
//	[2:10]   fence, big endian
//	[10:14]  delta in milliseconds, big endian
//	[14:18]  stale window in milliseconds, big endian
//	[18:]    value
const (
	blobVersion  = 1
	blobHeader   = 18
	flagNegative = 1
)

// encodeBlob returns r's stored form. Durations are rounded up to whole
// milliseconds (at least 1ms for delta: a zero recompute time would switch
// XFetch off) and capped at what 32 bits hold.
func encodeBlob(r *record) []byte {
	b := make([]byte, blobHeader+len(r.value))
	b[0] = blobVersion
	if r.negative {
		b[1] = flagNegative
	}
	binary.BigEndian.PutUint64(b[2:10], r.fence)
	binary.BigEndian.PutUint32(b[10:14], millis32(max(r.delta, time.Millisecond)))
	binary.BigEndian.PutUint32(b[14:18], millis32(r.stale))
	copy(b[blobHeader:], r.value)
	return b
}

// decodeBlob parses a stored entry whose key has life left; ok is false for
// a blob of another version or a truncated one (treated as absent, so the
// next load overwrites it).
func decodeBlob(b []byte, life time.Duration) (r record, ok bool) {
	if len(b) < blobHeader || b[0] != blobVersion {
		return record{}, false
	}
	return record{
		value:    b[blobHeader:],
		negative: b[1]&flagNegative != 0,
		fence:    binary.BigEndian.Uint64(b[2:10]),
		delta:    time.Duration(binary.BigEndian.Uint32(b[10:14])) * time.Millisecond,
		stale:    time.Duration(binary.BigEndian.Uint32(b[14:18])) * time.Millisecond,
		life:     life,
	}, true
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
