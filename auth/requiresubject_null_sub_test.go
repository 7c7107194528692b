package auth

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// With RequireSubject a token must name its subject: one whose "sub" is
// JSON null or the empty string names none and is refused, not let in as
// Subject "", the bucket (per-subject limits, breaker, session binding)
// RequireSubject exists to keep tokens out of. (Once, "sub": null was read
// as "" and let in, though other identity claims of the wrong type were
// refused.)
func TestRequireSubjectRefusesNullOrEmptySub(t *testing.T) {
	a := hsAuth(t, func(o *Options) { o.RequireSubject = true })
	exp := fmt.Sprint(t0.Add(time.Hour).Unix())
	for name, payload := range map[string]string{
		"sub null":  `{"tenant_id":"acme","sub":null,"exp":` + exp + `}`,
		"sub empty": `{"tenant_id":"acme","sub":"","exp":` + exp + `}`,
	} {
		t.Run(name, func(t *testing.T) {
			tok := signRaw(t, testSecret, `{"alg":"HS256"}`, []byte(payload))
			p, err := a.Verify(context.Background(), tok)
			if err == nil {
				t.Fatalf("RequireSubject accepted %s as subject %q (tenant %q)", payload, p.Subject, p.Tenant)
			}
		})
	}
}
