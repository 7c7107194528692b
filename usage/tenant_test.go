package usage_test

import (
	"testing"

	"github.com/mcpgate/mcpgate/auth"
	"github.com/mcpgate/mcpgate/usage"
)

// The engine admits the tenants usage.CheckTenant accepts, the gateway
// those its authentication accepts: the two bounds must stay one, or a
// gateway would admit callers whose calls the engine then refuses.
func TestMaxTenantBytesIsTheAuthBound(t *testing.T) {
	if usage.MaxTenantBytes != auth.MaxTenantBytes {
		t.Fatalf("usage.MaxTenantBytes = %d, auth.MaxTenantBytes = %d: they must agree", usage.MaxTenantBytes, auth.MaxTenantBytes)
	}
}
