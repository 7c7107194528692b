// Package usage keeps the durable record of what each tenant consumed in each
// billing period, and flushes the live usage meters of a limit store into it.
//
// The live counter of a tenant's period is a limit.Meter, charged in the same
// atomic step that admits a call (so quotas are exact across gateway
// instances). Its fields only grow, so any two snapshots of it are ordered
// field by field. The durable Store keeps, per tenant and period, the largest
// snapshot it was ever given: Put raises the stored totals and never lowers
// them. Writing a snapshot is therefore idempotent, a retried or duplicated
// flush never counts twice, and when two flushers race the larger snapshot
// wins whatever the order their writes land in.
//
// A Flusher moves snapshots from the limit store to the durable Store: the
// meters this instance charged every interval (Track, Flush) and, now and then,
// every meter the limit store holds unflushed (Sweep), which is how the usage
// of an instance that died before flushing still lands. A durable store that
// is down never blocks calls: totals stay in the live counters and land when
// it returns.
//
// Backends live in the subpackages usage/sqlite (embedded, one file) and
// usage/dynamodb.
package usage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mcpgate/mcpgate/internal/ident"
	"github.com/mcpgate/mcpgate/limit"
)

// ErrNotInitialized means the store's table or schema does not exist: run
// Init (mcpgate usage init).
var ErrNotInitialized = errors.New("usage: store not initialized")

// ErrUnavailable means the store could not carry out an operation: it is
// down, unreachable, closed, timed out or failed an I/O. Nothing is known to
// have changed; the operation may be retried (Put is idempotent).
var ErrUnavailable = errors.New("usage: store unavailable")

// ErrInvalidRecord means a Record given to Put cannot be stored: its
// tenant is not a valid tenant id (see CheckTenant), its period is
// malformed or a field is negative (Record.Validate: nothing of that Put was
// written), or the store refused the record itself (other records of that
// Put may have been written). Putting it again fails the same way.
var ErrInvalidRecord = errors.New("usage: invalid record")

// MaxTenantBytes bounds a tenant id, in bytes: the bound the gateway's
// authentication puts on the tenant claim (one definition: ident).
const MaxTenantBytes = ident.MaxTenantBytes

// CheckTenant returns nil when tenant is a tenant id that can be metered and
// billed, else an error saying why: it is empty, or breaks the rules the
// gateway's authentication applies to the tenant claim (ident.Check:
// longer than MaxTenantBytes, not valid UTF-8, which a store's encoding
// would merge with another tenant, or holding a control character; the
// gateway also refuses U+FFFD at admission, but usage recorded before that
// rule must still be stored). The
// error does not quote the tenant.
func CheckTenant(tenant string) error {
	if tenant == "" {
		return errors.New("empty")
	}
	return ident.Check(tenant, MaxTenantBytes)
}

// Record is a tenant's usage in one billing period as the durable store
// holds it.
type Record struct {
	Tenant string
	Period string // "YYYY-MM", the calendar month in UTC (see Period)
	limit.Usage
	// UpdatedAt is when the totals were last raised. Put stores it only
	// along with a raise: a write that adds nothing leaves it unchanged.
	// Zero means the time of the Put.
	UpdatedAt time.Time
}

// Validate returns an error wrapping ErrInvalidRecord when r cannot be
// stored.
func (r Record) Validate() error {
	if err := CheckTenant(r.Tenant); err != nil {
		return fmt.Errorf("%w: tenant: %w", ErrInvalidRecord, err)
	}
	if r.Charged < 0 || r.Refunded < 0 || r.Calls < 0 || r.RefundedCalls < 0 {
		return fmt.Errorf("%w: tenant %q period %q: negative field in %+v", ErrInvalidRecord, r.Tenant, r.Period, r.Usage)
	}
	if _, err := PeriodEnd(r.Period); err != nil {
		return fmt.Errorf("%w: tenant %q: %w", ErrInvalidRecord, r.Tenant, err)
	}
	return nil
}

// Store is a durable usage store. Implementations are safe for concurrent
// use; every method but Close takes a context that bounds its I/O.
type Store interface {
	// Init creates the table or schema. It is idempotent: on a store that is
	// already initialized it changes nothing and returns nil.
	Init(ctx context.Context) error
	// Check returns nil when the store is ready for Put and Get, an error
	// wrapping ErrNotInitialized when the table or schema is missing, and an
	// error wrapping ErrUnavailable when the store cannot be reached.
	Check(ctx context.Context) error
	// Put raises the stored totals of each record's tenant and period to at
	// least the record's, field by field, and never lowers them: a record
	// whose fields the stored ones all cover changes nothing. Records are
	// written in batches; on error some may have been written, and Put may
	// be called again with the same records. Errors wrap ErrInvalidRecord
	// (a record fails Record.Validate, and nothing was written; or the
	// store refused a record itself), ErrNotInitialized or ErrUnavailable.
	Put(ctx context.Context, recs []Record) error
	// Get returns the stored totals of tenant in period; ok is false when the
	// store holds none (nothing was ever flushed).
	Get(ctx context.Context, tenant, period string) (rec Record, ok bool, err error)
	// Close releases the store's resources. Calls after Close fail with
	// ErrUnavailable.
	Close() error
}

// periodLayout is the time layout of a period.
const periodLayout = "2006-01"

// Period returns the billing period that t falls in: its calendar month in
// UTC, formatted "YYYY-MM".
func Period(t time.Time) string {
	return t.UTC().Format(periodLayout)
}

// PeriodStart returns the first instant of period ("YYYY-MM"), in UTC.
func PeriodStart(period string) (time.Time, error) {
	t, err := time.Parse(periodLayout, period)
	// Parse accepts nothing but four-digit years and two-digit months; the
	// round trip also refuses month 00 or 13 forms that Parse might let by.
	if err != nil || t.Format(periodLayout) != period {
		return time.Time{}, fmt.Errorf("bad period %q: want YYYY-MM", period)
	}
	return t, nil
}

// PeriodEnd returns the first instant after period ("YYYY-MM"): the start of
// the next calendar month, in UTC.
func PeriodEnd(period string) (time.Time, error) {
	t, err := PeriodStart(period)
	if err != nil {
		return time.Time{}, err
	}
	return t.AddDate(0, 1, 0), nil
}
