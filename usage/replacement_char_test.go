package usage_test

import (
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
)

// A meter the limit store holds for a tenant with U+FFFD (charged by an
// instance of an earlier release, which admitted such a claim: a rolling
// upgrade on a shared Redis store) is billed usage: the flush writes it.
// U+FFFD is valid UTF-8 that every store keeps apart from other tenants;
// the merge the admission rule guards against happens in the JSON decoder
// at authentication, not here.
func TestFlushWritesMeterOfTenantWithReplacementChar(t *testing.T) {
	ms := newMem(t, nil)
	st := newSQLite(t, "")
	f := usage.NewFlusher(ms, st, &usage.FlusherOptions{Logger: quiet()})
	tenant := "acme\ufffd"
	charge(t, ms, f, f, tenant, period, 3)
	charge(t, ms, f, f, "globex", period, 1)
	if err := f.Flush(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	want(t, st, "globex", period, limit.Usage{Charged: 1, Calls: 1})
	want(t, st, tenant, period, limit.Usage{Charged: 3, Calls: 1})
}

// A record stored for such a tenant stays valid, so that it can be raised.
func TestStoredRecordOfTenantWithReplacementCharIsValid(t *testing.T) {
	tenant := "acme\ufffd"
	r := usage.Record{Tenant: tenant, Period: period, Usage: limit.Usage{Charged: 5, Calls: 1}, UpdatedAt: time.Now()}
	if err := r.Validate(); err != nil {
		t.Fatalf("a record an earlier release stored is refused: %v", err)
	}
}
