package mcp

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// A request's 2xx JSON answer nobody reads (a resources/read of a big blob)
// is relayed as it streams in whatever its size, its first
// checkedAnswerBytes included: only smaller answers are checked to be the
// request's response (TestProxyRefusesAnotherResponse).
func TestLargeOwnJSONAnswerIsRelayed(t *testing.T) {
	blob := strings.Repeat("x", DefaultMaxResponseBytes+1)
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":7,"result":{"contents":[{"uri":"file:///big","text":%q}]}}`, blob)
	})
	const read = `{"jsonrpc":"2.0","id":7,"method":"resources/read","params":{"uri":"file:///big"}}`
	status, got, err := serveOnce(t, up.URL, read, false)
	if status != http.StatusOK || len(got) < DefaultMaxResponseBytes || err != nil {
		t.Fatalf("client got %d with %d bytes (%.200s) (Finish: %v), want 200 with the upstream's own response relayed", status, len(got), got, err)
	}
}
