package testenv

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Eventually polls cond every 10ms until it holds, and fails tb when d
// passes first, naming what it waited for. It is for waiting on servers
// and goroutines the test does not control; d is a generous bound, not a
// measurement.
func Eventually(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Run runs f(0) … f(calls-1) spread over workers goroutines, and returns
// when every call has returned.
func Run(workers, calls int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= calls {
					return
				}
				f(i)
			}
		})
	}
	wg.Wait()
}
