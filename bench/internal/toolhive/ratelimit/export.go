package ratelimit

// Added by the mcpgate authors (not part of ToolHive): what the benchmarks
// need to run ToolHive's multi-bucket script through another client.

import (
	"fmt"
	"time"

	"github.com/mcpgate/mcpgate/bench/internal/toolhive/ratelimit/internal/bucket"
)

// ConsumeAllSource is the Lua source of ToolHive's multi-bucket script.
func ConsumeAllSource() string { return bucket.ConsumeAllScript() }

// BucketArgs returns KEYS and ARGV of one ConsumeAll call on buckets of the
// MCP server namespace/name with the given key suffixes (as the limiter
// builds them: "shared", "user:<id>", "user-tool:<tool>:<id>"), each of
// maxTokens refilled over refill: the layout ConsumeAll sends.
func BucketArgs(namespace, name string, suffixes []string, maxTokens int32, refill time.Duration) (keys, args []string) {
	n := len(suffixes)
	args = make([]string, 1+3*n)
	args[0] = fmt.Sprint(n)
	for i, sfx := range suffixes {
		b := bucket.New(namespace, name, sfx, maxTokens, refill)
		keys = append(keys, b.Key())
		args[1+i] = fmt.Sprint(maxTokens)
		args[1+n+i] = fmt.Sprintf("%.6f", float64(maxTokens)/refill.Seconds())
		args[1+2*n+i] = fmt.Sprint(int64(2 * refill.Seconds()))
	}
	return keys, args
}
