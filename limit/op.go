package limit

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"
)

// Idempotent meter operations.
//
// A metered request (TakeMetered, Evaluate with a Meter, Adjust) may carry
// an operation id, Meter.Op. The store records, atomically with what the
// operation applied, a marker of the op in the meter's slot, holding its
// answer, for OpTTL. Sending the same op again (a retry after a reply lost
// to a timeout or a broken connection) then applies nothing and returns the
// recorded answer: whether or not the first attempt landed, the op lands
// exactly once, as long as the retry runs within OpTTL of the first
// attempt's execution. Only an op that charged or adjusted the meter leaves
// a marker: one the checks or the quota denied (or that found no meter to
// charge, NeedSeed) applied nothing, and sending it again decides afresh.
//
// A meter also has a generation (MeterResult.Gen, MeterState.Gen): the
// identity of one life of the counter in its store, and the durable total
// it was created from. A store that lost its data (Redis restarted empty)
// re-creates the meter from the durable total under a new generation;
// Meter.Replay lets a caller place again, exactly once, usage it had
// charged in the lost generation (see Replay).

// OpTTL is how long a store keeps the marker of an applied op: a repeat of
// the op within OpTTL of its execution applies nothing. It bounds how long
// a caller may wait before retrying an op whose answer it lost.
const OpTTL = 5 * time.Minute

// MaxOpLen bounds the length of an op id.
const MaxOpLen = 64

// NewOp returns a new random op id: 128 bits in hex.
func NewOp() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Generation identifies one life of a meter in a store: ID is chosen when
// the store creates the counter (from the Seed), Seed is what it was
// created from (the durable total at that time). The zero Generation means
// unknown (a counter written before generations existed).
type Generation struct {
	ID   string
	Seed Usage
}

// Replay marks an Adjust that places again the usage of an op applied in
// an earlier generation of the meter, one its store has since lost. The
// store applies the delta unless the counter's current generation is Gen
// (the op is still counted there: nothing was lost) or its Seed already
// holds the op (the op's usage reached the durable total before the loss):
// that is, unless Seed >= After in some field the delta raises. Either way
// MeterResult.Covered says the delta was not applied because it is already
// counted.
type Replay struct {
	// Gen is the generation the op was applied in.
	Gen string
	// After is the counter's usage right after the op was applied there
	// (MeterResult.Usage of its answer).
	After Usage
}

// ErrInvalidOp means an op id is longer than MaxOpLen or holds a byte
// outside [0-9A-Za-z_-], or a Replay came without an op or with a delta
// that raises no field. Nothing was charged. It wraps ErrInvalidMeter.
var ErrInvalidOp = fmt.Errorf("%w: invalid op", ErrInvalidMeter)

// ValidateOp checks m's op and replay for a call whose meter delta is
// delta (an Adjust's; for a metered take, the charge).
func ValidateOp(m Meter, delta Usage) error {
	if len(m.Op) > MaxOpLen {
		return fmt.Errorf("%w: %d bytes (at most %d)", ErrInvalidOp, len(m.Op), MaxOpLen)
	}
	for i := 0; i < len(m.Op); i++ {
		c := m.Op[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_') {
			return fmt.Errorf("%w: byte %q", ErrInvalidOp, c)
		}
	}
	if m.Replay == nil {
		return nil
	}
	switch {
	case m.Op == "":
		return fmt.Errorf("%w: a replay needs an op", ErrInvalidOp)
	case delta == (Usage{}):
		return fmt.Errorf("%w: a replay of nothing", ErrInvalidOp)
	case len(m.Replay.Gen) > MaxOpLen:
		return fmt.Errorf("%w: replay generation of %d bytes", ErrInvalidOp, len(m.Replay.Gen))
	}
	if err := ValidateUsage(m.Replay.After); err != nil {
		return fmt.Errorf("%w: replay: %w", ErrInvalidOp, err)
	}
	return nil
}

// Holds reports whether seed already holds an op that left the counter at
// after by adding delta: seed >= after in a field delta raises. Within one
// generation every field only grows, so a snapshot at or past after in a
// field the op raised was taken after the op.
func Holds(seed, after, delta Usage) bool {
	return delta.Charged > 0 && seed.Charged >= after.Charged ||
		delta.Refunded > 0 && seed.Refunded >= after.Refunded ||
		delta.Calls > 0 && seed.Calls >= after.Calls ||
		delta.RefundedCalls > 0 && seed.RefundedCalls >= after.RefundedCalls
}
