package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// federatedTSClient is the TypeScript SDK client run by
// TestFederationTypeScriptClient: node client.mjs SDK_PROJECT_DIR MCP_URL
// CALLS_JSON, with the bearer token in MCPGATE_TOKEN. CALLS_JSON is a list
// of {"name", "arguments"?, "progress"?}; it prints one JSON object: the
// listed tool names, and per call its result (or the error the SDK threw)
// and the progress notifications its onprogress saw before callTool
// resolved (the SDK drops those of a request already answered).
const federatedTSClient = `
import { createRequire } from 'node:module';
import { join } from 'node:path';

const [sdkDir, url, callsJSON] = process.argv.slice(2);
const require = createRequire(join(sdkDir, 'package.json'));
const { Client } = require('@modelcontextprotocol/sdk/client/index.js');
const { StreamableHTTPClientTransport } = require('@modelcontextprotocol/sdk/client/streamableHttp.js');

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: 'Bearer ' + process.env.MCPGATE_TOKEN } },
});
const client = new Client({ name: 'mcpgate-federation-ts-test', version: '1' });
await client.connect(transport);
const out = { protocolVersion: transport.protocolVersion, tools: [], calls: [] };
let cursor;
do {
  const page = await client.listTools(cursor ? { cursor } : {});
  out.tools.push(...page.tools.map((t) => t.name));
  cursor = page.nextCursor;
} while (cursor);
for (const call of JSON.parse(callsJSON)) {
  const progress = [];
  const options = call.progress ? { onprogress: (p) => progress.push(p.progress) } : {};
  const params = { name: call.name };
  if (call.arguments !== undefined) params.arguments = call.arguments;
  try {
    const result = await client.callTool(params, undefined, options);
    out.calls.push({ tool: call.name, result, progress: [...progress] });
  } catch (e) {
    out.calls.push({ tool: call.name, error: String(e?.message ?? e), progress: [...progress] });
  }
}
await client.close();
console.log(JSON.stringify(out));
`

// tsFederatedCall is one call of federatedTSClient's output.
type tsFederatedCall struct {
	Tool   string `json:"tool"`
	Result *struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		IsError bool `json:"isError"`
	} `json:"result"`
	Error    string    `json:"error"`
	Progress []float64 `json:"progress"`
}

func (c tsFederatedCall) text() string {
	if c.Result == nil {
		return ""
	}
	var b strings.Builder
	for _, x := range c.Result.Content {
		b.WriteString(x.Text)
	}
	return b.String()
}

// The official TypeScript SDK client through a federated gateway (the Go
// SDK demo upstream over HTTP, server-everything as a stdio process) lists
// the merged tools, calls tools of both upstreams (one without an
// arguments member, as the SDK sends a call without arguments), and gets
// every progress notification of a call before its answer, from either
// upstream, several times in a row.
func TestFederationTypeScriptClient(t *testing.T) {
	node, project := requireNode(t)
	endpoint := everythingGateway(t)
	script := filepath.Join(t.TempDir(), "client.mjs")
	if err := os.WriteFile(script, []byte(federatedTSClient), 0o600); err != nil {
		t.Fatal(err)
	}

	const rounds = 3
	type call struct {
		Name      string         `json:"name"`
		Arguments map[string]any `json:"arguments,omitempty"`
		Progress  bool           `json:"progress,omitempty"`
	}
	calls := []call{
		{Name: "demo__echo", Arguments: map[string]any{"text": "from TypeScript"}},
		{Name: "everything__get-sum", Arguments: map[string]any{"a": 20, "b": 22}},
		{Name: "everything__get-tiny-image"}, // no arguments member
	}
	for range rounds {
		calls = append(calls,
			// progress at 1/4, 2/4, 3/4 of 200ms, then the answer
			call{Name: "demo__slow", Arguments: map[string]any{"ms": 200}, Progress: true},
			// progress 1, 2, 3 (the last one just before the answer)
			call{Name: "everything__trigger-long-running-operation", Arguments: map[string]any{"duration": 0.3, "steps": 3}, Progress: true})
	}
	callsJSON, err := json.Marshal(calls)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script, project, endpoint, string(callsJSON))
	cmd.Env = append(os.Environ(), "MCPGATE_TOKEN="+token(t, "acme", "alice"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node client.mjs: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	var out struct {
		ProtocolVersion string            `json:"protocolVersion"`
		Tools           []string          `json:"tools"`
		Calls           []tsFederatedCall `json:"calls"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("client.mjs printed %q: %v\nstderr:\n%s", stdout.String(), err, stderr.String())
	}
	if len(out.Calls) != len(calls) {
		t.Fatalf("client.mjs made %d calls, want %d: %s", len(out.Calls), len(calls), stdout.String())
	}
	t.Logf("protocol %s, %d tools", out.ProtocolVersion, len(out.Tools))

	for _, want := range []string{"demo__echo", "demo__slow", "everything__echo", "everything__get-sum",
		"everything__get-tiny-image", "everything__trigger-long-running-operation"} {
		if !slices.Contains(out.Tools, want) {
			t.Errorf("tools/list: no %s in %q", want, out.Tools)
		}
	}

	for i, c := range out.Calls {
		if c.Error != "" || c.Result == nil || c.Result.IsError {
			t.Errorf("call %d, %s: threw %q, result %+v", i, c.Tool, c.Error, c.Result)
			continue
		}
		switch c.Tool {
		case "demo__echo":
			if c.text() != "from TypeScript" {
				t.Errorf("demo__echo: %q", c.text())
			}
		case "everything__get-sum":
			if c.text() != "The sum of 20 and 22 is 42." {
				t.Errorf("everything__get-sum: %q", c.text())
			}
		case "everything__get-tiny-image":
			if !slices.ContainsFunc(c.Result.Content, func(x struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}) bool {
				return x.Type == "image"
			}) {
				t.Errorf("everything__get-tiny-image: no image in %+v", c.Result.Content)
			}
		case "demo__slow":
			if !slices.Equal(c.Progress, []float64{1, 2, 3}) {
				t.Errorf("call %d, demo__slow: progress before the answer %v, want [1 2 3]", i, c.Progress)
			}
		case "everything__trigger-long-running-operation":
			if !slices.Equal(c.Progress, []float64{1, 2, 3}) {
				t.Errorf("call %d, everything__trigger-long-running-operation: progress before the answer %v, want [1 2 3]", i, c.Progress)
			}
		}
	}
	if t.Failed() {
		t.Logf("client stderr:\n%s", stderr.String())
	}
}
