package deploy_test

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/mcpgate/mcpgate/cache"
	"github.com/mcpgate/mcpgate/keyspace"
)

// The ACL user of docs/deploy.md, and the placeholder of its password.
const (
	aclUser        = "mcpgate"
	aclPlaceholder = ">PASSWORD"
)

// aclOptional are the commands mcpgate may send that the documented rule
// leaves out on purpose, with why; docs/deploy.md names each as +command.
var aclOptional = map[string]string{
	"config|get":     "the startup eviction check (cache.CheckEviction): refused, it is skipped with a warning",
	"client|setinfo": "rueidis names itself on each connection (Redis 7.2+) and ignores a refusal",
	"publish":        "the cache scripts' fallback where SPUBLISH is missing (Redis < 7)",
}

// aclClientCommands are the commands rueidis sends by itself on mcpgate's
// behalf (cmds.go, pipe.go, cluster.go, sentinel.go of rueidis): keep-alive
// PING, the Cluster slot map (CLUSTER SLOTS, or CLUSTER SHARDS from version
// 8), ASKING before a command redirected by ASK, ROLE on the master a
// Sentinel names, and the reset of a dedicated connection returned to the
// pool (UNSUBSCRIBE, PUNSUBSCRIBE, SUNSUBSCRIBE, DISCARD).
var aclClientCommands = []string{
	"ping", "cluster|slots", "cluster|shards", "asking", "role",
	"unsubscribe", "punsubscribe", "sunsubscribe", "discard",
}

// aclRule returns the words of the ACL SETUSER rule of docs/deploy.md: the
// one text block that starts with it, on one line (it is pasted into
// redis-cli as it is).
func aclRule(t *testing.T) []string {
	t.Helper()
	rule := onlyBlock(t, deployDoc, "text", "ACL SETUSER "+aclUser+" ")
	if strings.Count(strings.TrimSpace(rule), "\n") != 0 {
		t.Fatalf("%s: the ACL rule spans several lines; redis-cli takes one:\n%s", deployDoc, rule)
	}
	return strings.Fields(rule)
}

// aclGrants returns the commands rule allows one by one (its +command
// words), lower case.
func aclGrants(rule []string) map[string]bool {
	g := map[string]bool{}
	for _, w := range rule {
		if strings.HasPrefix(w, "+") && !strings.HasPrefix(w, "+@") {
			g[strings.ToLower(w[1:])] = true
		}
	}
	return g
}

var (
	builderCall   = regexp.MustCompile(`\.B\(\)\.([A-Z][A-Za-z]*)\(`)
	arbitraryCall = regexp.MustCompile(`\.B\(\)\.Arbitrary\(([^)]*)\)`)
	quoted        = regexp.MustCompile(`"([A-Za-z]+)"`)
	scriptCall    = regexp.MustCompile(`call\((?:redis\.call,\s*)?'([A-Za-z]+)'`)
	anyCall       = regexp.MustCompile(`call\(`)
	// forwardCall is a wrapper forwarding its caller's command (the
	// library's pcall): the command is read at the wrapper's call sites.
	forwardCall = regexp.MustCompile(`call\(\.\.\.\)`)
)

// builderCommand is the command a rueidis builder method names:
// FunctionLoad is function|load, Hgetall is hgetall.
func builderCommand(name string) string {
	var words []string
	start := 0
	for i, r := range name {
		if i > 0 && unicode.IsUpper(r) {
			words = append(words, name[start:i])
			start = i
		}
	}
	words = append(words, name[start:])
	return strings.ToLower(strings.Join(words, "|"))
}

// containers are the commands whose second word names a subcommand in an
// ACL rule (cluster|slots).
var containers = []string{"acl", "client", "cluster", "command", "config", "function", "memory", "object", "pubsub", "script", "xinfo"}

// sentCommands returns every command the gateway's Go code builds (B()
// builders and Arbitrary calls in non-test files), and every command its
// Lua scripts call (.lua files, and Go files that hold scripts), each with
// where it is: file:line. bench (a load generator) and the test helpers
// are left out.
func sentCommands(t *testing.T) map[string][]string {
	t.Helper()
	root := ".."
	out := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || rel == "bench" || rel == "internal/testenv") {
				return filepath.SkipDir
			}
			return nil
		}
		lua, goFile := strings.HasSuffix(rel, ".lua"), strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go")
		if !lua && !goFile {
			return nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		script := lua || strings.Contains(string(text), "redis.call")
		for i, line := range strings.Split(string(text), "\n") {
			at := fmt.Sprintf("%s:%d", rel, i+1)
			add := func(cmd string) { out[cmd] = append(out[cmd], at) }
			if goFile {
				for _, m := range builderCall.FindAllStringSubmatch(line, -1) {
					if m[1] != "Arbitrary" {
						add(builderCommand(m[1]))
					}
				}
				for _, m := range arbitraryCall.FindAllStringSubmatch(line, -1) {
					var words []string
					for _, q := range quoted.FindAllStringSubmatch(m[1], -1) {
						words = append(words, strings.ToLower(q[1]))
					}
					switch {
					case len(words) == 0:
						t.Errorf("%s: an Arbitrary command this test cannot read: %s", at, m[0])
					case len(words) > 1 && slices.Contains(containers, words[0]):
						add(words[0] + "|" + words[1])
					default:
						add(words[0])
					}
				}
			}
			if script {
				// Redis checks what a script calls against the user too.
				ms := scriptCall.FindAllStringSubmatch(line, -1)
				n := len(anyCall.FindAllString(line, -1)) - len(forwardCall.FindAllString(line, -1))
				if n != len(ms) {
					t.Errorf("%s: a script call whose command this test cannot read: %s", at, strings.TrimSpace(line))
				}
				for _, m := range ms {
					add(strings.ToLower(m[1]))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 10 || out["time"] == nil {
		t.Fatalf("found only %d commands in the sources (TIME at %q): the scan is broken", len(out), out["time"])
	}
	return out
}

// The ACL rule of docs/deploy.md grants every command the gateway's code,
// its scripts and its client send, except the optional ones the page names,
// and nothing else; its key and channel patterns are mcpgate's.
func TestDeployDocACLRule(t *testing.T) {
	rule := aclRule(t)
	grants := aclGrants(rule)
	sent := sentCommands(t)
	for _, c := range aclClientCommands {
		sent[c] = append(sent[c], "rueidis")
	}
	doc, err := os.ReadFile(deployDoc)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range slices.Sorted(maps.Keys(sent)) {
		if why, ok := aclOptional[c]; ok {
			if grants[c] {
				t.Errorf("the rule grants %s, documented as optional (%s)", c, why)
			}
			continue
		}
		if !grants[c] {
			t.Errorf("the rule does not grant %s, sent at %s", c, strings.Join(sent[c], ", "))
		}
	}
	for c := range grants {
		if _, ok := sent[c]; !ok {
			t.Errorf("the rule grants %s, which mcpgate never sends", c)
		}
	}
	for c, why := range aclOptional {
		if !strings.Contains(string(doc), "`+"+c+"`") {
			t.Errorf("docs/deploy.md does not name the optional +%s (%s)", c, why)
		}
	}
	for _, want := range []string{"reset", "on", aclPlaceholder, "resetchannels", "-@all"} {
		if !slices.Contains(rule, want) {
			t.Errorf("the rule lacks %q: %s", want, strings.Join(rule, " "))
		}
	}
	var keys, channels []string
	for _, w := range rule {
		switch {
		case strings.HasPrefix(w, "+@"), w == "allkeys", w == "allchannels", w == "allcommands":
			t.Errorf("the rule grants a whole category or everything: %s", w)
		case strings.HasPrefix(w, "~"), strings.HasPrefix(w, "%"):
			keys = append(keys, w)
		case strings.HasPrefix(w, "&"):
			channels = append(channels, w)
		}
	}
	if !slices.Equal(keys, []string{"~" + keyspace.Prefix + "*"}) {
		t.Errorf("key patterns %q, want [~%s*]", keys, keyspace.Prefix)
	}
	key, err := cache.NewKey(cache.Tenant("acme"), "search", json.RawMessage(`{"q":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	ch := keyspace.CacheChannel(key.String())
	if len(channels) != 1 {
		t.Fatalf("channel patterns %q, want one", channels)
	}
	prefix, ok := strings.CutSuffix(channels[0][1:], "*")
	if !ok || strings.ContainsAny(prefix, "*?[\\") || !strings.HasPrefix(prefix, keyspace.Prefix) || !strings.HasPrefix(ch, prefix) {
		t.Errorf("channel pattern %s: want PREFIX* under %s that the cache's channels (%s) match", channels[0], keyspace.Prefix, ch)
	}
}
