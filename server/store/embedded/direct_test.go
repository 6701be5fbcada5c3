package embedded_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/embedded"
)

// TestDirectAnswersAsTheEndpoint: a client whose requests go to the
// handler in process (embedded.Direct, as `lakeshore dev` reaches its own
// store) and one that reaches the same handler over its endpoint see the
// same store, the same answers and the same errors, a refused condition
// included; a request whose context has ended is not served.
func TestDirectAnswersAsTheEndpoint(t *testing.T) {
	h := embedded.Handler()
	srv := httptest.NewServer(h)
	defer srv.Close()
	in := store.EndpointClient(srv.URL, func(o *dynamodb.Options) { o.HTTPClient = embedded.Direct{Handler: h} })
	over := store.EndpointClient(srv.URL)
	ctx := context.Background()
	s := func(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
	if _, err := in.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName: aws.String("t"), BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("pk"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: types.KeyTypeHash}},
	}); err != nil {
		t.Fatalf("create table in process: %v", err)
	}
	put := &dynamodb.PutItemInput{TableName: aws.String("t"), Item: map[string]types.AttributeValue{"pk": s("a"), "v": s("1")},
		ConditionExpression: aws.String("attribute_not_exists(pk)")}
	if _, err := in.PutItem(ctx, put); err != nil {
		t.Fatalf("put in process: %v", err)
	}
	for name, c := range map[string]*dynamodb.Client{"in process": in, "over the endpoint": over} {
		var refused *types.ConditionalCheckFailedException
		if _, err := c.PutItem(ctx, put); !errors.As(err, &refused) {
			t.Errorf("%s: the same conditional put again: %v; want ConditionalCheckFailedException", name, err)
		}
		out, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String("t"), Key: map[string]types.AttributeValue{"pk": s("a")}})
		if err != nil {
			t.Fatalf("%s: get: %v", name, err)
		}
		if v, ok := out.Item["v"].(*types.AttributeValueMemberS); !ok || v.Value != "1" {
			t.Errorf("%s: got %v, want the item put in process", name, out.Item)
		}
		var missing *types.ResourceNotFoundException
		if _, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String("none"), Key: map[string]types.AttributeValue{"pk": s("a")}}); !errors.As(err, &missing) {
			t.Errorf("%s: get from no table: %v; want ResourceNotFoundException", name, err)
		}
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := in.PutItem(done, &dynamodb.PutItemInput{TableName: aws.String("t"), Item: map[string]types.AttributeValue{"pk": s("b")}}); !errors.Is(err, context.Canceled) {
		t.Errorf("put with an ended context: %v; want context.Canceled", err)
	}
	if out, err := over.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String("t"), Key: map[string]types.AttributeValue{"pk": s("b")}}); err != nil || out.Item != nil {
		t.Errorf("the put with an ended context was served: %v, %v", out.Item, err)
	}
}
