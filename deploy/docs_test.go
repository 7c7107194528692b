package deploy_test

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/mcpgate/mcpgate/policy"
)

// fencedBlocks returns the bodies of the fenced code blocks of a Markdown
// file whose info string is lang (indented blocks included, dedented).
// deployDoc is the deployment page the tests hold to the code.
var deployDoc = filepath.Join("..", "docs", "deploy.md")

// onlyBlock returns the one fenced lang block of path that starts with
// prefix, failing when there is none or more than one.
func onlyBlock(t *testing.T, path, lang, prefix string) string {
	t.Helper()
	var found string
	for _, b := range fencedBlocks(t, path, lang) {
		if strings.HasPrefix(b, prefix) {
			if found != "" {
				t.Fatalf("%s: two %s blocks start with %q", path, lang, prefix)
			}
			found = b
		}
	}
	if found == "" {
		t.Fatalf("%s: no %s block starting with %q", path, lang, prefix)
	}
	return found
}

func fencedBlocks(t *testing.T, path, lang string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out    []string
		body   strings.Builder
		indent string
		in     bool
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case !in && trimmed == "```"+lang:
			in, indent = true, line[:len(line)-len(strings.TrimLeft(line, " "))]
			body.Reset()
		case in && trimmed == "```":
			in = false
			out = append(out, body.String())
		case in:
			body.WriteString(strings.TrimPrefix(line, indent) + "\n")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// The ElastiCache / Valkey example of docs/deploy.md passes the config
// parser, takes its passwords from the environment (no literal password),
// and uses only variables the page shows how to set in the Deployment.
func TestDeployDocRedisExample(t *testing.T) {
	doc := deployDoc
	example := onlyBlock(t, doc, "yaml", "store:\n")
	var vars []string
	for _, m := range envRef.FindAllStringSubmatch(example, -1) {
		if !slices.Contains(vars, m[1]) {
			vars = append(vars, m[1])
		}
	}
	if len(vars) == 0 {
		t.Fatalf("the Redis example references no ${NAME}: its passwords must come from the environment\n%s", example)
	}
	text, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vars {
		if !strings.Contains(string(text), "- name: "+v+"\n") {
			t.Errorf("%s: the Redis example uses ${%s}, but no env entry of the page sets it", doc, v)
		}
	}

	const head = "upstream: {url: \"http://u/mcp\"}\nauth: {jwt: {hs256_secret_env: MCPGATE_JWT_SECRET}}\n"
	t.Setenv("MCPGATE_JWT_SECRET", strings.Repeat("s", 32))

	// Unset, each variable is refused rather than expanded to nothing.
	for _, v := range vars {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	_, err = policy.Parse("deploy.md", []byte(head+example))
	if err == nil || !strings.Contains(err.Error(), "environment variable "+vars[0]+" is not set") {
		t.Errorf("the Redis example with %s unset: %v, want an error naming it", vars[0], err)
	}

	// Set (percent-encoded, as the page says), each lands in its URL's
	// password, decoded.
	for _, v := range vars {
		t.Setenv(v, "p%23ss-"+v)
	}
	cfg, err := policy.Parse("deploy.md", []byte(head+example))
	if err != nil {
		t.Fatalf("the Redis example does not parse:\n%v\n%s", err, example)
	}
	for _, w := range cfg.Warnings {
		t.Errorf("config warning: %v", w)
	}
	for name, addrs := range map[string][]string{"store.redis": cfg.Store.Redis, "cache.redis": cfg.Cache.Redis} {
		if len(addrs) != 1 {
			t.Errorf("%s %q, want one URL", name, addrs)
			continue
		}
		opt, err := rueidis.ParseURL(addrs[0])
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if v := strings.TrimPrefix(opt.Password, "p#ss-"); v == opt.Password || !slices.Contains(vars, v) {
			t.Errorf("%s: password %q, want one expanded from the example's variables %q", name, opt.Password, vars)
		}
	}
}
