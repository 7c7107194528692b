// Calls tools through mcpgate with the official TypeScript MCP SDK client,
// as an agent would, and prints one JSON line per call: {"tool", "result"}
// or, when the SDK throws, {"tool", "error": {"name", "message", "code"}}.
//
// Usage: node call.mjs SDK_PROJECT_DIR MCP_URL TOOL[:JSON_ARGS]...
// with the bearer token in MCPGATE_TOKEN. SDK_PROJECT_DIR is an npm project
// with @modelcontextprotocol/sdk installed (the SDK is resolved from there,
// so this script needs no node_modules of its own). The client lists the
// tools first, as agents do: the SDK keeps each tool's outputSchema from
// that list and validates the structuredContent of its results against it.
import { createRequire } from 'node:module';
import { join } from 'node:path';

const [sdkDir, url, ...calls] = process.argv.slice(2);
const require = createRequire(join(sdkDir, 'package.json'));
const { Client } = require('@modelcontextprotocol/sdk/client/index.js');
const { StreamableHTTPClientTransport } = require('@modelcontextprotocol/sdk/client/streamableHttp.js');

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${process.env.MCPGATE_TOKEN}` } },
});
const client = new Client({ name: 'mcpgate-deny-test', version: '1' });
await client.connect(transport);
await client.listTools();
for (const call of calls) {
  const i = call.indexOf(':');
  const name = i < 0 ? call : call.slice(0, i);
  const args = i < 0 ? {} : JSON.parse(call.slice(i + 1));
  try {
    const result = await client.callTool({ name, arguments: args });
    console.log(JSON.stringify({ tool: name, result }));
  } catch (e) {
    console.log(JSON.stringify({ tool: name, error: { name: e?.name, message: String(e?.message ?? e), code: e?.code } }));
  }
}
await client.close();
