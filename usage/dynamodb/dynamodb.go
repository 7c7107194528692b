// Package dynamodb is the usage.Store for many gateway instances: a DynamoDB
// table through aws-sdk-go-v2.
//
// The table has the partition key tenant (S) and the sort key period (S); each
// item holds the numbers charged, refunded, calls and refunded_calls (N) and
// updated_at (S, RFC 3339 in UTC). Init creates it with on-demand billing
// (PAY_PER_REQUEST).
//
// Put raises an item with one conditional UpdateItem: the write happens only
// when the new snapshot covers the stored one and adds something, so a
// retried or duplicated write is refused by the condition and changes
// nothing. A snapshot that the stored one does not cover, nor the reverse
// (two counters of one period, which a re-seed can produce), is merged field
// by field with an optimistic read-modify-write, so no field ever goes down.
package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
)

// Concurrency bounds the UpdateItem calls one Put has in flight.
const Concurrency = 16

// InitTimeout bounds Init's wait for a new table to become ACTIVE when ctx
// has no earlier deadline.
const InitTimeout = 5 * time.Minute

// mergeAttempts bounds the optimistic read-modify-write of one record under
// contention; each failed attempt means another writer raised the item.
const mergeAttempts = 10

// Attribute names. Every expression refers to them through #placeholders, so
// none can collide with a DynamoDB reserved word.
const (
	attrTenant        = "tenant"
	attrPeriod        = "period"
	attrCharged       = "charged"
	attrRefunded      = "refunded"
	attrCalls         = "calls"
	attrRefundedCalls = "refunded_calls"
	attrUpdatedAt     = "updated_at"
)

var exprNames = map[string]string{
	"#t": attrTenant, "#c": attrCharged, "#r": attrRefunded,
	"#n": attrCalls, "#rn": attrRefundedCalls, "#u": attrUpdatedAt,
}

const (
	setNew = "SET #c = :c, #r = :r, #n = :n, #rn = :rn, #u = :u"
	// raiseCond: the item is new, or the snapshot covers it and adds to it.
	raiseCond = "attribute_not_exists(#t) OR (#c <= :c AND #r <= :r AND #n <= :n AND #rn <= :rn" +
		" AND (#c < :c OR #r < :r OR #n < :n OR #rn < :rn))"
)

var tableRE = regexp.MustCompile(`^[a-zA-Z0-9_.-]{3,255}$`)

// Store is a usage.Store in one DynamoDB table. It is safe for concurrent
// use.
type Store struct {
	client *ddb.Client
	table  string
	closed atomic.Bool
}

var _ usage.Store = (*Store)(nil)

// Open returns a Store of table with the client configuration of the
// standard AWS environment (config.LoadDefaultConfig: AWS_REGION,
// credentials from the environment, shared files or the instance role;
// AWS_ENDPOINT_URL_DYNAMODB points it at another endpoint, such as a local
// emulator). It makes no request: Check tells whether the table is there.
func Open(ctx context.Context, table string) (*Store, error) {
	if !tableRE.MatchString(table) {
		return nil, fmt.Errorf("usage/dynamodb: bad table name %q (3 to 255 letters, digits, '_', '-' or '.')", table)
	}
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("usage/dynamodb: load AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, errors.New("usage/dynamodb: no AWS region configured (set AWS_REGION)")
	}
	return New(ddb.NewFromConfig(cfg), table)
}

// New returns a Store of table through client, for callers that configure
// the client themselves.
func New(client *ddb.Client, table string) (*Store, error) {
	if client == nil {
		return nil, errors.New("usage/dynamodb: nil client")
	}
	if !tableRE.MatchString(table) {
		return nil, fmt.Errorf("usage/dynamodb: bad table name %q (3 to 255 letters, digits, '_', '-' or '.')", table)
	}
	return &Store{client: client, table: table}, nil
}

// Table returns the table name.
func (s *Store) Table() string { return s.table }

// Init creates the table (on-demand billing) unless it exists, then waits
// until it is ACTIVE: at most until ctx ends, or InitTimeout.
func (s *Store) Init(ctx context.Context) error {
	if err := s.open(); err != nil {
		return err
	}
	_, err := s.client.CreateTable(ctx, &ddb.CreateTableInput{
		TableName: aws.String(s.table),
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(attrTenant), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String(attrPeriod), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(attrTenant), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(attrPeriod), KeyType: types.KeyTypeRange},
		},
		BillingMode: types.BillingModePayPerRequest,
	})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return s.fail("init", err)
	}
	wait := InitTimeout
	if d, ok := ctx.Deadline(); ok {
		wait = time.Until(d)
	}
	w := ddb.NewTableExistsWaiter(s.client, func(o *ddb.TableExistsWaiterOptions) {
		// The defaults (20s to 120s between polls) suit long
		// provisioning; a new on-demand table is usually ACTIVE in
		// seconds.
		o.MinDelay = 100 * time.Millisecond
		o.MaxDelay = 5 * time.Second
	})
	if err := w.Wait(ctx, &ddb.DescribeTableInput{TableName: aws.String(s.table)}, wait); err != nil {
		return s.fail("init: wait for the table to be ACTIVE", err)
	}
	return s.Check(ctx)
}

// Check describes the table: nil when it is ACTIVE (or UPDATING) with the
// expected key schema (tenant and period, both strings); an error wrapping
// usage.ErrNotInitialized when it does not exist or is not ready yet.
func (s *Store) Check(ctx context.Context) error {
	if err := s.open(); err != nil {
		return err
	}
	out, err := s.client.DescribeTable(ctx, &ddb.DescribeTableInput{TableName: aws.String(s.table)})
	if err != nil {
		return s.fail("check", err)
	}
	t := out.Table
	switch t.TableStatus {
	case types.TableStatusActive, types.TableStatusUpdating:
	default:
		return fmt.Errorf("%w: DynamoDB table %s is %s", usage.ErrNotInitialized, s.table, t.TableStatus)
	}
	var hash, rng string
	for _, k := range t.KeySchema {
		switch k.KeyType {
		case types.KeyTypeHash:
			hash = aws.ToString(k.AttributeName)
		case types.KeyTypeRange:
			rng = aws.ToString(k.AttributeName)
		}
	}
	if hash != attrTenant || rng != attrPeriod {
		return fmt.Errorf("usage/dynamodb: table %s has the key (%q, %q), want (%q, %q)", s.table, hash, rng, attrTenant, attrPeriod)
	}
	// A key of another type would make DynamoDB refuse every item (see
	// failRecord), as if each record were invalid.
	for _, a := range t.AttributeDefinitions {
		if name := aws.ToString(a.AttributeName); (name == attrTenant || name == attrPeriod) && a.AttributeType != types.ScalarAttributeTypeS {
			return fmt.Errorf("usage/dynamodb: table %s has the key attribute %q of type %s, want S", s.table, name, a.AttributeType)
		}
	}
	return nil
}

// Put raises the stored totals to recs, at most Concurrency writes at a time.
// Every record is attempted; the error reports the first failure and how
// many records failed.
func (s *Store) Put(ctx context.Context, recs []usage.Record) error {
	for _, r := range recs {
		if err := r.Validate(); err != nil {
			return err
		}
	}
	if err := s.open(); err != nil {
		return err
	}
	errs := make([]error, len(recs))
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range min(len(recs), Concurrency) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(recs); i = int(next.Add(1) - 1) {
				errs[i] = s.put(ctx, recs[i])
			}
		})
	}
	wg.Wait()
	var (
		first  error
		failed int
	)
	for _, err := range errs {
		if err != nil {
			if first == nil {
				first = err
			}
			failed++
		}
	}
	if failed > 1 {
		return fmt.Errorf("%w (and %d more records)", first, failed-1)
	}
	return first
}

// put raises one item to r.
func (s *Store) put(ctx context.Context, r usage.Record) error {
	vals := usageValues(r.Usage)
	vals[":u"] = &types.AttributeValueMemberS{Value: formatTime(r.UpdatedAt)}
	_, err := s.client.UpdateItem(ctx, &ddb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 key(r.Tenant, r.Period),
		UpdateExpression:                    aws.String(setNew),
		ConditionExpression:                 aws.String(raiseCond),
		ExpressionAttributeNames:            exprNames,
		ExpressionAttributeValues:           vals,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) {
		return s.failRecord("put", r.Tenant, r.Period, err) // nil stays nil
	}
	// Refused: the stored item covers the snapshot (the usual case of a
	// retried flush), or the two are not ordered and must be merged.
	item := ccf.Item
	for range mergeAttempts {
		if item == nil {
			// An endpoint that does not return the old item.
			got, err := s.client.GetItem(ctx, &ddb.GetItemInput{
				TableName: aws.String(s.table), Key: key(r.Tenant, r.Period), ConsistentRead: aws.Bool(true),
			})
			if err != nil {
				return s.failRecord("put: read for merge", r.Tenant, r.Period, err)
			}
			if got.Item == nil {
				// Deleted meanwhile: the plain raise applies again.
				return s.put(ctx, r)
			}
			item = got.Item
		}
		old, err := decodeUsage(item)
		if err != nil {
			// An item edited by hand (a fractional credit, a string): this
			// record cannot be merged into it, and must not hold back the
			// other records of the batch nor the sweeps, as any record the
			// store refuses.
			return fmt.Errorf("usage/dynamodb: put tenant %q period %s: %w: the stored item: %w", r.Tenant, r.Period, usage.ErrInvalidRecord, err)
		}
		if old.Covers(r.Usage) {
			return nil
		}
		if err := s.merge(ctx, r, item, old.Max(r.Usage)); !errors.As(err, &ccf) {
			return err
		}
		item = ccf.Item
	}
	return fmt.Errorf("usage/dynamodb: put tenant %q period %s: %w: still contended after %d merge attempts",
		r.Tenant, r.Period, usage.ErrUnavailable, mergeAttempts)
}

// merge writes u over the item if it still holds exactly old's numbers. A
// refusal is returned as the *types.ConditionalCheckFailedException, other
// failures wrapped.
func (s *Store) merge(ctx context.Context, r usage.Record, old map[string]types.AttributeValue, u limit.Usage) error {
	vals := usageValues(u)
	vals[":u"] = &types.AttributeValueMemberS{Value: formatTime(r.UpdatedAt)}
	cond := ""
	for _, f := range []struct{ name, attr string }{{"#c", attrCharged}, {"#r", attrRefunded}, {"#n", attrCalls}, {"#rn", attrRefundedCalls}} {
		if cond != "" {
			cond += " AND "
		}
		if v, ok := old[f.attr]; ok {
			ph := ":o" + f.name[1:]
			vals[ph] = v
			cond += f.name + " = " + ph
		} else {
			cond += "attribute_not_exists(" + f.name + ")"
		}
	}
	_, err := s.client.UpdateItem(ctx, &ddb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 key(r.Tenant, r.Period),
		UpdateExpression:                    aws.String(setNew),
		ConditionExpression:                 aws.String("attribute_exists(#t) AND " + cond),
		ExpressionAttributeNames:            exprNames,
		ExpressionAttributeValues:           vals,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return err
	}
	return s.failRecord("put: merge", r.Tenant, r.Period, err)
}

// Get reads the item of tenant and period with a strongly consistent read.
// A tenant or period that is not valid UTF-8, or that DynamoDB cannot key,
// is refused with an error wrapping usage.ErrInvalidRecord: the SDK's
// encoding would replace the invalid bytes, and so read another tenant's
// item.
func (s *Store) Get(ctx context.Context, tenant, period string) (usage.Record, bool, error) {
	if err := s.open(); err != nil {
		return usage.Record{}, false, err
	}
	if !utf8.ValidString(tenant) || !utf8.ValidString(period) {
		return usage.Record{}, false, fmt.Errorf("usage/dynamodb: get tenant %.40q period %q: %w: not valid UTF-8", tenant, period, usage.ErrInvalidRecord)
	}
	out, err := s.client.GetItem(ctx, &ddb.GetItemInput{
		TableName: aws.String(s.table), Key: key(tenant, period), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return usage.Record{}, false, s.failRecord("get", tenant, period, err)
	}
	if out.Item == nil {
		return usage.Record{}, false, nil
	}
	u, err := decodeUsage(out.Item)
	if err != nil {
		return usage.Record{}, false, fmt.Errorf("usage/dynamodb: get tenant %q period %s: %w", tenant, period, err)
	}
	rec := usage.Record{Tenant: tenant, Period: period, Usage: u}
	if v, ok := out.Item[attrUpdatedAt].(*types.AttributeValueMemberS); ok {
		if rec.UpdatedAt, err = time.Parse(time.RFC3339Nano, v.Value); err != nil {
			return usage.Record{}, false, fmt.Errorf("usage/dynamodb: get tenant %q period %s: bad %s %q", tenant, period, attrUpdatedAt, v.Value)
		}
	}
	return rec, true, nil
}

// Close makes later calls fail with usage.ErrUnavailable. The SDK client
// holds no resources that need releasing beyond idle connections.
func (s *Store) Close() error {
	s.closed.Store(true)
	return nil
}

func (s *Store) open() error {
	if s.closed.Load() {
		return fmt.Errorf("usage/dynamodb: table %s: %w: store closed", s.table, usage.ErrUnavailable)
	}
	return nil
}

// fail wraps err: usage.ErrNotInitialized when the table does not exist,
// else usage.ErrUnavailable (unreachable, throttled past the SDK's retries,
// refused credentials, ctx ended). nil stays nil.
func (s *Store) fail(op string, err error) error {
	if err == nil {
		return nil
	}
	var notFound *types.ResourceNotFoundException
	if errors.As(err, &notFound) {
		return fmt.Errorf("usage/dynamodb: %s: %w: table %s does not exist (run mcpgate usage init): %w", op, usage.ErrNotInitialized, s.table, err)
	}
	return fmt.Errorf("usage/dynamodb: %s table %s: %w: %w", op, s.table, usage.ErrUnavailable, err)
}

// failRecord is fail for a request on the item of tenant and period, but
// for DynamoDB's ValidationException, which wraps usage.ErrInvalidRecord:
// DynamoDB refuses the request itself (a key it cannot hold), so retrying
// it cannot help, and the store is not down.
func (s *Store) failRecord(op, tenant, period string, err error) error {
	var apiErr interface{ ErrorCode() string } // smithy.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode() == "ValidationException" {
		return fmt.Errorf("usage/dynamodb: %s tenant %.40q period %q: %w: %w", op, tenant, period, usage.ErrInvalidRecord, err)
	}
	return s.fail(op, err)
}

func key(tenant, period string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		attrTenant: &types.AttributeValueMemberS{Value: tenant},
		attrPeriod: &types.AttributeValueMemberS{Value: period},
	}
}

// usageValues returns u as the expression values :c :r :n :rn.
func usageValues(u limit.Usage) map[string]types.AttributeValue {
	n := func(v int64) types.AttributeValue {
		return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
	}
	return map[string]types.AttributeValue{
		":c": n(u.Charged), ":r": n(u.Refunded), ":n": n(u.Calls), ":rn": n(u.RefundedCalls),
	}
}

// decodeUsage reads the numbers of an item; a missing attribute is 0.
func decodeUsage(item map[string]types.AttributeValue) (limit.Usage, error) {
	var u limit.Usage
	for _, f := range []struct {
		attr string
		dst  *int64
	}{{attrCharged, &u.Charged}, {attrRefunded, &u.Refunded}, {attrCalls, &u.Calls}, {attrRefundedCalls, &u.RefundedCalls}} {
		v, ok := item[f.attr]
		if !ok {
			continue
		}
		n, ok := v.(*types.AttributeValueMemberN)
		if !ok {
			return limit.Usage{}, fmt.Errorf("attribute %s is %T, want a number", f.attr, v)
		}
		x, err := strconv.ParseInt(n.Value, 10, 64)
		if err != nil {
			return limit.Usage{}, fmt.Errorf("attribute %s: %w", f.attr, err)
		}
		*f.dst = x
	}
	return u, nil
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		t = time.Now()
	}
	return t.UTC().Format(time.RFC3339Nano)
}
