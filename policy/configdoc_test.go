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

// configDoc reads docs/config.md: named holds the paths in backquotes in
// headings and in the first cell of table rows; rows maps those of table
// rows to whether the row says the field is "added in this release".
func configDoc(t *testing.T) (named map[string]bool, rows map[string]bool) {
	t.Helper()
	b, err := os.ReadFile("../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	quoted := regexp.MustCompile("`([^`]+)`")
	named, rows = map[string]bool{}, map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "#") {
			for _, m := range quoted.FindAllStringSubmatch(line, -1) {
				named[m[1]] = true
			}
			continue
		}
		cells := strings.Split(strings.ReplaceAll(line, `\|`, "\x00"), "|") // \| is a | inside a cell
		if !strings.HasPrefix(line, "|") || len(cells) < 3 {
			continue
		}
		for _, m := range quoted.FindAllStringSubmatch(cells[1], -1) {
			named[m[1]] = true
			rows[m[1]] = rows[m[1]] || strings.Contains(line, "added in this release")
		}
	}
	return named, rows
}

// docs/config.md documents every key the decoder accepts: the list comes
// from the decoder (schemaPaths), so a field added to it without a row in
// the reference fails here. Conversely, a row for a field the decoder does
// not accept is stale, unless it says the field is "added in this release"
// by work not merged yet (then it is logged, so that it is not forgotten).
func TestConfigDocCoversEveryField(t *testing.T) {
	t.Parallel()
	named, rows := configDoc(t)
	accepted := map[string]bool{}
	for _, p := range schemaPaths() {
		accepted[docPath(p)] = true
		if !named[docPath(p)] {
			t.Errorf("docs/config.md does not document %s (add a row: field | type | default | reload | meaning)", docPath(p))
		}
	}
	for p, pending := range rows {
		switch {
		case accepted[p]:
		case pending:
			t.Logf("%s: documented as added in this release, not accepted by this decoder yet", p)
		default:
			t.Errorf("docs/config.md has a row for %s, which the decoder does not accept", p)
		}
	}
}
