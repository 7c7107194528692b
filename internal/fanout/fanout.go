// Package fanout runs n independent calls on a bounded number of
// goroutines.
package fanout

import (
	"sync"
	"sync/atomic"
)

// Do calls fn(0) … fn(n-1) on at most width goroutines and returns when
// all have returned. With n == 1 it calls fn on the caller's goroutine.
func Do(n, width int, fn func(i int)) {
	if n == 1 {
		fn(0)
		return
	}
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range min(n, width) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				fn(i)
			}
		})
	}
	wg.Wait()
}
