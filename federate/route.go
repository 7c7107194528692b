//lint:file-ignore SA1019 sampling, elicitation, roots and logging are deprecated in MCP 2026-07-28 but still served; the federation relays them.
package federate

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/yosida95/uritemplate/v3"
)

// errIdle is the cause of a call cut by its idle timeout.
var errIdle = errors.New("federate: upstream went silent")

// newServer returns the SDK server clients talk to. Its capabilities are
// the union of the upstreams'.
func (f *Federator) newServer(stateless bool) *mcp.Server {
	caps := &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}}
	var instructions []string
	subscribe, complete := false, false
	for _, up := range f.ups {
		up.mu.Lock()
		init := up.init
		up.mu.Unlock()
		if init == nil || init.Capabilities == nil {
			continue
		}
		c := init.Capabilities
		if c.Prompts != nil {
			caps.Prompts = &mcp.PromptCapabilities{ListChanged: true}
		}
		if c.Resources != nil {
			caps.Resources = &mcp.ResourceCapabilities{ListChanged: true}
			subscribe = subscribe || c.Resources.Subscribe
		}
		if c.Logging != nil {
			caps.Logging = &mcp.LoggingCapabilities{}
		}
		complete = complete || c.Completions != nil
		if s := strings.TrimSpace(init.Instructions); s != "" {
			instructions = append(instructions, fmt.Sprintf("%s (tools and prompts prefixed %q): %s", up.cfg.Name, up.cfg.Prefix, s))
		}
	}
	opts := &mcp.ServerOptions{Logger: f.sdkLogger(), Capabilities: caps, Instructions: strings.Join(instructions, "\n\n")}
	if complete {
		opts.CompletionHandler = f.complete(stateless)
	}
	if subscribe && !stateless {
		opts.SubscribeHandler = f.subscribe
		opts.UnsubscribeHandler = f.unsubscribe
	}
	if !stateless { // a stateless client has no upstream session of its own
		opts.RootsListChangedHandler = f.rootsChanged
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: f.opts.Name, Version: "1"}, opts)
	if stateless {
		srv.AddReceivingMiddleware(endWithRequest)
	} else {
		srv.AddReceivingMiddleware(f.passSetLevel)
	}
	return srv
}

// endWithRequest ends a stateless request's handler when its HTTP request
// ends (the client hung up; see hangUpKey): a call it made upstream is
// then cancelled there, as for a client's cancellation.
func endWithRequest(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if r, ok := ctx.Value(hangUpKey{}).(context.Context); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithCancel(ctx)
			defer cancel()
			defer context.AfterFunc(r, cancel)()
		}
		return next(ctx, method, req)
	}
}

// passSetLevel passes a client's logging/setLevel on to its upstreams once
// the SDK has recorded it.
func (f *Federator) passSetLevel(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if err == nil && method == "logging/setLevel" {
			if p, ok := req.GetParams().(*mcp.SetLoggingLevelParams); ok {
				if ss, ok := req.GetSession().(*mcp.ServerSession); ok {
					f.setLevel(ctx, ss, p.Level)
				}
			}
		}
		return res, err
	}
}

// MetaRefusal is the _meta member, true, of a tools/call result the
// federation answered itself because the upstream could not answer (not
// reached, its 429 not yet over, its breaker open, no answer). Such a
// result says nothing of the tool: a cache must not store it, even as a
// negative result.
const MetaRefusal = "io.mcpgate/refusal"

// result renders a refusal as the tool error a client and a model can act
// on: its text names the upstream and the retry time; structuredContent
// carries the same; _meta marks it (MetaRefusal).
func (r *refusal) result(up string) *mcp.CallToolResult {
	text, secs := r.text(up)
	data := map[string]any{"error": "upstream_unavailable", "upstream": up, "reason": r.reason}
	if secs > 0 {
		data["retryAfterSeconds"] = secs
	}
	return &mcp.CallToolResult{Meta: mcp.Meta{MetaRefusal: true}, IsError: true,
		Content: []mcp.Content{&mcp.TextContent{Text: text}}, StructuredContent: data}
}

// rpcError renders a refusal of a request other than tools/call.
func (r *refusal) rpcError(up string) error {
	text, _ := r.text(up)
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: text}
}

// text is the refusal's message, naming the upstream and the retry time,
// and the seconds to wait (at least 1; 0 when unknown).
func (r *refusal) text(up string) (string, int) {
	text := fmt.Sprintf("upstream %q is unavailable: %s", up, r.reason)
	if r.retry.IsZero() {
		return text, 0
	}
	secs := max(int(time.Until(r.retry).Round(time.Second)/time.Second), 1)
	return text + fmt.Sprintf("; retry in %ds", secs), secs
}

// toolHandler routes a tools/call by its exposed name.
func (f *Federator) toolHandler(stateless bool) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		name := req.Params.Name
		rt, ok := f.cat.tool(name)
		if !ok {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("unknown tool %q", name)}
		}
		timeout := rt.up.cfg.Timeout
		if d, ok := f.opts.ToolTimeouts[name]; ok && d > 0 {
			timeout = d
		}
		ctx = withForwarded(ctx, req.Extra)
		params := &mcp.CallToolParams{Meta: forwardMeta(req.Params.Meta), Name: rt.name}
		if len(req.Params.Arguments) > 0 {
			params.Arguments = req.Params.Arguments // else {} (a nil RawMessage would be sent as null)
		}
		for attempt := 0; ; attempt++ {
			cctx, c, r := f.begin(ctx, rt.up, req.Session, stateless, timeout)
			if r != nil {
				return r.result(rt.up.cfg.Name), nil
			}
			var ft string
			if tok := req.Params.GetProgressToken(); tok != nil && req.Session != nil {
				ft = f.progress.add(c, tok)
				params.SetProgressToken(ft)
			}
			res, err := c.cs.CallTool(cctx, params)
			v := c.end(cctx, err)
			if ft != "" {
				f.progress.retire(ft)
			}
			switch {
			case v.retry && attempt == 0:
				continue
			case v.refusal != nil:
				return v.refusal.result(rt.up.cfg.Name), nil
			case v.err != nil:
				return nil, v.err
			}
			return res, nil
		}
	}
}

// promptHandler routes a prompts/get by its exposed name.
func (f *Federator) promptHandler(stateless bool) mcp.PromptHandler {
	return func(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		rt, ok := f.cat.prompt(req.Params.Name)
		if !ok {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("unknown prompt %q", req.Params.Name)}
		}
		var res *mcp.GetPromptResult
		err := f.forward(withForwarded(ctx, req.Extra), rt.up, req.Session, stateless, func(ctx context.Context, cs *mcp.ClientSession) (err error) {
			p := *req.Params
			p.Name, p.Meta = rt.name, forwardMeta(p.Meta)
			res, err = cs.GetPrompt(ctx, &p)
			return err
		})
		return res, err
	}
}

// resourceHandler routes a resources/read: to the upstream that listed the
// URI, else to the first in configuration order with a template matching
// it (resourceOwner: the SDK matched some template, not necessarily that
// upstream's), else to up, the upstream of the resource or template the
// SDK matched.
func (f *Federator) resourceHandler(stateless bool, matched *upstream) mcp.ResourceHandler {
	return func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		up := matched
		if owner := f.resourceOwner(req.Params.URI); owner != nil {
			up = owner
		}
		var res *mcp.ReadResourceResult
		err := f.forward(withForwarded(ctx, req.Extra), up, req.Session, stateless, func(ctx context.Context, cs *mcp.ClientSession) (err error) {
			p := *req.Params
			p.Meta = forwardMeta(p.Meta)
			res, err = cs.ReadResource(ctx, &p)
			return err
		})
		return res, err
	}
}

// resourceOwner finds the upstream of a URI: the one that listed it, else
// the first (in configuration order) with a template matching it.
func (f *Federator) resourceOwner(uri string) *upstream {
	if up, ok := f.cat.resource(uri); ok {
		return up
	}
	f.cat.mu.RLock()
	defer f.cat.mu.RUnlock()
	for _, up := range f.ups {
		if l := f.cat.byUp[up]; l != nil {
			for _, t := range l.templates {
				if re := f.cat.matchers[t.URITemplate]; re != nil && re.MatchString(uri) {
					return up
				}
			}
		}
	}
	return nil
}

// forward runs one request other than tools/call on up, under its
// breaker and idle timeout; a refusal becomes a JSON-RPC error.
func (f *Federator) forward(ctx context.Context, up *upstream, ss *mcp.ServerSession, stateless bool, do func(context.Context, *mcp.ClientSession) error) error {
	for attempt := 0; ; attempt++ {
		cctx, c, r := f.begin(ctx, up, ss, stateless, up.cfg.Timeout)
		if r != nil {
			return r.rpcError(up.cfg.Name)
		}
		v := c.end(cctx, do(cctx, c.cs))
		switch {
		case v.retry && attempt == 0:
			continue
		case v.refusal != nil:
			return v.refusal.rpcError(up.cfg.Name)
		}
		return v.err
	}
}

// complete routes a completion/complete: by prompt name, or by resource
// template.
func (f *Federator) complete(stateless bool) func(context.Context, *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
	return func(ctx context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
		p := *req.Params
		p.Meta = forwardMeta(p.Meta)
		var up *upstream
		if p.Ref != nil {
			ref := *p.Ref
			switch ref.Type {
			case "ref/prompt":
				if rt, ok := f.cat.prompt(ref.Name); ok {
					up, ref.Name = rt.up, rt.name
				}
			case "ref/resource":
				up = f.resourceOwner(ref.URI)
			}
			p.Ref = &ref
		}
		if up == nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "completion: unknown reference"}
		}
		var res *mcp.CompleteResult
		err := f.forward(withForwarded(ctx, req.Extra), up, req.Session, stateless, func(ctx context.Context, cs *mcp.ClientSession) (err error) {
			res, err = cs.Complete(ctx, &p)
			return err
		})
		return res, err
	}
}

// forwardMeta returns the _meta of a client's request as it goes upstream:
// without the protocol's own per-request keys (io.modelcontextprotocol/...:
// a 2026-07-28 client's version, info and capabilities), which describe the
// client's exchange with the federation, not the federation's session with
// the upstream (where they would make the SDK client send the client's
// protocol version).
//
// The client's progressToken is left out too: it is the client's, unique
// in its own session only; tools/call sends a token of the federation's
// instead (progressTable), other requests none.
func forwardMeta(m mcp.Meta) mcp.Meta {
	if len(m) == 0 {
		return nil
	}
	out := make(mcp.Meta, len(m))
	for k, v := range m {
		if !strings.HasPrefix(k, "io.modelcontextprotocol/") && k != "progressToken" {
			out[k] = v
		}
	}
	return out
}

// idleTimer cancels a call's context with errIdle when the upstream has
// been silent for d; touch starts the wait again. While paused (the
// upstream waits on the client) it does not run.
type idleTimer struct {
	d      time.Duration
	t      *time.Timer
	ctx    context.Context // the call's: done once the call has ended (see relayContext)
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	paused int
	// stopped: the call has ended, and resume must not start the timer
	// again (a relayed request outlives the calls it paused).
	stopped bool
}

func withIdle(ctx context.Context, d time.Duration) (context.Context, *idleTimer) {
	ctx, cancel := context.WithCancelCause(ctx)
	it := &idleTimer{d: d, ctx: ctx, cancel: cancel}
	it.t = time.AfterFunc(d, func() { cancel(errIdle) })
	return ctx, it
}

func (it *idleTimer) touch() {
	it.mu.Lock()
	if it.paused == 0 && !it.stopped {
		it.t.Reset(it.d)
	}
	it.mu.Unlock()
}

func (it *idleTimer) stop() {
	it.mu.Lock()
	it.stopped = true
	it.t.Stop()
	it.mu.Unlock()
	it.cancel(context.Canceled)
}

// pause stops the wait while the upstream waits on the client (a relayed
// sampling or elicitation request, which a person may take minutes to
// answer); resume starts it again once no such request is pending.
func (it *idleTimer) pause() {
	it.mu.Lock()
	it.paused++
	it.t.Stop()
	it.mu.Unlock()
}

func (it *idleTimer) resume() {
	it.mu.Lock()
	if it.paused--; it.paused == 0 && !it.stopped {
		it.t.Reset(it.d)
	}
	it.mu.Unlock()
}

// templateMatcher returns the regexp of the URIs that are instances of the
// RFC 6570 template, nil for a template that does not parse.
func templateMatcher(template string) *regexp.Regexp {
	t, err := uritemplate.New(template)
	if err != nil {
		return nil
	}
	return t.Regexp()
}
