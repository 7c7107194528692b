package setup

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
)

// A Redis that refuses connections when the stores open stops the start,
// whatever store.on_error says (the client dials when created): Open says
// so with ErrRedisDownAtStart, for the limit store's Redis and the cache's.
func TestOpenRefusesARedisDownAtStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, yaml := range map[string]string{
		"store.redis": "usage:\n  store: sqlite:" + filepath.Join(dir, "a.db") + "\nstore:\n  redis: \"redis://127.0.0.1:1/0\"\n  on_error: open\n",
		"cache.redis": "usage:\n  store: sqlite:" + filepath.Join(dir, "b.db") + "\ncache:\n  redis: \"redis://127.0.0.1:1/0\"\n",
	} {
		t.Run(name, func(t *testing.T) {
			st, err := Open(context.Background(), parse(t, yaml), slog.New(slog.DiscardHandler), nil)
			if err == nil {
				st.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, ErrRedisDownAtStart) {
				t.Fatalf("err = %v, want ErrRedisDownAtStart", err)
			}
		})
	}
}
