// Package conformance holds the test that runs the official MCP conformance
// suite (npm @modelcontextprotocol/conformance) through mcpgate: the suite's
// server scenarios run against the suite's reference server directly, then
// three times through a gateway in front of it, and every scenario that
// passes directly must pass through the gateway in all three runs
// (TestConformanceThroughGateway). TestConformanceThroughFederation does the
// same, twice, through a federated gateway (upstreams:) whose upstreams are
// the reference server (prefix ""), the Go SDK demo upstream over HTTP
// (prefix demo__) and @modelcontextprotocol/server-everything run as a
// stdio process (prefix everything__).
//
// The suite, its reference server, server-everything and the Node 22 that
// runs them are an npm project under testdata/node, pinned by its
// package-lock.json (the gateway's TypeScript-client and server-everything
// tests use it too). scripts/test installs it; by hand:
//
//	npm ci --prefix internal/conformance/testdata/node --ignore-scripts
//	npm rebuild --prefix internal/conformance/testdata/node node
//
// (the second command runs the one install script needed: the node package
// fetching its Node 22 binary from the npm registry).
//
// The package has no API: everything is in its tests.
package conformance
