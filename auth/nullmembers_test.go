package auth

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/lestrrat-go/jwx/v3/jwa"
)

// A public RSA signing key as serializers that write every member
// emit it: "key_ops": null (a Go struct's nil slice without omitempty,
// System.Text.Json / Jackson defaults) means no key_ops, and "oth": [] (the
// .NET JsonWebKey before its 2017 fix, AzureAD identitymodel #579) holds no
// prime at all. Both carry the public key only and must verify tokens.
func TestPublicKeyWithNullOrEmptyMembersVerifies(t *testing.T) {
	rsaA, _ := rsaKeys(t)
	for name, members := range map[string]string{
		`key_ops null`: `"key_ops":null`,
		`oth empty`:    `"oth":[]`,
	} {
		t.Run(name, func(t *testing.T) {
			set := string(jwksJSON(t, []any{&rsaA.PublicKey}, []string{"k1"}, nil))
			set = strings.Replace(set, `"kid":"k1"`, `"kid":"k1","use":"sig",`+members, 1)
			a, err := New(context.Background(), Options{JWKSFile: writeFile(t, "k.json", []byte(set)), Now: newClock().Now, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatalf("a public key with %s: New: %v", members, err)
			}
			t.Cleanup(func() { _ = a.Close() })
			if _, err := a.Verify(context.Background(), sign(t, jwa.RS256(), rsaA, "k1", claims(nil))); err != nil {
				t.Fatalf("a public key with %s: %v", members, err)
			}
		})
	}
}
