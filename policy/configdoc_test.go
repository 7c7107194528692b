package policy

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The walk reaches fields at every depth: below named entries, below list
// elements and below mappings that are themselves fields.
func TestSchemaPathsReachEveryDepth(t *testing.T) {
	t.Parallel()
	got := schemaPaths()
	for _, p := range []string{
		"listen", "upstream.url", "auth.jwt.leeway", "global[].algorithm", "tiers.<name>.limits[].burst",
		"tools.<name>.cache.ttl", "tools.<name>.cost.from_result", "cache.warm[].args",
		"breaker.identical_calls.within", "sessions.idle_timeout",
	} {
		if !slices.Contains(got, p) {
			t.Errorf("schemaPaths misses %s", p)
		}
	}
	for _, p := range got {
		if strings.Contains(p, schemaName) || strings.Contains(p, "[0]") {
			t.Errorf("%s: placeholder left in a path", p)
		}
	}
}

// ruleLists are where lists of rules appear; docs/config.md documents a
// rule's fields once, as <rule>.FIELD.
var ruleLists = regexp.MustCompile(`^(global|tiers\.<name>\.limits|tools\.<name>\.limits|upstreams\[\]\.limits)\[\]\.`)

// docPath is the name docs/config.md gives decoder path p.
func docPath(p string) string { return ruleLists.ReplaceAllString(p, "<rule>.") }

// configDocFile is the configuration reference, relative to this package.
const configDocFile = "../docs/config.md"

// docRow is one row of a field table of docs/config.md:
// | field | type | default | reload | meaning |.
type docRow struct {
	line int    // 1-based line in docs/config.md
	def  string // the default cell, trimmed
}

// docBlock is one ```yaml block of docs/config.md.
type docBlock struct {
	line    int    // 1-based line of its opening fence
	section string // the text of the nearest heading above it, without the #s
	text    string
}

// configPage is what the tests read from docs/config.md.
type configPage struct {
	// named holds the paths in backquotes in headings and in the first
	// cell of table rows.
	named map[string]bool
	// rows holds the paths in backquotes in the first cell of table rows.
	rows   map[string]docRow
	blocks []docBlock
}

// configDoc reads docs/config.md. Fenced code is not read as headings or
// rows; ```yaml blocks are collected as examples.
func configDoc(t *testing.T) configPage {
	t.Helper()
	b, err := os.ReadFile(configDocFile)
	if err != nil {
		t.Fatal(err)
	}
	quoted := regexp.MustCompile("`([^`]+)`")
	page := configPage{named: map[string]bool{}, rows: map[string]docRow{}}
	section := ""
	var block *docBlock // the ```yaml block being read
	inFence := false
	for i, line := range strings.Split(string(b), "\n") {
		n := i + 1
		if fence, ok := strings.CutPrefix(line, "```"); ok {
			switch {
			case inFence && block != nil:
				page.blocks = append(page.blocks, *block)
				block, inFence = nil, false
			case inFence:
				inFence = false
			default:
				inFence = true
				if strings.TrimSpace(fence) == "yaml" {
					block = &docBlock{line: n, section: section}
				}
			}
			continue
		}
		if inFence {
			if block != nil {
				block.text += line + "\n"
			}
			continue
		}
		if strings.HasPrefix(line, "#") {
			section = strings.TrimSpace(strings.TrimLeft(line, "#"))
			for _, m := range quoted.FindAllStringSubmatch(line, -1) {
				page.named[m[1]] = true
			}
			continue
		}
		cells := strings.Split(strings.ReplaceAll(line, `\|`, "\x00"), "|") // \| is a | inside a cell
		if !strings.HasPrefix(line, "|") || len(cells) < 3 {
			continue
		}
		def := ""
		if len(cells) > 3 {
			def = strings.TrimSpace(strings.ReplaceAll(cells[3], "\x00", "|"))
		}
		for _, m := range quoted.FindAllStringSubmatch(cells[1], -1) {
			page.named[m[1]] = true
			if first, dup := page.rows[m[1]]; dup {
				t.Errorf("%s:%d: a second row for %s (the first is at line %d)", configDocFile, n, m[1], first.line)
				continue
			}
			page.rows[m[1]] = docRow{line: n, def: def}
		}
	}
	if inFence {
		t.Errorf("%s: a code block is not closed", configDocFile)
	}
	return page
}

// docs/config.md documents every key the decoder accepts: the list comes
// from the decoder (schemaPaths), so a field added to it without a row in
// the reference fails here. Conversely, a row for a field the decoder does
// not accept is stale, and fails too: the page documents this decoder, not
// work that is not merged yet.
func TestConfigDocCoversEveryField(t *testing.T) {
	t.Parallel()
	page := configDoc(t)
	accepted := map[string]bool{}
	for _, p := range schemaPaths() {
		accepted[docPath(p)] = true
		if !page.named[docPath(p)] {
			t.Errorf("docs/config.md does not document %s (add a row: field | type | default | reload | meaning)", docPath(p))
		}
	}
	for p, r := range page.rows {
		if !accepted[p] {
			t.Errorf("%s:%d: a row for %s, which the decoder does not accept (remove the row, or the decoder misses the field)", configDocFile, r.line, p)
		}
	}
}
