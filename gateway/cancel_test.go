package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/usage"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// cancelConfig: two failures in a row open the breaker; one slow call at a
// time.
const cancelConfig = `
usage: {flush_interval: 50ms}
breaker:
  consecutive_failures: 2
  cooldown: 1m
tools:
  slow:
    limits:
      - {name: slow_one, per: tenant_tool, algorithm: concurrency, limit: 1, period: 1m}
`

// A call the go-sdk client cancels (it sends notifications/cancelled when
// the context of CallTool ends) is no failure for the loop breaker, frees
// its concurrency slot before the cancellation reaches the upstream, and is
// still metered. Twice in a row under consecutive_failures: 2.
func TestCancelledCallIsNoFailure(t *testing.T) {
	t.Parallel()
	for _, m := range []struct {
		name string
		json bool
	}{{"sse", false}, {"json", true}} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, setup{Config: cancelConfig, Usage: openUsageDB(t, ""), Upstream: upstream.Options{JSONResponse: m.json}})
			tok := token(t, "acme", "alice")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cs, err := sdkClient().Connect(ctx, transport(e.mcpURL(0), bearer{token: tok}), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			for i := range 2 {
				before := e.up.Requests("notifications/cancelled")
				cctx, ccancel := context.WithCancel(ctx)
				errc := make(chan error, 1)
				go func() {
					_, err := callTool(cctx, cs, "slow", map[string]any{"ms": 60000})
					errc <- err
				}()
				eventually(t, 10*time.Second, "the slow call to reach the upstream", func() bool { return e.up.Calls("slow") == int64(i+1) })
				ccancel()
				if err := <-errc; !errors.Is(err, context.Canceled) {
					t.Fatalf("cancelled call %d: %v", i, err)
				}
				// The gateway sends the cancellation on once the call has
				// ended: its slot is free when the upstream gets it.
				eventually(t, 10*time.Second, "the cancellation to reach the upstream", func() bool {
					return e.up.Requests("notifications/cancelled") > before
				})
				// The go-sdk client also closes the call's request: the gateway
				// may tell the upstream first (an abandoned call), then ends
				// the call.
				eventually(t, 10*time.Second, "the call to end", func() bool { return e.gws[0].inflight.size() == 0 })
			}
			// Breaker closed, slot free: the next call is admitted at once.
			res, err := callTool(ctx, cs, "slow", map[string]any{"ms": 1})
			if err != nil || res.IsError {
				t.Fatalf("the call after two cancellations: %v %+v", err, res)
			}
			if got := e.live(0, "acme", usage.Period(time.Now())); got.Calls != 3 || got.Used() != 3 {
				t.Fatalf("usage %+v, want the 3 admitted calls, cancelled ones included", got)
			}
		})
	}
}

// A client that keeps the call's request open after notifications/cancelled
// (as the TypeScript SDK's does; the go-sdk's aborts it) gets no answer: a
// pending JSON answer is 202 with no body, an event stream ends without a
// response. Twice in a row, the breaker stays closed and the slot is free
// at once. A notifications/cancelled cancels only its sender's calls in its
// session.
func TestCancelKeptOpenAndIsolation(t *testing.T) {
	t.Parallel()
	for _, m := range []struct {
		name string
		json bool
	}{{"sse", false}, {"json", true}} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, setup{Config: cancelConfig, Upstream: upstream.Options{JSONResponse: m.json}})
			owner := newAgent(t, e, "acme", "alice", false)
			others := []*agent{
				newAgent(t, e, "acme", "alice", false), // the same caller, another session
				newAgent(t, e, "acme", "bob", false),   // another subject
				newAgent(t, e, "other", "alice", false),
			}
			for i := range 2 {
				id := 40 + i
				done := make(chan *response, 1)
				go func() {
					r, err := postCtx(context.Background(), e.mcpURL(0), owner.tok, callBody(id, "slow", map[string]any{"ms": 60000}),
						http.Header{"Mcp-Session-Id": {owner.sid}})
					if err != nil {
						t.Error(err)
					}
					done <- r
				}()
				eventually(t, 10*time.Second, "the slow call to reach the upstream", func() bool { return e.up.Calls("slow") == int64(i+1) })
				cancelID := fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":%d,"reason":"test"}}`, id)
				for k, a := range others {
					if r := a.post(0, cancelID); r.Status != http.StatusAccepted {
						t.Fatalf("other caller %d: cancellation answered %d %s", k, r.Status, r.Body)
					}
					if n := e.gws[0].inflight.size(); n != 1 {
						t.Fatalf("after other caller %d's cancellation: %d calls registered, want the owner's 1", k, n)
					}
				}
				// A requestId spelled twice would be read one way here and
				// another upstream (a strict decoder takes "requestId",
				// encoding/json the last case twin): refused, the call kept.
				twin := fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":999,"RequestId":%d}}`, id)
				if r := owner.post(0, twin); r.Status != http.StatusBadRequest {
					t.Fatalf("an ambiguous cancellation answered %d %s, want 400", r.Status, r.Body)
				}
				if n := e.gws[0].inflight.size(); n != 1 {
					t.Fatalf("after an ambiguous cancellation: %d calls registered, want 1", n)
				}
				// 41.0 is 41: ids compare as JSON-RPC values.
				if r := owner.post(0, strings.Replace(cancelID, fmt.Sprint(id), fmt.Sprint(id)+".0", 1)); r.Status != http.StatusAccepted {
					t.Fatalf("owner's cancellation answered %d %s", r.Status, r.Body)
				}
				r := <-done
				// Before the upstream's headers: 202. The SDK server sends
				// none before its first event, so an open stream (200) is
				// only possible with SSE, and must end without a response.
				accepted := r.Status == http.StatusAccepted && len(r.Body) == 0
				streamed := !m.json && r.Status == http.StatusOK && r.Msg.Result == nil && r.Msg.Error == nil
				if !accepted && !streamed {
					t.Fatalf("the cancelled call was answered %d %q, want no answer", r.Status, r.Body)
				}
				eventually(t, 10*time.Second, "the upstream tool to stop", func() bool { return e.up.Cancelled() == int64(i+1) })
			}
			mustPass(t, owner.call(0, "slow", map[string]any{"ms": 1}), "the call after two cancellations")
		})
	}
}

// A client that goes away mid-call without cancelling it (its connection
// closes) gets its call cancelled upstream by the gateway before the call's
// concurrency slot is freed: an upstream on a 2025 session goes on running a
// tool whose request was closed, and the freed slot would let another call
// run beside it. The same holds for a cached tool whose call bypasses the
// cache (a params member the cache key does not cover): it went upstream
// as a call of its own.
func TestAbandonedCallIsCancelledUpstream(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, config, call string }{
		{"plain", cancelConfig, callBody(7, "slow", map[string]any{"ms": 60000})},
		{"cache bypassed", cancelConfig + "    cache: {ttl: 10m}\n",
			`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow","arguments":{"ms":60000},"x":1}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			abandonedCallIsCancelledUpstream(t, c.config, c.call)
		})
	}
}

func abandonedCallIsCancelledUpstream(t *testing.T, config, call string) {
	e := newEnv(t, setup{Config: config})
	tok := token(t, "acme", "alice")
	init := post(t, e.mcpURL(0), tok, initializeBody, nil)
	sid := init.Header.Get("Mcp-Session-Id")
	if init.Status != http.StatusOK || sid == "" {
		t.Fatalf("initialize: %d %s", init.Status, init.Body)
	}
	hdr := http.Header{"Mcp-Session-Id": {sid}, "Mcp-Protocol-Version": {"2025-06-18"}}
	if r := post(t, e.mcpURL(0), tok, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, hdr); r.Status != http.StatusAccepted {
		t.Fatalf("initialized: %d %s", r.Status, r.Body)
	}
	before := e.up.Requests("notifications/cancelled")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = postCtx(ctx, e.mcpURL(0), tok, call, hdr)
	}()
	eventually(t, 10*time.Second, "the slow call to reach the upstream", func() bool { return e.up.Calls("slow") == 1 })
	cancel() // the connection closes; no notifications/cancelled from the client
	<-done
	eventually(t, 10*time.Second, "the gateway's cancellation to reach the upstream", func() bool {
		return e.up.Requests("notifications/cancelled") == before+1
	})
	// The call is settled (its slot freed) right after the cancellation is
	// sent, and leaves the in-flight table last.
	eventually(t, 10*time.Second, "the abandoned call to be settled", func() bool { return e.gws[0].inflight.size() == 0 })
	// The slot is free again: the next call is admitted.
	if r := post(t, e.mcpURL(0), tok, callBody(8, "slow", map[string]any{"ms": 1}), hdr); r.Status != http.StatusOK {
		t.Fatalf("the call after the abandoned one: %d %s", r.Status, r.Body)
	}
}

// A call without a session (a stateless upstream) cannot be stopped
// upstream: a notifications/cancelled has no session to reach it in, and
// the Go SDK's stateless server runs a tool whose request was closed to its
// end. So when its client hangs up or cancels it, the
// call keeps its concurrency slot until the upstream has answered: hanging
// up and calling again does not run two calls under a limit of one. The
// same holds for a cached tool whose call bypasses the cache (a params
// member the cache key does not cover).
func TestSessionlessCallKeepsItsSlotUntilTheUpstreamEnds(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"hang up", "cancel", "hang up, cache bypassed"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			cfg, body := cancelConfig, callBody(7, "slow", map[string]any{"ms": 6000})
			if strings.HasSuffix(how, "bypassed") {
				cfg += "    cache: {ttl: 10m}\n"
				body = `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow","arguments":{"ms":6000},"x":1}}`
			}
			e := newEnv(t, setup{Config: cfg, Upstream: upstream.Options{Stateless: true}})
			tok := token(t, "acme", "alice")
			hdr := http.Header{"Mcp-Protocol-Version": {"2025-06-18"}}
			ctx, hangUp := context.WithCancel(context.Background())
			defer hangUp()
			done := callInFlight(ctx, t, e, tok, body, hdr, "slow", 1)
			if how != "cancel" {
				hangUp()
				<-done
			} else if r := post(t, e.mcpURL(0), tok, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}`, hdr); r.Status != http.StatusAccepted {
				t.Fatalf("cancellation answered %d %s", r.Status, r.Body)
			}
			// Call 7 runs upstream for 6 s: for the next second (the
			// gateway notices the hang-up within it), its slot stays taken
			// (a client that cancelled and still reads gets nothing more).
			for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
				if r := post(t, e.mcpURL(0), tok, callBody(8, "slow", map[string]any{"ms": 1}), hdr); r.Status != http.StatusTooManyRequests {
					t.Fatalf("a second call while the first still runs upstream: %d %s, want 429", r.Status, r.Body)
				}
			}
			// Once the upstream has answered, the slot is free.
			eventually(t, 30*time.Second, "the slot to come free when the upstream answers", func() bool {
				r := post(t, e.mcpURL(0), tok, callBody(9, "slow", map[string]any{"ms": 1}), hdr)
				return r.Status == http.StatusOK
			})
		})
	}
}

// A call without a session keeps its slot until the upstream has answered,
// whatever protocol version it claims. Under MCP 2026-07-28 a closed
// request stops the tool only on a server that asks for it (the Go SDK's
// StreamableHTTPOptions.PropagateRequestCancellation, off by default), and
// the version is the client's word: on a stateless Go SDK server with its
// defaults, "call, hang up, call again" ran several calls at once under a
// concurrency limit of one.
func TestSessionlessCallKeepsItsSlotWhateverItsProtocol(t *testing.T) {
	t.Parallel()
	for _, proto := range []string{"2025-06-18", "2026-07-28"} {
		t.Run(proto, func(t *testing.T) {
			t.Parallel()
			var started atomic.Int64
			release := make(chan struct{})
			free := sync.OnceFunc(func() { close(release) })
			srv := sdk.NewServer(&sdk.Implementation{Name: "plain", Version: "1"}, nil)
			sdk.AddTool(srv, &sdk.Tool{Name: "slow"}, func(_ context.Context, _ *sdk.CallToolRequest, in struct {
				Block bool `json:"block"`
			}) (*sdk.CallToolResult, any, error) {
				if in.Block {
					started.Add(1)
					<-release // the request's end does not stop it: the SDK's default
				}
				return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "done"}}}, nil, nil
			})
			up := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv },
				&sdk.StreamableHTTPOptions{Stateless: true}))
			t.Cleanup(up.Close)
			t.Cleanup(free) // before up.Close
			e := newEnv(t, setup{UpstreamURL: up.URL, Config: cancelConfig})
			tok := token(t, "acme", "alice")
			hdr := http.Header{"Mcp-Protocol-Version": {proto}, "Mcp-Method": {"tools/call"}, "Mcp-Name": {"slow"}}
			call := func(id int, block bool) string {
				meta := ""
				if proto >= "2026-07-28" {
					meta = fmt.Sprintf(`,"_meta":{"io.modelcontextprotocol/protocolVersion":%q,"io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"}}`, proto)
				}
				return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"slow","arguments":{"block":%t}%s}}`, id, block, meta)
			}
			ctx, hangUp := context.WithCancel(context.Background())
			defer hangUp()
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = postCtx(ctx, e.mcpURL(0), tok, call(7, true), hdr)
			}()
			eventually(t, 10*time.Second, "the call to reach the upstream", func() bool { return started.Load() == 1 })
			hangUp()
			<-done
			// For the next second (the gateway notices the hang-up within
			// it), the tool still runs upstream and its slot stays taken.
			for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
				if r := post(t, e.mcpURL(0), tok, call(8, false), hdr); r.Status != http.StatusTooManyRequests {
					t.Fatalf("a second call while the first still runs upstream: %d %s, want 429", r.Status, r.Body)
				}
			}
			free()
			eventually(t, 10*time.Second, "the slot to come free when the upstream answers", func() bool {
				return post(t, e.mcpURL(0), tok, call(9, false), hdr).Status == http.StatusOK
			})
		})
	}
}

// A shutdown does not wait for the upstream answer of a session-less call
// whose client has left (nobody reads it): when the shutdown starts
// (EndStreams), the call ends at once, long before its tool would have
// answered. Its slot stays held (until its lease lapses): the tool still
// runs upstream, and nothing can stop it.
func TestShutdownEndsCallsWhoseClientLeft(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: cancelConfig, Upstream: upstream.Options{Stateless: true}})
	tok := token(t, "acme", "alice")
	ctx, hangUp := context.WithCancel(context.Background())
	done := callInFlight(ctx, t, e, tok, callBody(7, "slow", map[string]any{"ms": 15000}), nil, "slow", 1)
	hangUp()
	<-done
	if r := post(t, e.mcpURL(0), tok, callBody(8, "slow", map[string]any{"ms": 1}), nil); r.Status != http.StatusTooManyRequests {
		t.Fatalf("a call while the first still runs upstream: %d %s, want 429", r.Status, r.Body)
	}
	// The tool answers after 15 s; the shutdown ends the call at once.
	e.gws[0].EndStreams()
	eventually(t, 8*time.Second, "the call to end once the shutdown started", func() bool { return e.gws[0].inflight.size() == 0 })
	if e.up.Calls("slow") != 1 {
		t.Fatalf("%d calls reached the upstream, want 1", e.up.Calls("slow"))
	}
	if r := post(t, e.mcpURL(0), tok, callBody(9, "slow", map[string]any{"ms": 1}), nil); r.Status != http.StatusTooManyRequests {
		t.Fatalf("a call while the ended one still runs upstream: %d %s, want 429", r.Status, r.Body)
	}
}

// The answer of a session-less call whose client hung up still comes (the
// gateway reads it to free the slot), but a call its client gave up on
// says nothing of the agent's loop: two such tool errors in a row do not
// open a breaker of consecutive_failures: 2.
func TestAbandonedAnswerIsNoBreakerFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: cancelConfig, Upstream: upstream.Options{Stateless: true}})
	sdk.AddTool(e.up.MCPServer(), &sdk.Tool{Name: "slow_fail"}, func(ctx context.Context, _ *sdk.CallToolRequest, in struct {
		MS int `json:"ms"`
	}) (*sdk.CallToolResult, any, error) {
		time.Sleep(time.Duration(in.MS) * time.Millisecond)
		return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: "failed late"}}}, nil, nil
	})
	tok := token(t, "acme", "alice")
	for i := range 2 {
		ctx, hangUp := context.WithCancel(context.Background())
		done := callInFlight(ctx, t, e, tok, callBody(i, "slow_fail", map[string]any{"ms": 500}), nil, "slow_fail", int64(i+1))
		hangUp()
		<-done
		eventually(t, 10*time.Second, "the abandoned call to be settled", func() bool { return e.gws[0].inflight.size() == 0 })
	}
	r := post(t, e.mcpURL(0), tok, callBody(3, "slow_fail", map[string]any{"ms": 1}), nil)
	if r.Status != http.StatusOK {
		t.Fatalf("a call after two abandoned tool errors: %d %s, want 200 (no breaker opened)", r.Status, r.Body)
	}
}

// sent is the answer to a request sent in the background.
type sent struct {
	r   *response
	err error
}

// callInFlight sends body, a tools/call of tool, through instance 0 in the
// background and returns once the upstream has seen n calls of tool; the
// answer comes on the channel.
func callInFlight(ctx context.Context, t *testing.T, e *env, tok, body string, hdr http.Header, tool string, n int64) <-chan sent {
	t.Helper()
	answer := make(chan sent, 1)
	go func() {
		r, err := postCtx(ctx, e.mcpURL(0), tok, body, hdr)
		answer <- sent{r, err}
	}()
	eventually(t, 10*time.Second, fmt.Sprintf("call %d of %s to reach the upstream", n, tool), func() bool { return e.up.Calls(tool) == n })
	return answer
}
