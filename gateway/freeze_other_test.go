//go:build !unix

package gateway

import (
	"testing"

	"github.com/redis/rueidis"
)

// freezeRedis needs SIGSTOP: the tests using it skip elsewhere.
func freezeRedis(t *testing.T, _ rueidis.Client) (thaw func()) {
	t.Skip("freezing redis-server needs SIGSTOP")
	return nil
}
