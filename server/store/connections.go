package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
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
// ConnectedAt orders one worker's sockets, so a cap on them can replace the
// oldest (zero on items written without it: they count as the oldest).
type Connection struct {
	ID          string
	WorkerID    string
	Keys        []string
	ConnectedAt time.Time
	ExpiresAt   time.Time
}

// connectionKeyPrefix marks the item that names a connection's keys. Wake
// keys hold "#" and worker keys "worker/", so it never meets one.
const connectionKeyPrefix = "connection/"

// connectionsPage is the Limit of one page of a key's sockets, and
// maxConnectionsPages how many pages one listing reads at most (a cap on
// each worker's sockets keeps a key's listeners to a few per worker).
const (
	connectionsPage     = 100
	maxConnectionsPages = 50
)

// maxConnectionKeys bounds the items one connection writes: a transaction
// holds at most 100, one of them the connection's own item.
const maxConnectionKeys = 99

type connectionRecord struct {
	WakeKey      string   `dynamodbav:"wake_key"`
	ConnectionID string   `dynamodbav:"connection_id"`
	WorkerID     string   `dynamodbav:"worker_id"`
	Keys         []string `dynamodbav:"keys,omitempty"`
	ConnectedAt  int64    `dynamodbav:"connected_at,omitempty"` // Unix ms
	ExpiresAt    int64    `dynamodbav:"expires_at"`
}

// PutConnection records c: one item per wake key, and one naming them all,
// in one transaction, so a connection is findable under all its keys or
// none.
func (s *Store) PutConnection(ctx context.Context, c Connection) error {
	if len(c.Keys) > maxConnectionKeys {
		return fmt.Errorf("put connection %s: %d wake keys, at most %d", c.ID, len(c.Keys), maxConnectionKeys)
	}
	exp, at := c.ExpiresAt.Unix(), unixMilli(c.ConnectedAt)
	recs := []connectionRecord{{WakeKey: connectionKeyPrefix + c.ID, ConnectionID: c.ID, WorkerID: c.WorkerID, Keys: c.Keys, ConnectedAt: at, ExpiresAt: exp}}
	for _, k := range c.Keys {
		recs = append(recs, connectionRecord{WakeKey: k, ConnectionID: c.ID, WorkerID: c.WorkerID, ConnectedAt: at, ExpiresAt: exp})
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
	c = r.connection()
	c.Keys = r.Keys
	items := []types.TransactWriteItem{{Delete: &types.Delete{TableName: aws.String(s.tables.Connections), Key: connectionKey(connectionKeyPrefix+id, id)}}}
	for _, k := range r.Keys {
		items = append(items, types.TransactWriteItem{Delete: &types.Delete{TableName: aws.String(s.tables.Connections), Key: connectionKey(k, id)}})
	}
	if _, err := s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items}); err != nil {
		return Connection{}, false, storeErr("delete connection "+id, err)
	}
	return c, true, nil
}

// Connections lists unexpired connections listening on wake key (all but
// Keys set) for a wake to choose from: every one when the key has at most
// connectionsSample, else a sample of that many from a random point of
// their expiries (connectionsFrom), so a wake costs the same however large
// the fleet, and every listener is about as likely to be in it. It reads
// the table's live index, keyed by expiry, from now on: the expired items
// TTL has not deleted yet (a socket whose $disconnect never ran, a worker
// long gone) cost it nothing. It reads eventually consistently, as an
// index does: a wake is a hint, and the poll is what claims.
func (s *Store) Connections(ctx context.Context, wakeKey string) ([]Connection, error) {
	now := s.now().Unix()
	head, err := s.liveConnections(ctx, wakeKey, "expires_at > :a", now, 0, connectionsSample+1, true)
	if err != nil || len(head) <= connectionsSample {
		return head, err
	}
	tail, err := s.liveConnections(ctx, wakeKey, "expires_at > :a", now, 0, 1, false)
	if err != nil || len(tail) == 0 {
		return head[:connectionsSample], err
	}
	return s.connectionsFrom(ctx, wakeKey, now, head[0].ExpiresAt.Unix(), tail[0].ExpiresAt.Unix())
}

// connectionsSample is how many of a key's listeners one wake reads at
// most: it wakes two workers among them.
const connectionsSample = 32

// connectionsFrom reads connectionsSample listeners of wakeKey from a
// random expiry between first and last on, and from the earliest on when
// that runs out.
func (s *Store) connectionsFrom(ctx context.Context, wakeKey string, now, first, last int64) ([]Connection, error) {
	pivot := first + int64(s.Random()%uint64(last-first+1))
	cs, err := s.liveConnections(ctx, wakeKey, "expires_at >= :a", pivot, 0, connectionsSample, true)
	if err != nil || len(cs) >= connectionsSample {
		return cs, err
	}
	more, err := s.liveConnections(ctx, wakeKey, "expires_at BETWEEN :a AND :b", now+1, pivot-1, connectionsSample-len(cs), true)
	return append(cs, more...), err
}

// liveConnections reads up to limit connections of wakeKey from the live
// index whose expiry meets cond (over :a, and :b when cond names it), in
// expiry order (forward: soonest first).
func (s *Store) liveConnections(ctx context.Context, wakeKey, cond string, a, b int64, limit int, forward bool) ([]Connection, error) {
	vals := map[string]types.AttributeValue{":k": str(wakeKey), ":a": num(a)}
	if strings.Contains(cond, ":b") {
		if b < a {
			return nil, nil
		}
		vals[":b"] = num(b)
	}
	out, err := s.db.Query(ctx, &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Connections),
		IndexName:                 aws.String(indexLiveConnections),
		KeyConditionExpression:    aws.String("wake_key = :k AND " + cond),
		ExpressionAttributeValues: vals,
		ScanIndexForward:          aws.Bool(forward),
		Limit:                     aws.Int32(int32(limit)),
	})
	if err != nil {
		return nil, storeErr("list connections of "+wakeKey, err)
	}
	var recs []connectionRecord
	if err := attributevalue.UnmarshalListOfMaps(out.Items, &recs); err != nil {
		return nil, fmt.Errorf("decode connections of %s: %w", wakeKey, err)
	}
	cs := make([]Connection, 0, len(recs))
	for _, r := range recs {
		cs = append(cs, r.connection())
	}
	return cs, nil
}

// ConnectionsConsistent is Connections read consistently, from the table:
// the cap on a worker's sockets counts them right after a put. It reads
// the key's expired items too (DynamoDB applies Limit before the filter,
// so a page of them comes back short, even empty, with more to read); a
// worker's own key holds only its sockets.
func (s *Store) ConnectionsConsistent(ctx context.Context, wakeKey string) ([]Connection, error) {
	return s.connections(ctx, wakeKey, &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Connections),
		KeyConditionExpression:    aws.String("wake_key = :k"),
		FilterExpression:          aws.String("expires_at > :now"),
		ExpressionAttributeValues: s.connectionValues(wakeKey),
		Limit:                     aws.Int32(connectionsPage),
		ConsistentRead:            aws.Bool(true),
	})
}

// indexLiveConnections is the connections table's index of each wake
// key's sockets by expiry (template.yaml).
const indexLiveConnections = "live"

func (s *Store) connectionValues(wakeKey string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		":k": str(wakeKey), ":now": &types.AttributeValueMemberN{Value: strconv.FormatInt(s.now().Unix(), 10)},
	}
}

func (s *Store) connections(ctx context.Context, wakeKey string, in *dynamodb.QueryInput) ([]Connection, error) {
	var cs []Connection
	for range maxConnectionsPages {
		out, err := s.db.Query(ctx, in)
		if err != nil {
			return nil, storeErr("list connections of "+wakeKey, err)
		}
		var recs []connectionRecord
		if err := attributevalue.UnmarshalListOfMaps(out.Items, &recs); err != nil {
			return nil, fmt.Errorf("decode connections of %s: %w", wakeKey, err)
		}
		for _, r := range recs {
			cs = append(cs, r.connection())
		}
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
	return cs, nil
}

func (r connectionRecord) connection() Connection {
	c := Connection{ID: r.ConnectionID, WorkerID: r.WorkerID, ExpiresAt: time.Unix(r.ExpiresAt, 0).UTC()}
	if r.ConnectedAt != 0 {
		c.ConnectedAt = time.UnixMilli(r.ConnectedAt).UTC()
	}
	return c
}

func unixMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func connectionKey(wakeKey, id string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"wake_key": str(wakeKey), "connection_id": str(id)}
}
