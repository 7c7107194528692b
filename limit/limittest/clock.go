// Package limittest holds helpers for testing code built on package limit.
package limittest

import (
	"sync"
	"time"
)

// FakeClock is a clock that moves only when told to. It satisfies the Clock
// interfaces of the stores (a Now method) and is safe for concurrent use.
//
// The zero value is not usable; call NewFakeClock.
type FakeClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewFakeClock returns a clock that reads start until advanced.
func NewFakeClock(start time.Time) *FakeClock {
	return &FakeClock{now: start}
}

// Now returns the current fake time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d. It panics if d is negative: the
// stores rely on a clock that never runs backwards, as a monotonic one does.
func (c *FakeClock) Advance(d time.Duration) {
	if d < 0 {
		panic("limittest: FakeClock.Advance with a negative duration")
	}
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
