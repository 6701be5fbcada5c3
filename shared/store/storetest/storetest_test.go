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

	"github.com/dreamlake/lakeshore/shared/store"
	"github.com/dreamlake/lakeshore/shared/store/schema"
	"github.com/dreamlake/lakeshore/shared/store/storetest"
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
