package gateway

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/mcpgate/mcpgate/mcp"
)

// cutUpstream reads a request the gateway cut before its answer, never one
// answered in full: a detached call whose drain bound fired while its
// upstream, its response already relayed, kept the stream open and silent
// (Finish then returns no error) is over upstream; counted as cut, its slot
// was held to its lease's end.
func TestCutUpstream(t *testing.T) {
	drained := func() context.Context {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(errDrained)
		return ctx
	}
	for _, c := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"answered", context.Background(), nil, false},
		{"answered, drain bound fired after", drained(), nil, false},
		{"idle timeout", context.Background(), mcp.ErrUpstreamTimeout, true},
		{"drained before the answer", drained(), context.Canceled, true},
		{"upstream failed", context.Background(), errors.New("connection reset"), false},
	} {
		r := httptest.NewRequest("POST", "/mcp", nil).WithContext(c.ctx)
		if got := cutUpstream(r, c.err); got != c.want {
			t.Errorf("%s: cutUpstream = %v, want %v", c.name, got, c.want)
		}
	}
}
