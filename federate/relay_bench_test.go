package federate

import (
	"fmt"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// BenchmarkProgressTable is one call's add and retire with entries tokens
// already retired within progressGrace (about call rate × progressGrace):
// the cost must not grow with it.
func BenchmarkProgressTable(b *testing.B) {
	for _, entries := range []int{1000, 100000} {
		b.Run(fmt.Sprintf("entries=%d", entries), func(b *testing.B) {
			var t progressTable
			t.init()
			c := &call{cs: &mcp.ClientSession{}, ss: &mcp.ServerSession{}}
			for i := range entries {
				t.retire(t.add(c, i))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				t.retire(t.add(c, i))
			}
		})
	}
}
