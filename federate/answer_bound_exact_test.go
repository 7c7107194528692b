package federate

import (
	"bytes"
	"io"
	"testing"

	gwmcp "github.com/mcpgate/mcpgate/mcp"
)

// An answer of exactly DefaultMaxResponseBytes (which the proxy's
// readGrowing accepts) is read whole: the bound is refused only a byte past it (Read at left == 0
// once failed before the body could report io.EOF).
func TestBoundedBodyAcceptsExactlyTheBound(t *testing.T) {
	body := io.NopCloser(bytes.NewReader(make([]byte, gwmcp.DefaultMaxResponseBytes)))
	b := &boundedBody{ReadCloser: body, left: gwmcp.DefaultMaxResponseBytes}
	got, err := io.ReadAll(b)
	if err != nil {
		t.Fatalf("read %d bytes of an answer of exactly the bound: %v", len(got), err)
	}
}
