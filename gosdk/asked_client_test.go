package gosdk_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A cache does not store a result whose handler asked its caller's client
// something: the result holds that client's answer (here an
// elicitation's), which is neither another tenant's to read (a shared
// cache) nor another subject's of the same tenant (a tenant's own
// entries). Each caller gets its own client's answer; a tool that asks no
// client is still stored once. Without a SendingMiddleware nothing can
// tell, and no result is stored. The gateway does the same
// (gateway/cache.go, AskedClient).
func TestCacheKeepsNoLoadThatAskedTheClient(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		shared    bool
		noSending bool
		tool      string
		want      [2]string // the first caller's text, the second's
		reached   int64     // handler runs for the two calls
	}{
		{"shared, asked the client", true, false, "ask", [2]string{"asked: a's answer", "asked: b's answer"}, 2},
		{"shared, asked no client", true, false, "echo", [2]string{"x", "x"}, 1},
		{"shared, no sending middleware, asked the client", true, true, "ask", [2]string{"asked: a's answer", "asked: b's answer"}, 2},
		{"shared, no sending middleware, asked no client", true, true, "echo", [2]string{"x", "x"}, 2},
		{"tenant, asked the client", false, false, "ask", [2]string{"asked: a's answer", "asked: b's answer"}, 2},
		{"tenant, asked no client", false, false, "echo", [2]string{"x", "x"}, 1},
		{"tenant, no sending middleware, asked no client", false, true, "echo", [2]string{"x", "x"}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t, false, fmt.Sprintf(`
tools:
  %s:
    cache: {ttl: 10m, shared: %v}
`, c.tool, c.shared), options{noSending: c.noSending})
			ctx := context.Background()
			for i, who := range []string{"a", "b"} {
				// two tenants for a shared cache, two subjects of one
				// tenant for a tenant's own entries
				tenant, subject := "tenant-"+who, "u"
				if !c.shared {
					tenant, subject = "tenant-a", who
				}
				cs := s.connectAnswering(token(t, tenant, subject), who+"'s answer")
				res, err := call(ctx, cs, c.tool, map[string]any{"text": "x"})
				if err != nil || res.IsError {
					t.Fatalf("caller %s: %+v, %v", who, res, err)
				}
				if got := resultText(res); got != c.want[i] {
					t.Fatalf("caller %s got %q, want %q", who, got, c.want[i])
				}
			}
			if n := s.reached(c.tool); n != c.reached {
				t.Fatalf("the handler ran %d times for two callers' calls, want %d", n, c.reached)
			}
		})
	}
}

// A caller that joined a shared load whose handler asked the loading
// caller's client something runs its own call, and gets its own client's
// answer, not the one of the load it joined.
func TestSharedCacheJoinerOfALoadThatAskedTheClient(t *testing.T) {
	t.Parallel()
	s := newServer(t, false, `
tools:
  ask:
    cache: {ttl: 10m, shared: true}
`, options{})
	asked, release := make(chan struct{}, 1), make(chan struct{})
	a, err := connectWith(s.url, token(t, "tenant-a", "u"), answering(func() string {
		asked <- struct{}{}
		<-release
		return "a's answer"
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	b := s.connectAnswering(token(t, "tenant-b", "u"), "b's answer")
	ctx := context.Background()
	type answer struct {
		text string
		err  error
	}
	get := func(cs *mcp.ClientSession, to chan<- answer) {
		res, err := call(ctx, cs, "ask", map[string]any{"text": "x"})
		if err == nil && res.IsError {
			err = fmt.Errorf("tool error %q", resultText(res))
		}
		to <- answer{resultText(res), err}
	}
	ac, bc := make(chan answer, 1), make(chan answer, 1)
	go get(a, ac)
	<-asked // a's load is waiting for a's client
	go get(b, bc)
	// b joins a's flight if it gets there before a's client answers; if
	// not, it loads on its own and the test asserts less.
	time.Sleep(200 * time.Millisecond)
	close(release)
	for tenant, c := range map[string]chan answer{"a": ac, "b": bc} {
		if got := <-c; got.err != nil || got.text != "asked: "+tenant+"'s answer" {
			t.Errorf("tenant %s got %q, %v; want its own client's answer", tenant, got.text, got.err)
		}
	}
	if n := s.reached("ask"); n != 2 {
		t.Errorf("the handler ran %d times for two tenants' calls, want 2", n)
	}
}
