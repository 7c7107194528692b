//go:build !unix

package testenv

import "testing"

// Freeze needs SIGSTOP: on other systems it skips the test.
func (r *Redis) Freeze(tb testing.TB) (thaw func()) {
	tb.Helper()
	tb.Skip("testenv: Freeze needs SIGSTOP (unix)")
	return func() {}
}
