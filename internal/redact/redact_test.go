package redact

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

func TestURLError(t *testing.T) {
	cause := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	for raw, want := range map[string]string{
		"https://mcp.vendor.com/mcp?api_key=sk-secret":     `Post "https://mcp.vendor.com": dial tcp 127.0.0.1:1: connect: connection refused`,
		"https://hooks.example.com/services/T0/B0/secret":  `Post "https://hooks.example.com": dial tcp 127.0.0.1:1: connect: connection refused`,
		"http://user:secret@10.0.0.1:8080/mcp#frag-secret": `Post "http://10.0.0.1:8080": dial tcp 127.0.0.1:1: connect: connection refused`,
		"::not a url secret":                               `Post "": dial tcp 127.0.0.1:1: connect: connection refused`,
	} {
		err := URLError(&url.Error{Op: "Post", URL: raw, Err: cause})
		if err.Error() != want || strings.Contains(err.Error(), "secret") {
			t.Errorf("URLError(%q) = %q, want %q", raw, err, want)
		}
		if !errors.Is(err, cause) {
			t.Errorf("URLError(%q) lost its cause", raw)
		}
	}
	if err := URLError(cause); err != cause {
		t.Errorf("URLError of an error without a URL = %v, want it unchanged", err)
	}
	if URLError(nil) != nil {
		t.Error("URLError(nil) is not nil")
	}
	// What an http.Client really returns.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:1/mcp?api_key=sk-secret", nil)
	_, err := http.DefaultClient.Do(req)
	if red := URLError(err); strings.Contains(red.Error(), "sk-secret") || !errors.Is(red, context.Canceled) {
		t.Errorf("URLError(%v) = %v", err, red)
	}
}

// The MCP SDK wraps the client's *url.Error in its own errors: the text is
// cut all the same, and the chain kept.
func TestURLErrorWrapped(t *testing.T) {
	cause := errors.New("connect: connection refused")
	ue := &url.Error{Op: "Post", URL: "http://127.0.0.1:1/mcp?api_key=SECRET", Err: cause}
	err := fmt.Errorf(`calling "initialize": sending "initialize": rejected by transport: %w`, ue)
	red := URLError(err)
	want := `calling "initialize": sending "initialize": rejected by transport: Post "http://127.0.0.1:1": connect: connection refused`
	if red.Error() != want {
		t.Errorf("URLError = %q, want %q", red, want)
	}
	if !errors.Is(red, cause) {
		t.Error("URLError lost the chain")
	}
}
