package federate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/mcpgate/mcpgate/internal/redact"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// listing is what one upstream exposes, under its own names.
type listing struct {
	tools     []*mcp.Tool
	prompts   []*mcp.Prompt
	resources []*mcp.Resource
	templates []*mcp.ResourceTemplate
}

// route is where an exposed name goes: an upstream and the name there.
type route struct {
	up   *upstream
	name string
}

// catalog is the union of the upstreams' listings under exposed names.
// Resource URIs and templates are not renamed: a URI routes to the
// upstream that listed it, else to the one whose template matches it (the
// SDK server matches templates); one listed by two upstreams belongs to
// the first in configuration order.
type catalog struct {
	mu        sync.RWMutex
	tools     map[string]route
	prompts   map[string]route
	resources map[string]*upstream
	templates map[string]*upstream
	matchers  map[string]*regexp.Regexp // of each template of templates (nil: it does not parse)
	byUp      map[*upstream]*listing    // what of each upstream's listing is exposed
	// listed is each upstream's resources and templates as it last
	// listed them, those another serves included: when one stops listing
	// a URI, the next in configuration order listing it serves it.
	listed map[*upstream]*listing
}

func newCatalog() *catalog {
	return &catalog{tools: map[string]route{}, prompts: map[string]route{}, resources: map[string]*upstream{},
		templates: map[string]*upstream{}, matchers: map[string]*regexp.Regexp{}, byUp: map[*upstream]*listing{}, listed: map[*upstream]*listing{}}
}

func (c *catalog) tool(name string) (route, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	r, ok := c.tools[name]
	return r, ok
}

func (c *catalog) prompt(name string) (route, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	r, ok := c.prompts[name]
	return r, ok
}

// resource returns the upstream of a listed URI or of a template.
func (c *catalog) resource(uriOrTemplate string) (*upstream, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if up, ok := c.resources[uriOrTemplate]; ok {
		return up, true
	}
	up, ok := c.templates[uriOrTemplate]
	return up, ok
}

func (c *catalog) toolNames() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]string, 0, len(c.tools))
	for n := range c.tools {
		out = append(out, n)
	}
	return out
}

func (c *catalog) toolCount(up *upstream) int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if l := c.byUp[up]; l != nil {
		return len(l.tools)
	}
	return 0
}

// Bounds of one listing of an upstream, per list method (tools/list,
// prompts/list, resources/list, resources/templates/list), whose pages are
// followed until the last: an upstream answering endless pages, or endless
// entries, would otherwise have the Federator hold and register without
// bound what it lists, again at each list_changed. A listing past either
// bound is a failed listing: at start-up New fails with ErrStart naming the
// upstream; later the error is logged and the upstream's previous listing
// stays exposed.
const (
	MaxListPages   = 1000   // pages of one list method
	MaxListEntries = 10_000 // tools, prompts, resources or resource templates
)

// errListBound is the cause of a listing past MaxListPages or
// MaxListEntries.
var errListBound = errors.New("past the federation's bounds")

// list reads everything up exposes through its shared session. An HTTP
// shared session the upstream lost (it restarted) is dropped and the
// listing made once more on a new one: a list_changed of the restarted
// upstream, heard on a client's own session, may come before the
// Federator noticed (see watchShared).
func list(ctx context.Context, up *upstream) (*listing, error) {
	for attempt := 0; ; attempt++ {
		cs, err := up.sharedSession(ctx)
		if err != nil {
			return nil, err
		}
		l, err := listOn(ctx, cs)
		if err != nil && attempt == 0 && !up.cfg.stdio() && sessionLost(err) {
			up.drop(cs)
			continue
		}
		return l, err
	}
}

// sessionLost reports whether err says the upstream session is gone (the
// SDK client ended it, or the upstream no longer knows it).
func sessionLost(err error) bool {
	return errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, mcp.ErrSessionMissing)
}

// listOn reads everything the upstream of session cs exposes.
func listOn(ctx context.Context, cs *mcp.ClientSession) (*listing, error) {
	var err error
	caps := cs.InitializeResult().Capabilities
	l := &listing{}
	if caps == nil {
		return l, nil
	}
	if caps.Tools != nil {
		if l.tools, err = listAll(ctx, "tools/list", func(ctx context.Context, cursor string) ([]*mcp.Tool, string, error) {
			res, err := cs.ListTools(ctx, &mcp.ListToolsParams{Cursor: cursor})
			if err != nil {
				return nil, "", err
			}
			return res.Tools, res.NextCursor, nil
		}); err != nil {
			return nil, err
		}
	}
	if caps.Prompts != nil {
		if l.prompts, err = listAll(ctx, "prompts/list", func(ctx context.Context, cursor string) ([]*mcp.Prompt, string, error) {
			res, err := cs.ListPrompts(ctx, &mcp.ListPromptsParams{Cursor: cursor})
			if err != nil {
				return nil, "", err
			}
			return res.Prompts, res.NextCursor, nil
		}); err != nil {
			return nil, err
		}
	}
	if caps.Resources != nil {
		if l.resources, err = listAll(ctx, "resources/list", func(ctx context.Context, cursor string) ([]*mcp.Resource, string, error) {
			res, err := cs.ListResources(ctx, &mcp.ListResourcesParams{Cursor: cursor})
			if err != nil {
				return nil, "", err
			}
			return res.Resources, res.NextCursor, nil
		}); err != nil {
			return nil, err
		}
		if l.templates, err = listAll(ctx, "resources/templates/list", func(ctx context.Context, cursor string) ([]*mcp.ResourceTemplate, string, error) {
			res, err := cs.ListResourceTemplates(ctx, &mcp.ListResourceTemplatesParams{Cursor: cursor})
			if err != nil {
				return nil, "", err
			}
			return res.ResourceTemplates, res.NextCursor, nil
		}); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// listAll follows the pages of one list method (page answers the entries
// and the next cursor, "" after the last) within MaxListPages and
// MaxListEntries.
func listAll[T any](ctx context.Context, method string, page func(ctx context.Context, cursor string) ([]T, string, error)) ([]T, error) {
	var all []T
	cursor := ""
	for pages := 1; ; pages++ {
		items, next, err := page(ctx, cursor)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", method, err)
		}
		if len(all)+len(items) > MaxListEntries {
			return nil, fmt.Errorf("%s: %w: more than %d entries", method, errListBound, MaxListEntries)
		}
		all = append(all, items...)
		if next == "" {
			return all, nil
		}
		if pages >= MaxListPages {
			return nil, fmt.Errorf("%s: %w: more than %d pages", method, errListBound, MaxListPages)
		}
		cursor = next
	}
}

// buildCatalog lists every upstream and merges the listings; a name
// exposed twice is ErrConflict naming both upstreams.
func (f *Federator) buildCatalog(ctx context.Context) (*catalog, error) {
	ctx, cancel := context.WithTimeout(ctx, f.opts.StartTimeout)
	defer cancel()
	c := newCatalog()
	var errs []error
	for _, up := range f.ups {
		l, err := list(ctx, up)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: %v", ErrStart, describe(up.cfg), redact.URLError(err)))
			continue
		}
		c.mu.Lock()
		errs = append(errs, c.exposeLocked(up, l)...)
		c.mu.Unlock()
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	c.mu.Lock()
	_, shadowed := c.reclaimLocked(f.ups, nil)
	c.mu.Unlock()
	for _, msg := range shadowed {
		f.log.Warn("federate: a resource two upstreams list goes to the first", "detail", msg)
	}
	return c, nil
}

// replace swaps up's entries for those of l in one step (a concurrent call
// never finds a kept name missing) and returns the previous listing, what
// of l is now exposed, what changed of the resources and templates
// exposed (each goes to the first upstream in configuration order that
// lists it, which a listing of any upstream may change), and the names
// not exposed.
func (c *catalog) replace(up *upstream, l *listing) (old, kept *listing, diff resourceDiff, errs []error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old = c.forgetLocked(up)
	errs = c.exposeLocked(up, l)
	diff, _ = c.reclaimLocked(up.f.ups, up)
	return old, c.byUp[up], diff, errs
}

// exposeLocked adds up's tools and prompts to a new entry of byUp: not a
// name another upstream exposes (an error each); its resources and
// templates go to listed, to be claimed after (see reclaimLocked). c.mu
// is held.
func (c *catalog) exposeLocked(up *upstream, l *listing) (errs []error) {
	checkTool := checkSchema
	if accept := up.f.opts.AcceptTool; accept != nil {
		checkTool = func(t *mcp.Tool) error {
			if err := checkSchema(t); err != nil {
				return err
			}
			return accept(up.cfg.Name, up.cfg.Prefix+t.Name)
		}
	}
	checkPrompt := func(p *mcp.Prompt) error { return up.f.attributed(up, up.cfg.Prefix+p.Name) }
	c.byUp[up] = &listing{
		tools:   exposeNamed(c.tools, up, l.tools, "tool", func(t *mcp.Tool) string { return t.Name }, checkTool, &errs),
		prompts: exposeNamed(c.prompts, up, l.prompts, "prompt", func(p *mcp.Prompt) string { return p.Name }, checkPrompt, &errs),
	}
	c.listed[up] = &listing{resources: l.resources, templates: l.templates}
	return errs
}

// ErrMisattributed refuses a prompt whose exposed name reads as another
// upstream's than the one serving it (see Federator.attributed).
var ErrMisattributed = errors.New("federate: the name reads as another upstream's")

// attributed refuses name, a prompt up exposes, when the federation's
// prefixes read it as another upstream's: scopes name prompts by their
// exposed names (prompts:a__* grants upstream a's), so a bare upstream
// exposing a__x would give it to the tokens scoped to a's prompts. Tools
// go through Options.AcceptTool instead, whose check (the gateway's) also
// weighs the upstreams' limits, which a reload changes; a prompt's
// attribution is the prefixes' alone, and those are the federation's for
// its life, so the check of every listing is the whole check.
func (f *Federator) attributed(up *upstream, name string) error {
	if named := f.upstreamNamed(name); named != nil && named != up {
		return fmt.Errorf("%w: %q reads as upstream %q's (give upstream %q a prefix)", ErrMisattributed, name, named.cfg.Name, up.cfg.Name)
	}
	return nil
}

// upstreamNamed is the upstream a name reads as, as policy.Config.UpstreamOf
// reads it: the one with the longest non-empty prefix of name, name being
// longer than it; failing that, the one upstream with prefix "" when
// exactly one has it. nil: none.
func (f *Federator) upstreamNamed(name string) *upstream {
	var best, bare *upstream
	bares := 0
	for _, u := range f.ups {
		p := u.cfg.Prefix
		switch {
		case p == "":
			bare, bares = u, bares+1
		case len(name) > len(p) && strings.HasPrefix(name, p) && (best == nil || len(p) > len(best.cfg.Prefix)):
			best = u
		}
	}
	switch {
	case best != nil:
		return best
	case bares == 1 && name != "":
		return bare
	}
	return nil
}

// resourceDiff is what a listing changed of the resources and templates
// the servers expose: those no upstream serves any more, and those to
// register (again) for the upstream now serving them.
type resourceDiff struct {
	goneResources, goneTemplates []string
	resources                    []served[*mcp.Resource]
	templates                    []served[*mcp.ResourceTemplate]
}

// served is a resource or template and the upstream serving it.
type served[T any] struct {
	up *upstream
	x  T
}

// reclaimLocked gives every URI and template listed to the first upstream
// of ups (in configuration order) listing it (every upstream's kept
// listing is updated), and returns what changed, and a message for the
// log of each entry another upstream was given. Every entry of up, whose
// listing is new (nil: none), is registered again. A URI (or template)
// two upstreams list stays with the first: two servers of one kind (two
// file servers) list the same URIs, and refusing to start would leave
// both out. c.mu is held.
func (c *catalog) reclaimLocked(ups []*upstream, up *upstream) (diff resourceDiff, shadowed []string) {
	resources, templates := map[string]*upstream{}, map[string]*upstream{}
	for _, u := range ups {
		l, prev := c.listed[u], c.byUp[u]
		if l == nil || prev == nil {
			continue
		}
		kept := &listing{tools: prev.tools, prompts: prev.prompts,
			resources: claim(resources, u, l.resources, "resource", func(r *mcp.Resource) string { return r.URI }, &shadowed),
			templates: claim(templates, u, l.templates, "resource template", func(t *mcp.ResourceTemplate) string { return t.URITemplate }, &shadowed)}
		c.byUp[u] = kept
		for _, r := range kept.resources {
			if u == up || c.resources[r.URI] != u {
				diff.resources = append(diff.resources, served[*mcp.Resource]{u, r})
			}
		}
		for _, t := range kept.templates {
			if u == up || c.templates[t.URITemplate] != u {
				diff.templates = append(diff.templates, served[*mcp.ResourceTemplate]{u, t})
			}
			if _, ok := c.matchers[t.URITemplate]; !ok {
				c.matchers[t.URITemplate] = templateMatcher(t.URITemplate)
			}
		}
	}
	for uri := range c.resources {
		if resources[uri] == nil {
			diff.goneResources = append(diff.goneResources, uri)
		}
	}
	for t := range c.templates {
		if templates[t] == nil {
			diff.goneTemplates = append(diff.goneTemplates, t)
			delete(c.matchers, t)
		}
	}
	c.resources, c.templates = resources, templates
	return diff, shadowed
}

// exposeNamed routes up's items (tools or prompts) under up's prefix and
// returns those exposed: not one whose exposed name another upstream
// exposes (ErrConflict naming both), nor one check refuses (nil: none),
// nor one up already listed (its first is kept, and the repeat logged:
// counted twice, it would overstate Health.Tools). up's previous entries
// are out of routes (forgetLocked).
func exposeNamed[T any](routes map[string]route, up *upstream, items []T, kind string, nameOf func(T) string, check func(T) error, errs *[]error) []T {
	var kept []T
	var repeated map[string]bool
	for _, x := range items {
		own := nameOf(x)
		name := up.cfg.Prefix + own
		if r, ok := routes[name]; ok && r.up == up {
			if !repeated[name] {
				up.f.log.Warn("federate: an upstream lists a name twice: its first entry is exposed", "upstream", up.cfg.Name, "kind", kind, "name", own)
				if repeated == nil {
					repeated = map[string]bool{}
				}
				repeated[name] = true
			}
			continue
		} else if ok {
			*errs = append(*errs, fmt.Errorf("%w: %s %q is exposed by upstream %q (as %q) and by upstream %q (as %q)",
				ErrConflict, kind, name, r.up.cfg.Name, r.name, up.cfg.Name, own))
			continue
		}
		if check != nil {
			if err := check(x); err != nil {
				*errs = append(*errs, fmt.Errorf("upstream %q: %s %q: %w (not exposed)", up.cfg.Name, kind, own, err))
				continue
			}
		}
		routes[name] = route{up, own}
		kept = append(kept, x)
	}
	return kept
}

// claim gives up the keys (URIs, templates) of its items that no other
// upstream holds, and returns those items; each left to another upstream
// is noted in shadowed.
func claim[T any](owners map[string]*upstream, up *upstream, items []T, kind string, keyOf func(T) string, shadowed *[]string) []T {
	var kept []T
	for _, x := range items {
		key := keyOf(x)
		if other, ok := owners[key]; ok && other != up {
			*shadowed = append(*shadowed, fmt.Sprintf("%s %q of upstream %q is served by upstream %q", kind, key, up.cfg.Name, other.cfg.Name))
			continue
		}
		owners[key] = up
		kept = append(kept, x)
	}
	return kept
}

// forgetLocked removes up's tools and prompts (its resources and
// templates are reclaimed after: see reclaimLocked) and returns its
// previous entry. c.mu is held.
func (c *catalog) forgetLocked(up *upstream) (old *listing) {
	old = c.byUp[up]
	delete(c.byUp, up)
	if old == nil {
		return &listing{}
	}
	for _, t := range old.tools {
		delete(c.tools, up.cfg.Prefix+t.Name)
	}
	for _, p := range old.prompts {
		delete(c.prompts, up.cfg.Prefix+p.Name)
	}
	return old
}

// checkSchema refuses a tool the SDK server would not take: its input
// schema must be a JSON object of type "object".
func checkSchema(t *mcp.Tool) error {
	if t.Name == "" {
		return errors.New("no name")
	}
	b, err := json.Marshal(t.InputSchema)
	if err != nil {
		return fmt.Errorf("input schema: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || m["type"] != "object" {
		return errors.New(`input schema is not an object of type "object"`)
	}
	return nil
}

// install registers the listing of up (under exposed names) on the
// servers, removing what its previous listing had, and registers the
// resources and templates of diff, removing those it says are gone.
func (f *Federator) install(up *upstream, old, l *listing, diff resourceDiff) {
	for _, srv := range []*mcp.Server{f.stateful, f.stateless} {
		if srv == nil {
			continue
		}
		stateless := srv == f.stateless
		// Only what is gone is removed: a name kept stays callable while
		// its new definition replaces the old.
		srv.RemoveTools(gone(old.tools, l.tools, func(t *mcp.Tool) string { return up.cfg.Prefix + t.Name })...)
		srv.RemovePrompts(gone(old.prompts, l.prompts, func(p *mcp.Prompt) string { return up.cfg.Prefix + p.Name })...)
		srv.RemoveResources(diff.goneResources...)
		srv.RemoveResourceTemplates(diff.goneTemplates...)
		for _, t := range l.tools {
			t2 := *t
			t2.Name = up.cfg.Prefix + t.Name
			f.safely("tool", t2.Name, func() { srv.AddTool(&t2, f.toolHandler(stateless)) })
		}
		for _, p := range l.prompts {
			p2 := *p
			p2.Name = up.cfg.Prefix + p.Name
			f.safely("prompt", p2.Name, func() { srv.AddPrompt(&p2, f.promptHandler(stateless)) })
		}
		for _, r := range diff.resources {
			f.safely("resource", r.x.URI, func() { srv.AddResource(r.x, f.resourceHandler(stateless, r.up)) })
		}
		for _, t := range diff.templates {
			f.safely("resource template", t.x.URITemplate, func() { srv.AddResourceTemplate(t.x, f.resourceHandler(stateless, t.up)) })
		}
	}
}

// safely runs an SDK registration that panics on input it refuses (an
// upstream's odd listing must not take the gateway down).
func (f *Federator) safely(kind, name string, add func()) {
	defer func() {
		if r := recover(); r != nil {
			f.log.Error("federate: an upstream's entry was refused", "kind", kind, "name", name, "err", r)
		}
	}()
	add()
}

// installAll registers every upstream's listing (at boot, before any
// refresh: see Federator.installed).
func (f *Federator) installAll() {
	f.installMu.Lock()
	defer f.installMu.Unlock()
	f.cat.mu.RLock()
	ls := make(map[*upstream]*listing, len(f.cat.byUp))
	for up, l := range f.cat.byUp {
		ls[up] = l
	}
	f.cat.mu.RUnlock()
	for _, up := range f.ups {
		if l := ls[up]; l != nil {
			diff := resourceDiff{}
			for _, r := range l.resources {
				diff.resources = append(diff.resources, served[*mcp.Resource]{up, r})
			}
			for _, t := range l.templates {
				diff.templates = append(diff.templates, served[*mcp.ResourceTemplate]{up, t})
			}
			f.install(up, &listing{}, l, diff)
		}
	}
}

// refresh lists up again (after a list_changed notification, a reconnect
// or a restart) and installs the difference. A name that now collides with
// another upstream's is not exposed and is logged. Refreshes of one
// upstream asked for while one runs make it list once more, not once each.
func (f *Federator) refresh(up *upstream) {
	select {
	case <-f.installed: // New has built the catalog (which this may then correct)
	case <-f.ctx.Done():
		return
	}
	// Coalesced: every client session of an upstream hears its
	// list_changed; one refresh lists it again for all of them.
	up.refreshAgain.Store(true)
	for up.refreshAgain.Load() {
		if !up.refreshMu.TryLock() {
			return // the refresh running will list it again
		}
		for up.refreshAgain.Swap(false) {
			f.refreshOnce(up)
		}
		up.refreshMu.Unlock()
	}
}

func (f *Federator) refreshOnce(up *upstream) {
	ctx, cancel := context.WithTimeout(f.ctx, f.opts.StartTimeout)
	defer cancel()
	l, err := list(ctx, up)
	switch {
	case err == nil:
	case errors.Is(err, errListBound):
		// Not a passing failure: the upstream (or what it lists) is at
		// fault, and it is kept as it was listed before.
		f.log.Error("federate: an upstream's listing is too large: its previous one stays", "upstream", up.cfg.Name, "err", err)
		return
	default:
		if f.ctx.Err() == nil {
			f.log.Warn("federate: cannot list an upstream again", "upstream", up.cfg.Name, "err", redact.URLError(err))
		}
		return
	}
	// One upstream's catalog update and install at a time: another's
	// refresh in between could install a name this one's install then
	// removes as gone (the catalog routing it, the servers not listing it).
	f.installMu.Lock()
	defer f.installMu.Unlock()
	old, kept, diff, errs := f.cat.replace(up, l)
	for _, err := range errs {
		f.log.Error("federate: upstream entry not exposed", "upstream", up.cfg.Name, "err", err)
	}
	f.install(up, old, kept, diff)
}

// gone returns the keys of old that are not in now.
func gone[T any](old, now []T, key func(T) string) []string {
	keep := make(map[string]bool, len(now))
	for _, x := range now {
		keep[key(x)] = true
	}
	var out []string
	for _, x := range old {
		if k := key(x); !keep[k] {
			out = append(out, k)
		}
	}
	return out
}
