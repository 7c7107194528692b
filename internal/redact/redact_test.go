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

// Replace cuts every form Forms lists of a URL with credentials (as given,
// as net/url and an http.Client write it back, %q-escaped), keeps the chain,
// and leaves an error that names none of them, nil included, as it is.
func TestReplace(t *testing.T) {
	const safe = "https://idp.example.com/jwks"
	cause := errors.New("connection refused")
	for _, tc := range []struct {
		name, raw string
		text      func(raw string, u *url.URL) string
	}{
		{"as given", "https://user:SECRET@idp.example.com/jwks?key=SECRET", func(raw string, _ *url.URL) string { return raw }},
		{"as net/url writes it", "https://us%20er:p%40SECRET@idp.example.com/jwks", func(_ string, u *url.URL) string { return u.String() }},
		{"as Redacted writes it", "https://user:SECRET@idp.example.com/jwks?key=SECRET", func(_ string, u *url.URL) string { return u.Redacted() }},
		{"as an http.Client's *url.Error writes it", "https://user:SECRET@idp.example.com/jwks?key=SECRET", func(raw string, _ *url.URL) string {
			return (&url.Error{Op: "Get", URL: strings.Replace(raw, ":SECRET@", ":***@", 1), Err: cause}).Error()
		}},
		{"quoted", `https://idp.example.com/jwks?key="SECRET"`, func(raw string, _ *url.URL) string { return fmt.Sprintf("%q", raw) }},
		{"key as user name", "https://SECRET@idp.example.com/jwks", func(raw string, _ *url.URL) string { return raw }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := url.Parse(tc.raw)
			if err != nil {
				t.Fatal(err)
			}
			in := fmt.Errorf("fetching %s: %w", tc.text(tc.raw, u), cause)
			out := Replace(in, Forms(tc.raw, u), safe)
			if strings.Contains(out.Error(), "SECRET") || !strings.Contains(out.Error(), safe) {
				t.Errorf("Replace(%q) = %q", in, out)
			}
			if !errors.Is(out, cause) || errors.Unwrap(out) != in {
				t.Errorf("Replace(%q) does not unwrap to it", in)
			}
		})
	}
	forms := Forms("https://user:SECRET@idp.example.com/jwks", &url.URL{Scheme: "https", User: url.UserPassword("user", "SECRET"), Host: "idp.example.com", Path: "/jwks"})
	if err := Replace(cause, forms, safe); err != cause {
		t.Errorf("Replace of an error without the URL = %v, want it unchanged", err)
	}
	if Replace(nil, forms, safe) != nil {
		t.Error("Replace(nil) is not nil")
	}
}
