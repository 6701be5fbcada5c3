package storetest_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
)

func TestMain(m *testing.M) { storetest.Main(m) }

// backends are the three endpoints storetest provides.
var backends = []struct {
	name   string
	client func(testing.TB) *dynamodb.Client
	ttl    bool // the emulator implements UpdateTimeToLive
}{
	{"embedded", storetest.Embedded, false},
	{"moto", storetest.Moto, true},
	{"moto-single", func(t testing.TB) *dynamodb.Client {
		return storetest.Client(storetest.MotoSingleThreaded(t))
	}, true},
}

func TestBackends(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			db := b.client(t)
			prefix := storetest.Prefix(t)
			names := store.NamesFor(prefix)

			if err := schema.EnsureTables(ctx, db, prefix); err != nil {
				t.Fatalf("EnsureTables: %v", err)
			}
			// Idempotent: a second run finds every table and TTL in place.
			if err := schema.EnsureTables(ctx, db, prefix); err != nil {
				t.Fatalf("second EnsureTables: %v", err)
			}

			desc, err := db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(names.Invocations)})
			if err != nil {
				t.Fatalf("DescribeTable: %v", err)
			}
			if n := len(desc.Table.GlobalSecondaryIndexes); n != 4 {
				t.Errorf("invocations table has %d GSIs, want 4", n)
			}

			if b.ttl {
				ttl, err := db.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(names.Invocations)})
				if err != nil {
					t.Fatalf("DescribeTimeToLive: %v", err)
				}
				if d := ttl.TimeToLiveDescription; d == nil || d.TimeToLiveStatus != types.TimeToLiveStatusEnabled ||
					aws.ToString(d.AttributeName) != "expires_at" {
					t.Errorf("TTL = %+v, want ENABLED on expires_at", d)
				}
			}

			item := map[string]types.AttributeValue{
				"invocation_id": &types.AttributeValueMemberS{Value: "inv_1"},
				"queue":         &types.AttributeValueMemberS{Value: "default"},
				"claim_key":     &types.AttributeValueMemberS{Value: "default#"},
				"state":         &types.AttributeValueMemberS{Value: "queued"},
				"version":       &types.AttributeValueMemberN{Value: "1"},
			}
			if _, err := db.PutItem(ctx, &dynamodb.PutItemInput{
				TableName:           aws.String(names.Invocations),
				Item:                item,
				ConditionExpression: aws.String("attribute_not_exists(invocation_id)"),
			}); err != nil {
				t.Fatalf("PutItem: %v", err)
			}
			got, err := db.GetItem(ctx, &dynamodb.GetItemInput{
				TableName:      aws.String(names.Invocations),
				Key:            map[string]types.AttributeValue{"invocation_id": &types.AttributeValueMemberS{Value: "inv_1"}},
				ConsistentRead: aws.Bool(true),
			})
			if err != nil {
				t.Fatalf("GetItem: %v", err)
			}
			if s, ok := got.Item["state"].(*types.AttributeValueMemberS); !ok || s.Value != "queued" {
				t.Fatalf("GetItem state = %#v, want queued", got.Item["state"])
			}

			// The sparse claim index finds the item; the holder index does not.
			for index, want := range map[string]int{"claim": 1, "holder": 0} {
				attr := map[string]string{"claim": "claim_key", "holder": "holder"}[index]
				q, err := db.Query(ctx, &dynamodb.QueryInput{
					TableName:                 aws.String(names.Invocations),
					IndexName:                 aws.String(index),
					KeyConditionExpression:    aws.String("#k = :v"),
					ExpressionAttributeNames:  map[string]string{"#k": attr},
					ExpressionAttributeValues: map[string]types.AttributeValue{":v": &types.AttributeValueMemberS{Value: "default#"}},
				})
				if err != nil {
					t.Fatalf("Query %s: %v", index, err)
				}
				if len(q.Items) != want {
					t.Errorf("Query %s: %d items, want %d", index, len(q.Items), want)
				}
			}

			// Another prefix on the same endpoint sees none of it.
			other := store.NamesFor(storetest.Prefix(t))
			if _, err := db.GetItem(ctx, &dynamodb.GetItemInput{
				TableName: aws.String(other.Invocations),
				Key:       map[string]types.AttributeValue{"invocation_id": &types.AttributeValueMemberS{Value: "inv_1"}},
			}); err == nil {
				t.Errorf("GetItem on a table of another prefix succeeded")
			}
		})
	}
}

// TestEmbeddedConcurrentSchema runs table and item calls side by side on the
// embedded store; with -race it checks that store.EmbeddedHandler covers minidyn's
// unlocked table operations.
func TestEmbeddedConcurrentSchema(t *testing.T) {
	ctx := context.Background()
	db := storetest.Embedded(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			prefix := storetest.Prefix(t)
			if err := schema.EnsureTables(ctx, db, prefix); err != nil {
				errs <- err
				return
			}
			_, err := db.PutItem(ctx, &dynamodb.PutItemInput{
				TableName: aws.String(store.NamesFor(prefix).Queues),
				Item:      map[string]types.AttributeValue{"queue": &types.AttributeValueMemberS{Value: "q"}},
			})
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestPrefixIsUniqueAndValid(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		p := storetest.Prefix(t)
		if seen[p] {
			t.Fatalf("prefix %q repeated", p)
		}
		seen[p] = true
		if !strings.HasPrefix(p, "t") || !strings.HasSuffix(p, "-") {
			t.Fatalf("prefix %q, want t<random>-", p)
		}
	}
}

func TestExternalEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name, value, want, err string
	}{
		{name: "unset"},
		{name: "blank", value: "  "},
		{name: "localstack", value: "http://127.0.0.1:4566", want: "http://127.0.0.1:4566"},
		{name: "trailing slash", value: "http://localhost:4566/", want: "http://localhost:4566"},
		{name: "https", value: " https://dynamo.example:8443 ", want: "https://dynamo.example:8443"},
		{name: "no scheme", value: "127.0.0.1:4566", err: "want a URL such as"},
		{name: "other scheme", value: "ftp://127.0.0.1:4566", err: "want a URL such as"},
		{name: "no host", value: "http://", err: "want a URL such as"},
		{name: "path", value: "http://127.0.0.1:4566/dynamodb", err: "want a URL such as"},
		{name: "unparseable", value: "http://[::1", err: storetest.EndpointEnv},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(storetest.EndpointEnv, tc.value)
			got, err := storetest.ExternalEndpoint()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ExternalEndpoint() = %q, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ExternalEndpoint() = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestMotoEndpointOverride points EndpointEnv at an embedded server: Moto and
// MotoEndpoint then reach that server, whether or not moto is installed.
func TestMotoEndpointOverride(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := storetest.EmbeddedEndpoint(t)
	t.Setenv(storetest.EndpointEnv, srv+"/")
	if got := storetest.MotoEndpoint(t); got != srv {
		t.Fatalf("MotoEndpoint = %q, want the override %q", got, srv)
	}
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(ctx, storetest.Moto(t), prefix); err != nil {
		t.Fatalf("EnsureTables through Moto: %v", err)
	}
	// The tables are on the embedded server, reached directly.
	if _, err := storetest.Client(srv).DescribeTable(ctx, &dynamodb.DescribeTableInput{
		TableName: aws.String(store.NamesFor(prefix).Invocations),
	}); err != nil {
		t.Fatalf("DescribeTable on the override endpoint: %v", err)
	}
}
