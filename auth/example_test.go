package auth_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/mcpgate/mcpgate/auth"
)

func Example() {
	secret := []byte("an-example-secret-of-32-bytes!!!")
	now := time.Unix(1_800_000_000, 0)

	a, err := auth.New(context.Background(), auth.Options{
		HS256Secret: secret,
		Issuer:      "https://idp.example",
		DefaultTier: "free",
		Now:         func() time.Time { return now }, // a fixed clock keeps the example stable
	})
	if err != nil {
		panic(err)
	}
	defer a.Close()

	token, err := auth.SignHS256(secret, map[string]any{
		"iss":       "https://idp.example",
		"sub":       "agent-7",
		"tenant_id": "acme",
		"scope":     "tools:search tools:fetch",
		"exp":       now.Add(time.Hour).Unix(),
	})
	if err != nil {
		panic(err)
	}

	r, _ := http.NewRequest(http.MethodPost, "http://gateway/mcp", nil)
	r.Header.Set("Authorization", "Bearer "+token)
	p, err := a.FromRequest(r.Context(), r)
	if err != nil {
		panic(err)
	}
	fmt.Println(p.Tenant, p.Subject, p.Tier, p.Scopes)
	fmt.Println("search:", p.Scopes.AllowsTool("search"), "delete:", p.Scopes.AllowsTool("delete"))

	r.Header.Del("Authorization")
	_, err = a.FromRequest(r.Context(), r)
	fmt.Println(errors.Is(err, auth.ErrNoToken))
	// Output:
	// acme agent-7 free tools:fetch tools:search
	// search: true delete: false
	// true
}
