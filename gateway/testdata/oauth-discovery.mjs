// OAuth discovery against mcpgate with the TypeScript MCP SDK's own client
// code, run by TestTypeScriptSDKOAuthDiscovery (gateway/oauth_node_test.go).
//
//   MCP_URL=http://127.0.0.1:PORT/mcp SDK_PROJECT=<npm project holding
//   @modelcontextprotocol/sdk> node oauth-discovery.mjs
//
// It does what a client without a token does, twice:
//   1. the auth helpers step by step: a POST without a token, the
//      WWW-Authenticate params of the 401 (extractWWWAuthenticateParams),
//      discoverOAuthProtectedResourceMetadata with that resource_metadata
//      URL, then discoverAuthorizationServerMetadata on the first
//      authorization server;
//   2. the real thing: Client.connect over StreamableHTTPClientTransport with
//      an OAuthClientProvider (a pre-registered client). The 401 makes the
//      SDK discover everything and call redirectToAuthorization; the script
//      plays the browser (follows the authorization URL to its redirect),
//      hands the code to transport.finishAuth, connects again with the token
//      and lists the tools.
// It prints one JSON object with what it found; the Go test asserts on it.
// Every request the SDK sends is recorded in "fetched".
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const mcpURL = process.env.MCP_URL;
const project = process.env.SDK_PROJECT;
if (!mcpURL || !project) {
  console.error('set MCP_URL and SDK_PROJECT');
  process.exit(2);
}

// The script lives outside the npm project, so bare imports would not
// resolve: load the SDK's ESM build by path (its "./*" export maps to
// dist/esm/*).
const sdk = (path) => import(pathToFileURL(join(project, 'node_modules/@modelcontextprotocol/sdk/dist/esm', path)).href);
const authLib = await sdk('client/auth.js');
const { Client } = await sdk('client/index.js');
const { StreamableHTTPClientTransport } = await sdk('client/streamableHttp.js');

const fetched = [];
const recordingFetch = async (url, init) => {
  const res = await fetch(url, init);
  fetched.push({ method: init?.method ?? 'GET', url: String(url), status: res.status });
  return res;
};

// 1. Step by step.
const res = await recordingFetch(mcpURL, {
  method: 'POST',
  headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
  body: JSON.stringify({
    jsonrpc: '2.0', id: 1, method: 'initialize',
    params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'probe', version: '1' } },
  }),
});
await res.body?.cancel();
const challenge = authLib.extractWWWAuthenticateParams(res);
const resourceMetadata = await authLib.discoverOAuthProtectedResourceMetadata(
  mcpURL, { resourceMetadataUrl: challenge.resourceMetadataUrl }, recordingFetch);
const authorizationServerMetadata = await authLib.discoverAuthorizationServerMetadata(
  resourceMetadata.authorization_servers[0], { fetchFn: recordingFetch });

// 2. The client's own flow.
const redirectUrl = 'http://127.0.0.1:1/callback';
const provider = {
  saved: {},
  get redirectUrl() { return redirectUrl; },
  get clientMetadata() {
    return { client_name: 'mcpgate oauth test', redirect_uris: [redirectUrl], grant_types: ['authorization_code'],
      response_types: ['code'], token_endpoint_auth_method: 'none' };
  },
  clientInformation() { return { client_id: 'mcpgate-test-client' }; },
  tokens() { return this.saved.tokens; },
  saveTokens(tokens) { this.saved.tokens = tokens; },
  redirectToAuthorization(url) { this.saved.authorizationUrl = url.href; },
  saveCodeVerifier(v) { this.saved.codeVerifier = v; },
  codeVerifier() { return this.saved.codeVerifier; },
  saveDiscoveryState(state) { this.saved.discoveryState = state; },
};

const connect = async () => {
  const transport = new StreamableHTTPClientTransport(new URL(mcpURL), { authProvider: provider, fetch: recordingFetch });
  const client = new Client({ name: 'mcpgate-oauth-test', version: '1.0.0' });
  await client.connect(transport);
  return { client, transport };
};

const flow = {};
let pending;
try {
  await connect();
  flow.firstConnect = 'connected without a token (unexpected)';
} catch (err) {
  flow.firstConnect = err?.constructor?.name ?? String(err);
  pending = err;
}
flow.authorizationUrl = provider.saved.authorizationUrl;
flow.discoveryState = provider.saved.discoveryState;
if (pending instanceof authLib.UnauthorizedError && provider.saved.authorizationUrl) {
  // The browser's part: the test authorization server approves at once.
  const approve = await fetch(provider.saved.authorizationUrl, { redirect: 'manual' });
  const code = new URL(approve.headers.get('location')).searchParams.get('code');
  const transport = new StreamableHTTPClientTransport(new URL(mcpURL), { authProvider: provider, fetch: recordingFetch });
  await transport.finishAuth(code);
  flow.tokenType = provider.saved.tokens?.token_type;
  const { client } = await connect();
  const { tools } = await client.listTools();
  flow.tools = tools.map((t) => t.name).sort();
  await client.close();
}

console.log(JSON.stringify({
  challenge: {
    resourceMetadataUrl: challenge.resourceMetadataUrl?.href,
    scope: challenge.scope,
    error: challenge.error,
    status: res.status,
  },
  resourceMetadata,
  authorizationServerMetadata,
  flow,
  fetched,
}));
