package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/cache"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// overlapUpstream is a Go SDK server whose tool "block", prompt "block"
// and resource "block://slow" run until released (or cancelled in their
// session), and which counts how many of them run at once: overlaps is how
// many started while another still ran (a concurrency limit of one must
// keep it at 0). With blockAll set, every run blocks. "block" with block: false, prompt "block" with block
// "false" and resource "block://fast" answer at once, counted all the same.
// A notifications/cancelled is answered only once the run it stops has
// ended (the SDK ends it in the background), so that a cancellation the
// gateway sends is over, upstream too, when it returns.
type overlapUpstream struct {
	url      string
	running  atomic.Int64
	started  atomic.Int64
	overlaps atomic.Int64
	blockAll atomic.Bool // every run blocks, whatever its arguments
	release  func()
}

func newOverlapUpstream(t *testing.T, stateless bool) *overlapUpstream {
	t.Helper()
	o := &overlapUpstream{}
	released := make(chan struct{})
	o.release = sync.OnceFunc(func() { close(released) })
	run := func(ctx context.Context, block bool) {
		o.started.Add(1)
		if o.running.Add(1) > 1 {
			o.overlaps.Add(1)
		}
		defer o.running.Add(-1)
		if block || o.blockAll.Load() {
			select {
			case <-released:
			case <-ctx.Done(): // a notifications/cancelled in its session
			}
		}
	}
	srv := sdk.NewServer(&sdk.Implementation{Name: "overlap", Version: "1"}, nil)
	sdk.AddTool(srv, &sdk.Tool{Name: "block"}, func(ctx context.Context, _ *sdk.CallToolRequest, in struct {
		Block bool `json:"block,omitempty"`
		K     int  `json:"k,omitempty"` // a cache key of its own
	}) (*sdk.CallToolResult, any, error) {
		run(ctx, in.Block)
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "done"}}}, nil, nil
	})
	srv.AddPrompt(&sdk.Prompt{Name: "block", Arguments: []*sdk.PromptArgument{{Name: "block"}}}, func(ctx context.Context, req *sdk.GetPromptRequest) (*sdk.GetPromptResult, error) {
		run(ctx, req.Params.Arguments["block"] == "true")
		return &sdk.GetPromptResult{Messages: []*sdk.PromptMessage{{Role: "user", Content: &sdk.TextContent{Text: "done"}}}}, nil
	})
	for _, uri := range []string{"block://slow", "block://fast"} {
		srv.AddResource(&sdk.Resource{URI: uri, Name: uri}, func(ctx context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
			run(ctx, req.Params.URI == "block://slow")
			return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{{URI: req.Params.URI, Text: "done"}}}, nil
		})
	}
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, &sdk.StreamableHTTPOptions{Stateless: stateless})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if method, _ := peekRPC(r); method != "notifications/cancelled" {
			h.ServeHTTP(w, r)
			return
		}
		n := o.running.Load()
		h.ServeHTTP(w, r)
		for end := time.Now().Add(time.Second); n > 0 && o.running.Load() >= n && time.Now().Before(end); {
			time.Sleep(2 * time.Millisecond)
		}
	}))
	t.Cleanup(up.Close)
	t.Cleanup(o.release) // before up.Close
	o.url = up.URL
	return o
}

// cutConfig: one "block" call at a time per tenant.
const cutConfig = `
tools:
  block:
    limits:
      - {name: block_one, per: tenant_tool, algorithm: concurrency, limit: 1, period: 1m}
`

// A call whose upstream request the gateway cut (upstream.timeout,
// upstream.max_duration, or the end of a detached call's wait at shutdown)
// may still run upstream: the Go SDK's server goes on with a tool whose
// request was closed. In a session the gateway cancels it there before
// its slot is freed; without one nothing can stop it, and its slot stays
// held (until its lease lapses). Calling again at once never runs two
// calls under a concurrency limit of one. The same holds for a cached
// tool's load, cut while its caller waits for it. The slot was freed as
// soon as the 504 was written, and the next call ran beside the first.
func TestCutCallNeverRunsBesideTheNext(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, upstreamYAML     string
		session, drain, cached bool
	}{
		{"timeout, session", "  timeout: 300ms\n", true, false, false},
		{"timeout, sessionless", "  timeout: 300ms\n", false, false, false},
		{"max_duration, session", "  timeout: 30s\n  max_duration: 300ms\n", true, false, false},
		{"max_duration, sessionless", "  timeout: 30s\n  max_duration: 300ms\n", false, false, false},
		{"drained at shutdown, sessionless", "  timeout: 30s\n", false, true, false},
		{"cached load, timeout, session", "  timeout: 300ms\n", true, false, true},
		{"cached load, timeout, sessionless", "  timeout: 300ms\n", false, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			up := newOverlapUpstream(t, !c.session)
			config := cutConfig
			if c.cached {
				config += "    cache: {ttl: 10m}\n" // the call's own load is cut
			}
			e := newEnv(t, setup{UpstreamURL: up.url, UpstreamYAML: c.upstreamYAML, Config: config})
			tok := token(t, "acme", "alice")
			var hdr http.Header
			if c.session {
				hdr = openRawSession(t, e, tok)
			}
			if c.drain {
				ctx, hangUp := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() {
					defer close(done)
					_, _ = postCtx(ctx, e.mcpURL(0), tok, callBody(7, "block", map[string]any{"block": true}), hdr)
				}()
				eventually(t, 10*time.Second, "the call to reach the upstream", func() bool { return up.started.Load() == 1 })
				hangUp()
				<-done
				e.gws[0].EndStreams() // ends the detached wait for the answer
				eventually(t, 10*time.Second, "the drained call to be settled", func() bool { return e.gws[0].inflight.size() == 0 })
			} else if r := post(t, e.mcpURL(0), tok, callBody(7, "block", map[string]any{"block": true}), hdr); r.Status != http.StatusGatewayTimeout && !(c.cached && r.Status == http.StatusOK) {
				t.Fatalf("the blocked call: %d %s, want 504 (or a stream that ends in the error, for a cached load)", r.Status, r.Body)
			}
			r := post(t, e.mcpURL(0), tok, callBody(8, "block", map[string]any{"block": false}), hdr)
			if n := up.overlaps.Load(); n != 0 {
				t.Fatalf("the next call ran upstream beside the cut one (%d overlaps; answered %d)", n, r.Status)
			}
			want := http.StatusOK // the cut call was cancelled in its session
			if !c.session {
				want = http.StatusTooManyRequests // it may still run: its slot is held
			}
			if r.Status != want {
				t.Fatalf("the call after the cut one: %d %s, want %d", r.Status, r.Body, want)
			}
			if c.session && up.running.Load() != 0 {
				t.Fatalf("%d runs left upstream: the cut call was not cancelled", up.running.Load())
			}
		})
	}
}

// methodsConfig: one prompts/get or resources/read at a time per tenant.
const methodsConfig = `
tiers:
  free:
    limits:
      - {name: reads_one, per: tenant, methods: [prompts/get, resources/read], algorithm: concurrency, limit: 1, period: 1m}
`

// A request other than tools/call passes its method's rules, which may
// hold a concurrency slot, and is held as a tools/call is: when its client
// hangs up, or the gateway cuts its upstream request, it is cancelled
// upstream in its session before its slot is freed, and without one the
// slot stays held while the upstream still works on it. Hanging up and
// asking again never runs two under a limit of one. The slot was freed as
// soon as the exchange ended, and the next request ran beside the first.
func TestHeldMethodNeverRunsBesideTheNext(t *testing.T) {
	t.Parallel()
	requests := map[string][2]string{ // blocking, then answering at once
		"prompts/get": {
			`{"jsonrpc":"2.0","id":7,"method":"prompts/get","params":{"name":"block","arguments":{"block":"true"}}}`,
			`{"jsonrpc":"2.0","id":8,"method":"prompts/get","params":{"name":"block","arguments":{"block":"false"}}}`,
		},
		"resources/read": {
			`{"jsonrpc":"2.0","id":7,"method":"resources/read","params":{"uri":"block://slow"}}`,
			`{"jsonrpc":"2.0","id":8,"method":"resources/read","params":{"uri":"block://fast"}}`,
		},
	}
	for method, bodies := range requests {
		for _, c := range []struct {
			name    string
			session bool
			cut     bool // by upstream.timeout; else the client hangs up
		}{
			{"hang up, session", true, false},
			{"hang up, sessionless", false, false},
			{"timeout, session", true, true},
			{"timeout, sessionless", false, true},
		} {
			t.Run(method+", "+c.name, func(t *testing.T) {
				t.Parallel()
				up := newOverlapUpstream(t, !c.session)
				yaml := "  timeout: 30s\n"
				if c.cut {
					yaml = "  timeout: 300ms\n"
				}
				e := newEnv(t, setup{UpstreamURL: up.url, UpstreamYAML: yaml, Config: methodsConfig})
				tok := token(t, "acme", "alice")
				var hdr http.Header
				if c.session {
					hdr = openRawSession(t, e, tok)
				}
				if c.cut {
					if r := post(t, e.mcpURL(0), tok, bodies[0], hdr); r.Status != http.StatusGatewayTimeout {
						t.Fatalf("the blocked request: %d %s, want 504", r.Status, r.Body)
					}
				} else {
					ctx, hangUp := context.WithCancel(context.Background())
					done := make(chan struct{})
					go func() {
						defer close(done)
						_, _ = postCtx(ctx, e.mcpURL(0), tok, bodies[0], hdr)
					}()
					eventually(t, 10*time.Second, "the request to reach the upstream", func() bool { return up.started.Load() == 1 })
					hangUp()
					<-done
				}
				switch {
				case c.session:
					// Admitted once the first is settled (a hang-up is
					// noticed a little later), never beside it.
					eventually(t, 10*time.Second, "the next request to be admitted", func() bool {
						r := post(t, e.mcpURL(0), tok, bodies[1], hdr)
						return r.Status == http.StatusOK
					})
				case c.cut:
					if r := post(t, e.mcpURL(0), tok, bodies[1], hdr); r.Status != http.StatusTooManyRequests {
						t.Fatalf("the next request while the first may still run: %d %s, want 429", r.Status, r.Body)
					}
				default:
					// For the next second (the gateway notices the hang-up
					// within it) the first still runs and holds its slot.
					for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
						if r := post(t, e.mcpURL(0), tok, bodies[1], hdr); r.Status != http.StatusTooManyRequests {
							t.Fatalf("the next request while the first still runs upstream: %d %s, want 429", r.Status, r.Body)
						}
					}
				}
				if n := up.overlaps.Load(); n != 0 {
					t.Fatalf("the next request ran upstream beside the first (%d overlaps)", n)
				}
				if c.session && up.running.Load() != 0 {
					t.Fatalf("%d runs left upstream: the first was not cancelled", up.running.Load())
				}
				if !c.session && !c.cut {
					// Once the upstream has answered, the slot is free.
					up.release()
					eventually(t, 10*time.Second, "the slot to come free when the upstream answers", func() bool {
						return post(t, e.mcpURL(0), tok, bodies[1], hdr).Status == http.StatusOK
					})
				}
			})
		}
	}
}

// refreshConfig: a cached tool, one call at a time per tenant.
const refreshConfig = `
tools:
  block:
    cache: {ttl: 10m}
    limits:
      - {name: block_one, per: tenant_tool, algorithm: concurrency, limit: 1, period: 1m}
`

// An early refresh (XFetch) started by a hit runs upstream under the
// tenant's concurrency slots: the hit's call keeps its slot until the
// refresh ends, or the refresh takes one of its own. A call made while it
// runs is refused under a limit of one, never run beside it. The hit was
// settled at once, and the refresh ran outside every slot: a tenant at its
// limit drove extra upstream work through hits.
func TestEarlyRefreshRunsUnderTheTenantsSlot(t *testing.T) {
	t.Parallel()
	up := newOverlapUpstream(t, true)
	defer up.release() // before the gateway's shutdown, which waits for the refresh
	e := newEnv(t, setup{UpstreamURL: up.url, Config: refreshConfig, CacheOptions: &cache.Options{Beta: 1e9}})
	tok := token(t, "acme", "alice")
	if r := post(t, e.mcpURL(0), tok, callBody(1, "block", map[string]any{"k": 1}), nil); r.Status != http.StatusOK {
		t.Fatalf("the loading call: %d %s", r.Status, r.Body)
	}
	up.blockAll.Store(true) // the refresh blocks upstream
	// Every hit refreshes (Beta); until the refresh runs, the slot is free.
	eventually(t, 10*time.Second, "a hit's refresh to reach the upstream", func() bool {
		r := post(t, e.mcpURL(0), tok, callBody(2, "block", map[string]any{"k": 1}), nil)
		if r.Status != http.StatusOK && r.Status != http.StatusTooManyRequests {
			t.Fatalf("the hit: %d %s", r.Status, r.Body)
		}
		return up.started.Load() == 2
	})
	// The refresh runs upstream: a call of another key must not run beside it.
	answer := make(chan *response, 1)
	go func() {
		r, _ := postCtx(context.Background(), e.mcpURL(0), tok, callBody(3, "block", map[string]any{"k": 2}), nil)
		answer <- r
	}()
	var r *response
	eventually(t, 10*time.Second, "the call beside the refresh to be answered", func() bool {
		select {
		case r = <-answer:
			return true
		default:
		}
		if n := up.overlaps.Load(); n != 0 {
			t.Fatalf("a call ran upstream beside the refresh (%d overlaps)", n)
		}
		return false
	})
	if r == nil || r.Status != http.StatusTooManyRequests {
		t.Fatalf("a call while the refresh runs upstream: %v, want 429", r)
	}
	if n := up.overlaps.Load(); n != 0 {
		t.Fatalf("a call ran upstream beside the refresh (%d overlaps)", n)
	}
}
