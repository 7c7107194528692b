package enforce_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/mcpgate/mcpgate/enforce"
)

// A global rule that binds while several tenants call at once, from
// several engines: the global limit G is never exceeded and, where one
// script decides the tenant and global counters together (memory, one
// redis-server), exactly G calls are admitted. Calls the global rule
// refused charge no tenant counter: what the tenants' counters hold adds
// up to exactly the calls admitted. On a Cluster the two halves live in
// different slots, so a call can be refused by a global charge that a
// concurrent call takes back a round trip later: fewer than G may be
// admitted, never more.
func TestGlobalRuleBindsAcrossTenantsAndEngines(t *testing.T) {
	t.Parallel()
	const (
		global, perTenant = 20, 9
		tenants, callers  = 4, 12 // 48 calls: the tenants' limits allow 36
	)
	for _, store := range stores {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			n := 1
			if store != "memory" {
				n = 3
			}
			es := engines(t, store, n, fmt.Sprintf(`
global:
  - {name: all, algorithm: fixed_window, limit: %d, period: 1h}
tiers:
  free:
    limits:
      - {name: per_tenant, per: tenant, algorithm: sliding_window, limit: %d, period: 1h}
`, global, perTenant), "")
			// Every tenant's callers at once: 48 concurrent calls.
			perTenantAdmitted := make([]int64, tenants)
			var wg sync.WaitGroup
			for i := range tenants {
				wg.Go(func() {
					call := enforce.Call{Tenant: fmt.Sprint("tenant-", i), Subject: "s", Name: "search"}
					perTenantAdmitted[i] = run(t, es, callers, call, func() enforce.Outcome { return enforce.Outcome{} })
				})
			}
			wg.Wait()
			var got int64
			for _, a := range perTenantAdmitted {
				got += a
			}
			if got > global {
				t.Fatalf("%d admitted: the global limit is %d", got, global)
			}
			if store != "cluster" && got != global {
				t.Fatalf("%d admitted, want exactly the global limit %d (one script decides both)", got, global)
			}
			for i := range tenants {
				cs, err := es[0].Counters(t.Context(), "free", fmt.Sprint("tenant-", i), "")
				if err != nil {
					t.Fatal(err)
				}
				used := int64(-1)
				for _, c := range cs {
					if c.Rule.Name == "per_tenant" {
						used = perTenant - c.Result.Remaining
					}
				}
				if a := perTenantAdmitted[i]; used != a || a > perTenant {
					t.Fatalf("tenant-%d: %d admitted, its counter holds %d (limit %d): a global denial charged the tenant", i, a, used, perTenant)
				}
			}
		})
	}
}
