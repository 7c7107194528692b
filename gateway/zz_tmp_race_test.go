package gateway

import (
	"context"
	"fmt"
	"testing"

	"github.com/mcpgate/mcpgate/examples/upstream"
)

func TestTmpSDKFailureRace(t *testing.T) {
	e := newBreakerEnv(t, nil, `
breaker:
  consecutive_failures: 3
  cooldown: 30s
`, upstream.Options{})
	leaks := 0
	for k := range 40 {
		tok := token(t, "acme", fmt.Sprint("s", k))
		cs := connect(t, e.mcpURL(k), tok, "")
		for i := range 3 {
			if _, err := callTool(context.Background(), cs, "fail", map[string]any{"message": fmt.Sprint(i)}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := callTool(context.Background(), cs, "echo", map[string]any{"text": "x"}); !isRateLimited(err) {
			leaks++
		}
	}
	t.Logf("leaks: %d of 40", leaks)
	if leaks > 0 {
		t.Fail()
	}
}
