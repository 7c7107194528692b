package cli

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mcpgate/mcpgate/examples/upstream"
)

// A serve that stops within 10 s of reloads (SIGHUP) that rebuilt the
// authenticator (a JWKS URL's options changed) leaves no goroutine running
// once it returns: the old authenticators, closed 10 s after their reload
// (time.AfterFunc in runServe's reload), are closed on the way out too.
// (Once, runServe's deferred Close closed only the current one, and the old
// ones' JWKS refresh goroutines outlived Main.)
func TestServeLeavesNoGoroutineAfterSIGHUPReloads(t *testing.T) {
	up := upstream.New(&upstream.Options{Stateless: true, JSONResponse: true})
	upSrv := httptest.NewServer(up.Handler())
	idp := newJWKSIdP(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "mcpgate.yaml")
	write := func(issuer string) {
		cfg := fmt.Sprintf("listen: 127.0.0.1:0\nupstream: {url: %s/mcp}\nusage: {store: \"sqlite:%s\"}\naudit: {file: %s}\nauth:\n  jwt: {jwks_url: %s/jwks, issuer: %s}\n",
			upSrv.URL, filepath.Join(dir, "usage.db"), filepath.Join(dir, "audit.jsonl"), idp.URL, issuer)
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("https://issuer-0")
	opts := goleak.IgnoreCurrent()

	srv := serveConfig(t, path)
	stderr := srv.stderr
	const reloads = 3
	for i := 1; i <= reloads; i++ {
		write(fmt.Sprintf("https://issuer-%d", i))
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); strings.Count(stderr.String(), "config reloaded") < i; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("reload %d not done:\n%s", i, stderr.String())
			}
		}
	}
	srv.stop()
	select {
	case code := <-srv.done:
		if code != 0 {
			t.Fatalf("serve exited %d:\n%s", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not return within 30s")
	}
	http.DefaultClient.CloseIdleConnections()
	upSrv.Close()
	idp.Close()
	if err := goleak.Find(opts); err != nil {
		t.Fatalf("goroutines left running after serve returned (%d SIGHUP reloads):\n%v", reloads, err)
	}
}
