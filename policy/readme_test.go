package policy

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// README.md's "The two commands" lists the Debian packages scripts/test
// installs when missing: every need_deb line of the script, so that a
// package added there is not left out of the page. (It lives with the
// tests that hold docs/config.md to the decoder: the package that checks
// the documentation against what it describes.)
func TestReadmeListsTheTestScriptsPackages(t *testing.T) {
	t.Parallel()
	script, err := os.ReadFile("../scripts/test")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	needs := regexp.MustCompile(`(?m)^need_deb \S+ (\S+)$`).FindAllStringSubmatch(string(script), -1)
	if len(needs) == 0 {
		t.Fatal("no need_deb line in scripts/test")
	}
	for _, m := range needs {
		if !strings.Contains(string(readme), "`"+m[1]+"`") {
			t.Errorf("scripts/test installs the Debian package %s; README.md does not say so", m[1])
		}
	}
}
