package dynamodb_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/mcpgate/mcpgate/internal/testenv"
	"github.com/mcpgate/mcpgate/limit"
	"github.com/mcpgate/mcpgate/usage"
	"github.com/mcpgate/mcpgate/usage/dynamodb"
	"github.com/mcpgate/mcpgate/usage/usagetest"
)

// awsEnv points the standard AWS environment at the emulator, with fake
// credentials, as a deployment would point it at DynamoDB.
func awsEnv(t *testing.T, endpoint string) {
	t.Setenv("AWS_ENDPOINT_URL_DYNAMODB", endpoint)
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_SESSION_TOKEN", "")
	// No shared config or credentials files of the machine.
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}

var tables atomic.Int64

// opener returns a usagetest.Open of fresh tables on one emulator.
func opener(t *testing.T) usagetest.Open {
	awsEnv(t, testenv.StartDynalite(t))
	return func(t *testing.T) usage.Store {
		t.Helper()
		s, err := dynamodb.Open(t.Context(), fmt.Sprintf("usage_test_%d", tables.Add(1)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
}

func TestConformance(t *testing.T) { usagetest.Run(t, opener(t)) }

func TestOpenErrors(t *testing.T) {
	t.Setenv("AWS_REGION", "us-east-1")
	for _, table := range []string{"", "ab", "bad table", "x/y"} {
		if _, err := dynamodb.Open(t.Context(), table); err == nil {
			t.Errorf("Open(%q) succeeded", table)
		}
	}
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	if _, err := dynamodb.Open(t.Context(), "usage"); err == nil {
		t.Errorf("Open without a region succeeded")
	}
}

// A dead endpoint is ErrUnavailable, bounded by ctx; when it comes back the
// data is there.
func TestOutage(t *testing.T) {
	d := testenv.StartDynaliteServer(t)
	awsEnv(t, d.Endpoint)
	t.Setenv("AWS_MAX_ATTEMPTS", "1") // fail fast instead of the SDK's backoff
	s, err := dynamodb.Open(t.Context(), "usage")
	if err != nil {
		t.Fatal(err)
	}
	ctx := usagetest.Ctx(t, time.Minute)
	if err := s.Init(ctx); err != nil {
		t.Fatal(err)
	}
	r := usage.Record{Tenant: "acme", Period: "2026-11", Usage: limit.Usage{Charged: 3, Calls: 3}}
	if err := s.Put(ctx, []usage.Record{r}); err != nil {
		t.Fatal(err)
	}

	d.Kill(t)
	r.Charged, r.Calls = 5, 5
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.Put(short, []usage.Record{r}); !errors.Is(err, usage.ErrUnavailable) {
		t.Fatalf("Put with the endpoint down = %v, want ErrUnavailable", err)
	}
	if err := s.Check(short); !errors.Is(err, usage.ErrUnavailable) || errors.Is(err, usage.ErrNotInitialized) {
		t.Fatalf("Check with the endpoint down = %v, want ErrUnavailable", err)
	}

	d.Restart(t)
	usagetest.Want(t, s, "acme", "2026-11", limit.Usage{Charged: 3, Calls: 3})
	if err := s.Put(ctx, []usage.Record{r}); err != nil {
		t.Fatal(err)
	}
	usagetest.Want(t, s, "acme", "2026-11", limit.Usage{Charged: 5, Calls: 5})
}

// What DynamoDB refuses as a request (ValidationException: a key it cannot
// hold or of another type) wraps ErrInvalidRecord, not ErrUnavailable: the
// store is up and retrying cannot help, so a flusher sets the record aside
// instead of failing every flush for ever. And a table whose key is not
// (tenant S, period S) fails Check, rather than refusing every record.
func TestRequestsDynamoDBRefusesAreInvalid(t *testing.T) {
	awsEnv(t, testenv.StartDynalite(t))
	ctx := usagetest.Ctx(t, time.Minute)
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	client := ddb.NewFromConfig(cfg)
	_, err = client.CreateTable(ctx, &ddb.CreateTableInput{
		TableName: aws.String("usage_numeric"),
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String("tenant"), AttributeType: types.ScalarAttributeTypeN},
			{AttributeName: aws.String("period"), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String("tenant"), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String("period"), KeyType: types.KeyTypeRange},
		},
		BillingMode: types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	numeric, err := dynamodb.New(client, "usage_numeric")
	if err != nil {
		t.Fatal(err)
	}
	waitActive(t, numeric)
	if err := numeric.Check(ctx); err == nil || errors.Is(err, usage.ErrUnavailable) {
		t.Fatalf("Check of a table keyed on a numeric tenant = %v, want a key schema error", err)
	}
	r := usage.Record{Tenant: "acme", Period: "2026-11", Usage: limit.Usage{Charged: 3, Calls: 3}}
	if err := numeric.Put(ctx, []usage.Record{r}); !errors.Is(err, usage.ErrInvalidRecord) || errors.Is(err, usage.ErrUnavailable) {
		t.Fatalf("Put that DynamoDB refuses = %v, want ErrInvalidRecord", err)
	}

	s, err := dynamodb.New(client, "usage_strings")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(ctx); err != nil {
		t.Fatal(err)
	}
	replaced := usage.Record{Tenant: "acme\uFFFD", Period: "2026-11", Usage: limit.Usage{Charged: 7, Calls: 7}}
	if err := s.Put(ctx, []usage.Record{replaced}); err != nil {
		t.Fatal(err)
	}
	// An item edited by hand so that it no longer reads as whole numbers:
	// a record that would be merged into it is refused as invalid (set
	// aside by a flusher), not as a failure that blocks every flush.
	if _, err := client.PutItem(ctx, &ddb.PutItemInput{TableName: aws.String("usage_strings"), Item: map[string]types.AttributeValue{
		"tenant":  &types.AttributeValueMemberS{Value: "credited"},
		"period":  &types.AttributeValueMemberS{Value: "2026-11"},
		"charged": &types.AttributeValueMemberN{Value: "1.5"},
	}}); err != nil {
		t.Fatal(err)
	}
	credited := usage.Record{Tenant: "credited", Period: "2026-11", Usage: limit.Usage{Charged: 1, Calls: 1}}
	if err := s.Put(ctx, []usage.Record{credited}); !errors.Is(err, usage.ErrInvalidRecord) {
		t.Errorf("Put over an item that does not decode = %v, want ErrInvalidRecord", err)
	}
	for name, tenant := range map[string]string{
		// The SDK would send it as "acme\uFFFD" and read that tenant's item.
		"invalid UTF-8":                "acme\xff",
		"over the 2048 bytes of a key": strings.Repeat("t", 2100),
	} {
		if rec, ok, err := s.Get(ctx, tenant, "2026-11"); !errors.Is(err, usage.ErrInvalidRecord) {
			t.Errorf("Get of a tenant %s = %+v, %v, %v; want ErrInvalidRecord", name, rec.Usage, ok, err)
		}
	}
}

// waitActive waits until the table of s can be written (dynalite makes a
// new table ACTIVE after 50ms), whatever its key schema.
func waitActive(t *testing.T, s *dynamodb.Store) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.Check(t.Context())
		if !errors.Is(err, usage.ErrNotInitialized) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("table %s not ACTIVE after 10 s: %v", s.Table(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
