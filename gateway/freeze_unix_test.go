//go:build unix

package gateway

import (
	"context"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// freezeRedis stops the redis-server that admin is connected to (SIGSTOP):
// its connections stay open and every command waits, as on a hung server,
// until thaw (SIGCONT) is called. Unlike CLIENT PAUSE it has no duration,
// so a slow test cannot outrun it. thaw is idempotent and also runs when the
// test ends.
func freezeRedis(t *testing.T, admin rueidis.Client) (thaw func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := admin.Do(ctx, admin.B().Info().Section("server").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^process_id:(\d+)`).FindStringSubmatch(info)
	if m == nil {
		t.Fatalf("no process_id in INFO server:\n%s", info)
	}
	pid, _ := strconv.Atoi(m[1])
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thaw = func() { _ = syscall.Kill(pid, syscall.SIGCONT) }
	t.Cleanup(thaw)
	return thaw
}
