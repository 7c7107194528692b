package cli

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/policy"
)

//go:embed demo.yaml
var demoConfig []byte

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("demo", stderr)
	listen := fs.String("listen", "127.0.0.1:8080", "address of the gateway")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(stderr, *level)
	if err != nil {
		fmt.Fprintln(stderr, "mcpgate demo:", err)
		return errUsage
	}

	// The demo upstream, on a free loopback port.
	// Stateless with JSON answers, so that a lone curl call works (no initialize
	// handshake needed); SDK clients work with it as well.
	up := upstream.New(&upstream.Options{Stateless: true, JSONResponse: true})
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("demo upstream: %w", err)
	}
	upSrv := &http.Server{Handler: up.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go upSrv.Serve(upLn)
	defer upSrv.Close()

	cfgText := strings.Replace(string(demoConfig), "http://127.0.0.1:1/mcp", "http://"+upLn.Addr().String()+"/mcp", 1)
	cfgText = strings.Replace(cfgText, "listen: 127.0.0.1:8080", "listen: "+*listen, 1)
	dir, err := os.MkdirTemp("", "mcpgate-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfgText = strings.Replace(cfgText, "sqlite:demo-usage.db", "sqlite:"+filepath.Join(dir, "usage.db"), 1)
	secret, admin := randomHex(32), randomHex(16)
	// The config names these variables; the demo owns their values.
	os.Setenv("MCPGATE_DEMO_SECRET", secret)
	os.Setenv("MCPGATE_DEMO_ADMIN_TOKEN", admin)
	cfg, err := policy.Parse("demo.yaml", []byte(cfgText))
	if err != nil {
		return fmt.Errorf("embedded demo config: %w", err)
	}
	a, err := buildAuth(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer a.Close()
	token, err := auth.SignHS256([]byte(secret), map[string]any{
		"tenant_id": "demo", "sub": "demo-user", "tier": "free", "scope": "tools:* resources:* prompts:*",
		"exp": time.Now().Add(24 * time.Hour).Unix(),
	})
	if err != nil {
		return err
	}
	g, cleanup, err := newGateway(ctx, cfg, a, nil, log, true)
	if err != nil {
		return err
	}
	defer cleanup()
	return serveUntilDone(ctx, g, cfg.Listen, log, nil, nil, func(addr string) {
		printDemo(stdout, addr, token, admin)
	})
}

func printDemo(w io.Writer, addr, token, admin string) {
	url := "http://" + addr + "/mcp"
	fmt.Fprintf(w, `
mcpgate demo is running: gateway %s -> demo MCP server (tools: %s; prompts: %s; resources under file:///docs/ and file:///secret/)
Store: in-process. Tier "free": 20-call burst per tenant, 10 calls per minute per tool,
a monthly quota of 1000 cost units (llm_complete is charged what it reports in _meta.usage.tokens).

Token (tenant demo, subject demo-user, tier free, scopes "tools:* resources:* prompts:*",
expires in 24h: tokens without exp are refused, see auth.jwt.require_expiry):

  export TOKEN=%s

Call a tool (the 11th call within a minute gets HTTP 429 with Retry-After):

  curl -i %s \
    -H "Authorization: Bearer $TOKEN" \
    -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
    -H 'MCP-Protocol-Version: 2025-06-18' \
    -d '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}'

Admin API:   curl -H "Authorization: Bearer %s" 'http://%s/admin/usage?tenant=demo'
Metrics:     curl http://%s/metrics
Any MCP client speaking Streamable HTTP works too: point it at %s with the bearer token.
Stop with Ctrl-C.
`, addr, strings.Join(upstream.ToolNames, ", "), strings.Join(upstream.PromptNames, ", "), token, url, admin, addr, addr, url)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return hex.EncodeToString(b)
}
