package conformance

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// The tail of `conformance server --suite all` as version 0.1.16 prints it.
const sampleOutput = `=== Running scenario: ping ===
Running client scenario 'ping' against server: http://127.0.0.1:1/mcp
✓ not-a-summary-line: 1 passed, 0 failed


=== SUMMARY ===
✓ server-initialize: 1 passed, 0 failed
✗ dns-rebinding-protection: 1 passed, 1 failed
✓ server-sse-polling: 0 passed, 0 failed

Total: 2 passed, 1 failed
`

func TestParseSummary(t *testing.T) {
	got, err := parseSummary(sampleOutput)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]outcome{
		"server-initialize":        {passed: 1},
		"dns-rebinding-protection": {passed: 1, failed: 1},
		"server-sse-polling":       {},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parseSummary = %+v, want %+v", got, want)
	}
	if got["dns-rebinding-protection"].ok() || !got["server-sse-polling"].ok() {
		t.Fatal("a scenario with a failed check must not be ok, one without must be")
	}
	for _, out := range []string{"", "Total: 0 passed, 0 failed\n", "=== SUMMARY ===\n\nTotal: 0 passed, 0 failed\n"} {
		if _, err := parseSummary(out); err == nil {
			t.Errorf("parseSummary(%q) succeeded: a run without scenarios must be an error", out)
		}
	}
}

func TestAddChecks(t *testing.T) {
	results := t.TempDir()
	write := func(dir, checks string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(results, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(results, dir, "checks.json"), []byte(checks), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("server-dns-rebinding-protection-2026-01-02T03-04-05-678Z", `[
		{"name": "DNSRebindingRejected", "status": "FAILURE", "errorMessage": "got 200"},
		{"name": "LocalhostHostAccepted", "status": "SUCCESS"}]`)
	write("server-server-sse-polling-2026-01-02T03-04-05-679Z", `[
		{"name": "ServerSendsRetryField", "status": "WARNING", "errorMessage": "no retry"},
		{"name": "StreamClosed", "status": "INFO"}]`)
	outcomes := map[string]outcome{
		"dns-rebinding-protection": {passed: 1, failed: 1},
		"server-sse-polling":       {},
		"tools-call-sampling":      {failed: 1}, // threw: no checks.json
	}
	if err := addChecks(outcomes, results); err != nil {
		t.Fatal(err)
	}
	want := map[string]outcome{
		"dns-rebinding-protection": {passed: 1, failed: 1, failures: []string{"DNSRebindingRejected: got 200"}},
		"server-sse-polling":       {warnings: []string{"ServerSendsRetryField: no retry"}},
		"tools-call-sampling":      {failed: 1},
	}
	if !reflect.DeepEqual(outcomes, want) {
		t.Fatalf("addChecks = %+v, want %+v", outcomes, want)
	}
}
