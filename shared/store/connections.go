package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Connection is one open wake socket (docs/dispatch.md): API Gateway's
// connection id, the worker that opened it, and the wake keys it listens on
// (wake.Key of each queue the worker serves, for any host and for its own).
// Its items expire at ExpiresAt even if no $disconnect removes them.
type Connection struct {
	ID        string
	WorkerID  string
	Keys      []string
	ExpiresAt time.Time
}

// connectionKeyPrefix marks the item that names a connection's keys. Wake
// keys hold "#" and worker keys "worker/", so it never meets one.
const connectionKeyPrefix = "connection/"

// maxConnectionKeys bounds the items one connection writes: a transaction
// holds at most 100, one of them the connection's own item.
const maxConnectionKeys = 99

type connectionRecord struct {
	WakeKey      string   `dynamodbav:"wake_key"`
	ConnectionID string   `dynamodbav:"connection_id"`
	WorkerID     string   `dynamodbav:"worker_id"`
	Keys         []string `dynamodbav:"keys,omitempty"`
	ExpiresAt    int64    `dynamodbav:"expires_at"`
}

// PutConnection records c: one item per wake key, and one naming them all,
// in one transaction, so a connection is findable under all its keys or
// none.
func (s *Store) PutConnection(ctx context.Context, c Connection) error {
	if len(c.Keys) > maxConnectionKeys {
		return fmt.Errorf("put connection %s: %d wake keys, at most %d", c.ID, len(c.Keys), maxConnectionKeys)
	}
	exp := c.ExpiresAt.Unix()
	recs := []connectionRecord{{WakeKey: connectionKeyPrefix + c.ID, ConnectionID: c.ID, WorkerID: c.WorkerID, Keys: c.Keys, ExpiresAt: exp}}
	for _, k := range c.Keys {
		recs = append(recs, connectionRecord{WakeKey: k, ConnectionID: c.ID, WorkerID: c.WorkerID, ExpiresAt: exp})
	}
	items := make([]types.TransactWriteItem, 0, len(recs))
	for _, r := range recs {
		item, err := attributevalue.MarshalMap(r)
		if err != nil {
			return fmt.Errorf("encode connection %s: %w", c.ID, err)
		}
		items = append(items, types.TransactWriteItem{Put: &types.Put{TableName: aws.String(s.tables.Connections), Item: item}})
	}
	if _, err := s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items}); err != nil {
		return storeErr("put connection "+c.ID, err)
	}
	return nil
}

// DeleteConnection removes connection id's items and reports what it was
// (found false: it was never recorded, or is already gone).
func (s *Store) DeleteConnection(ctx context.Context, id string) (c Connection, found bool, err error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.tables.Connections),
		Key:            connectionKey(connectionKeyPrefix+id, id),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return Connection{}, false, storeErr("get connection "+id, err)
	}
	if out.Item == nil {
		return Connection{}, false, nil
	}
	var r connectionRecord
	if err := unmarshal(out.Item, &r); err != nil {
		return Connection{}, false, fmt.Errorf("decode connection %s: %w", id, err)
	}
	c = Connection{ID: id, WorkerID: r.WorkerID, Keys: r.Keys, ExpiresAt: time.Unix(r.ExpiresAt, 0).UTC()}
	items := []types.TransactWriteItem{{Delete: &types.Delete{TableName: aws.String(s.tables.Connections), Key: connectionKey(connectionKeyPrefix+id, id)}}}
	for _, k := range r.Keys {
		items = append(items, types.TransactWriteItem{Delete: &types.Delete{TableName: aws.String(s.tables.Connections), Key: connectionKey(k, id)}})
	}
	if _, err := s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items}); err != nil {
		return Connection{}, false, storeErr("delete connection "+id, err)
	}
	return c, true, nil
}

// Connections lists up to limit unexpired connections listening on wake
// key (ID and WorkerID set). It reads the index eventually consistently:
// a wake is a hint, and the poll is what claims.
func (s *Store) Connections(ctx context.Context, wakeKey string, limit int) ([]Connection, error) {
	out, err := s.db.Query(ctx, &dynamodb.QueryInput{
		TableName:              aws.String(s.tables.Connections),
		KeyConditionExpression: aws.String("wake_key = :k"),
		FilterExpression:       aws.String("expires_at > :now"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":k": str(wakeKey), ":now": &types.AttributeValueMemberN{Value: strconv.FormatInt(s.now().Unix(), 10)},
		},
		Limit: aws.Int32(int32(limit)),
	})
	if err != nil {
		return nil, storeErr("list connections of "+wakeKey, err)
	}
	var recs []connectionRecord
	if err := attributevalue.UnmarshalListOfMaps(out.Items, &recs); err != nil {
		return nil, fmt.Errorf("decode connections of %s: %w", wakeKey, err)
	}
	cs := make([]Connection, len(recs))
	for i, r := range recs {
		cs[i] = Connection{ID: r.ConnectionID, WorkerID: r.WorkerID, ExpiresAt: time.Unix(r.ExpiresAt, 0).UTC()}
	}
	return cs, nil
}

func connectionKey(wakeKey, id string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"wake_key": str(wakeKey), "connection_id": str(id)}
}
