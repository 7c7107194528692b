package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
)

// tsProject is the npm project that holds the TypeScript MCP SDK and a Node
// 22 (installed by scripts/test for the conformance suite).
const tsProject = "../internal/conformance/testdata/node"

// tsCall is one line printed by testdata/tsclient/call.mjs.
type tsCall struct {
	Tool   string          `json:"tool"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Name    string `json:"name"`
		Message string `json:"message"`
		Code    any    `json:"code"`
	} `json:"error"`
}

// requireTSClient returns the Node binary and the SDK project, skipping the
// test when they are not installed (failing when CI is true: CI never skips).
func requireTSClient(t *testing.T) (node, project string) {
	t.Helper()
	project, err := filepath.Abs(tsProject)
	if err == nil {
		node, err = filepath.EvalSymlinks(filepath.Join(project, "node_modules", ".bin", "node"))
	}
	if err == nil {
		_, err = os.Stat(filepath.Join(project, "node_modules", "@modelcontextprotocol", "sdk", "package.json"))
	}
	if err != nil {
		msg := fmt.Sprintf("the TypeScript MCP SDK and Node 22 are not installed (%v); scripts/test installs them", err)
		testenv.Missing(t, msg)
	}
	return node, project
}

// runTSClient runs call.mjs against endpoint with tok and returns its lines.
func runTSClient(t *testing.T, endpoint, tok string, calls ...string) []tsCall {
	t.Helper()
	node, project := requireTSClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := append([]string{filepath.Join("testdata", "tsclient", "call.mjs"), project, endpoint}, calls...)
	cmd := exec.CommandContext(ctx, node, args...)
	cmd.Env = append(os.Environ(), "MCPGATE_TOKEN="+tok)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node call.mjs: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	var out []tsCall
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var c tsCall
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("call.mjs printed %q: %v", sc.Text(), err)
		}
		out = append(out, c)
	}
	if len(out) != len(calls) {
		t.Fatalf("call.mjs printed %d results for %d calls:\n%s\nstderr:\n%s", len(out), len(calls), stdout.String(), stderr.String())
	}
	return out
}

// tsDenyConfig is denyConfig with the http override on update_product, so
// that search (which declares an outputSchema) is denied as a result.
const tsDenyConfig = `
default_tier: free
tiers:
  free:
    deny_as: result
    limits:
      - {name: per_tool, per: tenant_tool, algorithm: fixed_window, limit: 1, period: 1m}
tools:
  update_product: {deny_as: http}
`

// The TypeScript SDK client, which lists the tools first (as agents do,
// and as it must to validate results against output schemas): under
// deny_as: result callTool resolves to a result with isError whose text
// tells the retry time and whose _meta holds the denial, with the denial
// as structuredContent too for echo; for search, which declares an
// outputSchema, without structuredContent, which the SDK would validate
// against the schema even with isError and throw on (typescript-sdk issue
// 1943). Under deny_as: http it throws a generic HTTP error (the body is
// in its message as text, the status in its code).
func TestDenyAsTypeScriptClient(t *testing.T) {
	t.Parallel()
	e := newEnv(t, setup{Config: tsDenyConfig})
	calls := runTSClient(t, e.mcpURL(0), token(t, "acme", "alice"),
		`echo:{"text":"x"}`, `echo:{"text":"x"}`,
		`update_product:{"id":"p1"}`, `update_product:{"id":"p1"}`,
		`search:{"query":"q"}`, `search:{"query":"q"}`)
	for _, i := range []int{0, 2, 4} {
		if c := calls[i]; c.Error != nil || isErrorResult(c.Result) {
			t.Fatalf("first %s: %+v %s", c.Tool, c.Error, c.Result)
		}
	}

	res := tsDenied(t, calls[1])
	if res.StructuredContent == nil || *res.StructuredContent != *res.Meta.Denial {
		t.Fatalf("denied echo: result %+v: want structuredContent, the same as _meta's denial", res)
	}

	c := calls[3]
	if c.Error == nil {
		t.Fatalf("denied update_product under deny_as: http: the SDK resolved to %s, want a throw", c.Result)
	}
	if code, _ := c.Error.Code.(float64); code != 429 {
		t.Fatalf("denied update_product under deny_as: http: %+v, want the SDK's HTTP 429 error", *c.Error)
	}

	if res := tsDenied(t, calls[5]); res.StructuredContent != nil || strings.Contains(string(calls[5].Result), "structuredContent") {
		t.Fatalf("denied search: result %s: want no structuredContent (search declares an outputSchema)", calls[5].Result)
	}
}

// tsDenied checks that the SDK resolved c to a result-mode denial by the
// per_tool rule: isError, one text telling the retry time, and the denial
// in _meta.
func tsDenied(t *testing.T, c tsCall) toolResult {
	t.Helper()
	if c.Error != nil {
		t.Fatalf("denied %s under deny_as: result: the SDK threw %+v", c.Tool, *c.Error)
	}
	var res toolResult
	if err := json.Unmarshal(c.Result, &res); err != nil || !res.IsError || len(res.Content) != 1 || res.Meta.Denial == nil {
		t.Fatalf("denied %s: result %s (%v): want isError, one text, the denial in _meta", c.Tool, c.Result, err)
	}
	d := *res.Meta.Denial
	if ra := d.RetryAfterSeconds; ra < 1 || ra > 60 || d.Scope != "tenant_tool" || d.Rule != "per_tool" {
		t.Fatalf("denied %s: _meta denial %+v: want the per_tool denial (tenant_tool), retry in 1..60 s", c.Tool, d)
	}
	if !strings.Contains(res.Content[0].Text, fmt.Sprintf("retry in %d second", d.RetryAfterSeconds)) {
		t.Fatalf("denied %s: text %q does not tell the retry time (%d s)", c.Tool, res.Content[0].Text, d.RetryAfterSeconds)
	}
	return res
}
