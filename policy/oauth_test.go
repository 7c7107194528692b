package policy

import (
	"reflect"
	"strings"
	"testing"
)

// oauthHead is a valid config up to the auth section's own lines (line 5
// on), which each case supplies.
const oauthHead = "upstream: {url: http://127.0.0.1:9000/mcp}\nauth:\n  jwt:\n    hs256_secret_env: SECRET\n"

func TestOAuthFields(t *testing.T) {
	c, err := Parse("m.yaml", []byte(oauthHead+`  authorization_servers:
    - https://idp.example.com
    - https://idp.example.com/tenants/acme
    - http://localhost:9000
    - http://127.0.0.1:9001/as
    - http://[::1]:9002
  resource: https://mcp.example.com/mcp
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"https://idp.example.com", "https://idp.example.com/tenants/acme", "http://localhost:9000", "http://127.0.0.1:9001/as", "http://[::1]:9002"}
	if !reflect.DeepEqual(c.Auth.AuthorizationServers, want) || c.Auth.Resource != "https://mcp.example.com/mcp" {
		t.Fatalf("auth = %+v", c.Auth)
	}
	if len(c.Warnings) != 0 {
		t.Fatalf("warnings: %q", c.Warnings)
	}

	// Off by default: nothing set, nothing served.
	c, err = Parse("m.yaml", []byte(head))
	if err != nil {
		t.Fatal(err)
	}
	if c.Auth.AuthorizationServers != nil || c.Auth.Resource != "" {
		t.Fatalf("defaults: %+v", c.Auth)
	}

	// A resource alone checks the audience; the warning says no metadata
	// is served.
	c, err = Parse("m.yaml", []byte(oauthHead+"  resource: https://mcp.example.com/mcp\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 1 || !strings.HasPrefix(c.Warnings[0], "m.yaml:5: auth.resource: set without auth.authorization_servers") {
		t.Fatalf("warnings: %q", c.Warnings)
	}

	// Servers without an audience to check: a warning, unless
	// auth.jwt.audience binds the tokens instead.
	servers := "  authorization_servers: [https://idp.example.com]\n"
	c, err = Parse("m.yaml", []byte(oauthHead+servers))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 1 || !strings.HasPrefix(c.Warnings[0], "m.yaml:5: auth.authorization_servers: set without auth.resource or auth.jwt.audience") {
		t.Fatalf("warnings: %q", c.Warnings)
	}
	c, err = Parse("m.yaml", []byte(oauthHead+"    audience: https://mcp.example.com\n"+servers))
	if err != nil || len(c.Warnings) != 0 {
		t.Fatalf("with auth.jwt.audience: %v, warnings %q", err, c.Warnings)
	}
}

func TestOAuthFieldsRefused(t *testing.T) {
	const want = "(an authorization server's issuer URL)"
	const res = "(the gateway's public MCP URL, e.g. https://mcp.example.com/mcp)"
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"servers", `  authorization_servers:
    - http://idp.example.com
    - ftp://idp.example.com
    - idp.example.com
    - https://idp.example.com?x=1
    - https://idp.example.com#top
    - https://user:pw@idp.example.com
    - http://127.0.0.2
    - https://idp.example.com
    - https://idp.example.com
    - true
`, []string{
			`m.yaml:6: auth.authorization_servers[0]: bad URL "http://idp.example.com": must be https (http is allowed for localhost, 127.0.0.1 and [::1] only, for development) ` + want,
			`m.yaml:7: auth.authorization_servers[1]: bad URL "ftp://idp.example.com": want an absolute https:// URL ` + want,
			`m.yaml:8: auth.authorization_servers[2]: bad URL "idp.example.com": want an absolute https:// URL ` + want,
			`m.yaml:9: auth.authorization_servers[3]: bad URL "https://idp.example.com?x=1": must not have a query ` + want,
			`m.yaml:10: auth.authorization_servers[4]: bad URL "https://idp.example.com#top": must not have a fragment ` + want,
			`m.yaml:11: auth.authorization_servers[5]: bad URL "https://user:xxxxx@idp.example.com": must not carry user info ` + want,
			`m.yaml:12: auth.authorization_servers[6]: bad URL "http://127.0.0.2": must be https (http is allowed for localhost, 127.0.0.1 and [::1] only, for development) ` + want,
			`m.yaml:14: auth.authorization_servers[8]: "https://idp.example.com" is listed twice`,
			`m.yaml:15: auth.authorization_servers[9]: want a string, got the boolean true (quote it if you mean the text)`,
		}},
		{"servers not a list", "  authorization_servers: https://idp.example.com\n", []string{
			`m.yaml:5: auth.authorization_servers: want a list, got the string "https://idp.example.com"`,
		}},
		{"resource", "  authorization_servers: [https://idp.example.com]\n  resource: http://mcp.example.com/mcp\n", []string{
			`m.yaml:6: auth.resource: bad URL "http://mcp.example.com/mcp": must be https (http is allowed for localhost, 127.0.0.1 and [::1] only, for development) ` + res,
		}},
		{"resource with a fragment", "  resource: \"https://mcp.example.com/mcp#\"\n", []string{
			`m.yaml:5: auth.resource: bad URL "https://mcp.example.com/mcp#": must not have a fragment ` + res,
		}},
		{"resource relative", "  resource: /mcp\n", []string{
			`m.yaml:5: auth.resource: bad URL "/mcp": want an absolute https:// URL ` + res,
		}},
		// aud is compared exactly with the resource as clients spell it
		// (WHATWG URL href): another spelling would refuse every token
		{"resource without path", "  resource: https://mcp.example.com\n", []string{
			`m.yaml:5: auth.resource: "https://mcp.example.com" is not how clients spell this URL: write "https://mcp.example.com/" (tokens carry it in aud, compared exactly)`,
		}},
		{"resource with default port", "  resource: https://mcp.example.com:443/mcp\n", []string{
			`m.yaml:5: auth.resource: "https://mcp.example.com:443/mcp" is not how clients spell this URL: write "https://mcp.example.com/mcp" (tokens carry it in aud, compared exactly)`,
		}},
		{"resource with upper case", "  resource: HTTPS://MCP.example.com/MCP\n", []string{
			`m.yaml:5: auth.resource: "HTTPS://MCP.example.com/MCP" is not how clients spell this URL: write "https://mcp.example.com/MCP" (tokens carry it in aud, compared exactly)`,
		}},
		{"resource with empty port", "  resource: http://localhost:/mcp\n", []string{
			`m.yaml:5: auth.resource: "http://localhost:/mcp" is not how clients spell this URL: write "http://localhost/mcp" (tokens carry it in aud, compared exactly)`,
		}},
		{"resource with http default port", "  resource: http://127.0.0.1:80\n", []string{
			`m.yaml:5: auth.resource: "http://127.0.0.1:80" is not how clients spell this URL: write "http://127.0.0.1/" (tokens carry it in aud, compared exactly)`,
		}},
		{"misspelt", "  authorisation_servers: [https://idp.example.com]\n", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("m.yaml", []byte(oauthHead+tc.yaml))
			if err == nil {
				t.Fatalf("no error; config %+v", c)
			}
			if tc.want == nil {
				if !strings.Contains(err.Error(), "auth.authorisation_servers") {
					t.Fatalf("error %v does not name the unknown key", err)
				}
				return
			}
			if got, want := err.Error(), strings.Join(tc.want, "\n"); got != want {
				t.Errorf("got:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}
