package main

// One redis-server shared by a gateway (gateway.New in front of the demo
// upstream, examples/upstream) and this server: a tenant's limit counts
// the calls made through both.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/examples/upstream"
	"github.com/mcpgate/mcpgate/gateway"
	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/policy"
	"github.com/mcpgate/mcpgate/setup"
)

// A per-tenant limit L on one Redis shared by a gateway and the sdkserver:
// of many concurrent calls spread over both, exactly L reach a tool in all
// (the gateway's upstream plus the sdkserver's tools), whichever way they
// came.
func TestSharedRedisWithGateway(t *testing.T) {
	t.Parallel()
	const (
		limit = 9
		calls = 40
	)
	redis := testenv.StartRedis(t, nil)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	common := fmt.Sprintf(`auth:
  jwt:
    hs256_secret_env: %s
store:
  redis: %q
  timeout: 2s
  on_error: closed
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: fixed_window, limit: %d, period: 1h}
`, testSecretEnv, redis.URL, limit)

	// The gateway, built as mcpgate serve builds it (package setup).
	up := upstream.New(nil)
	ups := httptest.NewServer(up.Handler())
	t.Cleanup(ups.Close)
	gcfg, err := policy.Parse("gateway.yaml", []byte("upstream:\n  url: "+ups.URL+"/mcp\n"+common))
	if err != nil {
		t.Fatal(err)
	}
	ga, err := setup.Auth(ctx, gcfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ga.Close() })
	gst, err := setup.Open(ctx, gcfg, log, &setup.Options{NoUsage: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gst.Close() })
	g, err := gateway.New(t.Context(), gateway.Options{Config: gcfg, Auth: ga, Logger: log,
		SharedStore: gst.Shared, Probe: gst.Probe, Cache: gst.Cache})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	gs := httptest.NewServer(g)
	t.Cleanup(gs.Close)

	// The sdkserver, on the same Redis.
	scfg, err := policy.ParseEmbedded("sdkserver.yaml", []byte(common+"usage:\n  store: sqlite:"+filepath.Join(t.TempDir(), "usage.db")+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := newServer(ctx, scfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	ss := httptest.NewServer(s.handler())
	t.Cleanup(ss.Close)

	tok := sign(t, "shared-co", "alice", "tools:*")
	sessions := []*mcp.ClientSession{
		connect(t, gs.URL+"/mcp", tok), connect(t, ss.URL+"/mcp", tok),
		connect(t, gs.URL+"/mcp", tok), connect(t, ss.URL+"/mcp", tok),
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var ok, limited atomic.Int64
	var mu sync.Mutex
	var other []string
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			text := strconv.Itoa(i)
			got, err := callText(cctx, sessions[i%len(sessions)], "echo", map[string]any{"text": text})
			switch {
			case err == nil && got == text:
				ok.Add(1)
			case err != nil && (strings.Contains(err.Error(), "Too Many Requests") || code(err) == -33029):
				limited.Add(1) // the gateway's 429, the middleware's -33029
			default:
				mu.Lock()
				other = append(other, fmt.Sprintf("call %d: %q, %v", i, got, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(other) > 0 {
		t.Fatalf("%d calls failed otherwise: %q", len(other), other)
	}
	throughGateway, inProcess := up.Calls("echo"), s.served.Load()
	if throughGateway+inProcess != limit {
		t.Fatalf("%d calls reached the gateway's upstream and %d the sdkserver's tools: %d in all, want exactly %d",
			throughGateway, inProcess, throughGateway+inProcess, limit)
	}
	if ok.Load() != limit || limited.Load() != calls-limit {
		t.Fatalf("admitted %d, limited %d; want %d and %d", ok.Load(), limited.Load(), limit, calls-limit)
	}
	t.Logf("admitted %d through the gateway, %d in process", throughGateway, inProcess)

	// The tenant is over its limit on both sides now: the middleware's
	// -33029 carries in data exactly what the gateway's 429 body does.
	_, err = callText(cctx, sessions[1], "echo", map[string]any{"text": "x"})
	var rpcErr *jsonrpc.Error
	if !errors.As(err, &rpcErr) || rpcErr.Code != -33029 {
		t.Fatalf("sdkserver call over the limit: %v, want a -33029 error", err)
	}
	gwData := gatewayDenialData(t, cctx, gs.URL+"/mcp", tok)
	var fromGateway, fromServer map[string]any
	if err := json.Unmarshal(gwData, &fromGateway); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(rpcErr.Data, &fromServer); err != nil {
		t.Fatalf("middleware data %s: %v", rpcErr.Data, err)
	}
	// The retry time is read at two moments: it may differ by a second.
	ra, rb := fromGateway["retry_after_seconds"].(float64), fromServer["retry_after_seconds"].(float64)
	if ra-rb > 1 || rb-ra > 1 {
		t.Fatalf("retry_after_seconds %v (gateway) and %v (middleware)", ra, rb)
	}
	fromServer["retry_after_seconds"] = ra
	if !reflect.DeepEqual(fromGateway, fromServer) {
		t.Fatalf("denial data differ:\ngateway:    %s\nmiddleware: %s", gwData, rpcErr.Data)
	}
}

// gatewayDenialData posts one tools/call to a gateway whose tenant is over
// its limit and returns the data of the 429's JSON-RPC error (which the Go
// SDK client does not read).
func gatewayDenialData(t *testing.T, ctx context.Context, url, tok string) json.RawMessage {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var answer struct {
		Error struct {
			Code int64           `json:"code"`
			Data json.RawMessage `json:"data"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil || resp.StatusCode != http.StatusTooManyRequests || answer.Error.Code != -33029 {
		t.Fatalf("gateway call over the limit: HTTP %d, %+v, %v; want 429 with error -33029", resp.StatusCode, answer, err)
	}
	return answer.Error.Data
}
