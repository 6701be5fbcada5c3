package storetest_test

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
)

func TestCountRequestsByOperation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	plain := storetest.Embedded(t)
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(ctx, plain, prefix); err != nil {
		t.Fatalf("EnsureTables: %v", err)
	}
	table := aws.String(store.NamesFor(prefix).Queues)

	var c storetest.Counter
	db := storetest.CountingClient(plain, &c)
	item := map[string]types.AttributeValue{"queue": &types.AttributeValueMemberS{Value: "q"}}
	if _, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: item}); err != nil {
		t.Fatalf("PutItem: %v", err)
	}
	// A refused conditional write is a request too.
	_, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: item,
		ConditionExpression: aws.String("attribute_not_exists(#q)"), ExpressionAttributeNames: map[string]string{"#q": "queue"}})
	if _, ok := errors.AsType[*types.ConditionalCheckFailedException](err); !ok {
		t.Fatalf("conditional PutItem: err = %v, want ConditionalCheckFailedException", err)
	}
	for range 3 {
		if _, err := db.GetItem(ctx, &dynamodb.GetItemInput{TableName: table, Key: item}); err != nil {
			t.Fatalf("GetItem: %v", err)
		}
	}
	// The client the counting one was copied from is not counted.
	if _, err := plain.GetItem(ctx, &dynamodb.GetItemInput{TableName: table, Key: item}); err != nil {
		t.Fatalf("GetItem: %v", err)
	}

	want := map[string]int{"PutItem": 2, "GetItem": 3}
	if got := c.Snapshot(); !maps.Equal(got, want) {
		t.Fatalf("Snapshot = %v, want %v", got, want)
	}
	if got := c.Total(); got != 5 {
		t.Fatalf("Total = %d, want 5", got)
	}
	if got := c.Get("GetItem"); got != 3 {
		t.Fatalf("Get(GetItem) = %d, want 3", got)
	}
	snap := c.Snapshot()
	snap["PutItem"] = 100 // a snapshot is the caller's copy
	if got := c.Get("PutItem"); got != 2 {
		t.Fatalf("writing a snapshot changed the counter: PutItem = %d", got)
	}

	c.Reset()
	if got := c.Total(); got != 0 || len(c.Snapshot()) != 0 {
		t.Fatalf("after Reset: Total = %d, Snapshot = %v", got, c.Snapshot())
	}
	// A per-call option counts that call only, in a second counter.
	var once storetest.Counter
	if _, err := db.GetItem(ctx, &dynamodb.GetItemInput{TableName: table, Key: item}, storetest.CountRequests(&once)); err != nil {
		t.Fatalf("GetItem: %v", err)
	}
	if c.Total() != 1 || once.Total() != 1 {
		t.Fatalf("after one counted call: client counter %v, call counter %v", c.Snapshot(), once.Snapshot())
	}
}

// TestCountRequestsCountsRetries shows that each HTTP attempt counts: the
// server fails twice with a retryable 500, then answers. CountCalls counts
// the call once.
func TestCountRequestsCountsRetries(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		if calls.Add(1) <= 2 {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"try again"}`))
			return
		}
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()

	var c, once storetest.Counter
	db := dynamodb.New(storetest.Client(srv.URL).Options(), storetest.CountRequests(&c), storetest.CountCalls(&once), func(o *dynamodb.Options) {
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			so.MaxAttempts = 5
			so.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
		})
	})
	_, err := db.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String("t"),
		Key:       map[string]types.AttributeValue{"k": &types.AttributeValueMemberS{Value: "v"}},
	})
	if err != nil {
		t.Fatalf("GetItem: %v", err)
	}
	if got := c.Get("GetItem"); got != 3 || calls.Load() != 3 {
		t.Fatalf("counted %d GetItem requests, server saw %d; want 3 and 3", got, calls.Load())
	}
	if got := once.Snapshot(); !maps.Equal(got, map[string]int{"GetItem": 1}) {
		t.Fatalf("CountCalls counted %v; want one GetItem", got)
	}
}

func TestCounterConcurrentUse(t *testing.T) {
	var c storetest.Counter
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			op := []string{"Query", "PutItem"}[i%2]
			for range 100 {
				c.Add(op)
				_ = c.Snapshot()
				_ = c.Total()
			}
		})
	}
	wg.Wait()
	if got := c.Snapshot(); got["Query"] != 800 || got["PutItem"] != 800 || c.Total() != 1600 {
		t.Fatalf("Snapshot = %v, Total = %d; want 800 each, 1600", got, c.Total())
	}
}
