package store

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// The web view's sessions live in the idempotency table, under keys of
// their own (uiSessionPrefix + the session's id), with its TTL attribute:
// every api instance reads the same sessions, and a logout on one ends the
// session on all. A submit's idempotency record under such a key (an
// operator may choose any key) is not a session: it has no token
// fingerprint, and UISession reports it absent.
const uiSessionPrefix = "uisession#"

// uiSessionRecord is a session as stored. Times are Unix seconds: the
// conditional refresh compares last_seen_at as a number.
type uiSessionRecord struct {
	Key              string    `dynamodbav:"idempotency_key"`
	TokenFingerprint string    `dynamodbav:"token_fingerprint"`
	CreatedAt        time.Time `dynamodbav:"created_at,unixtime"`
	LastSeenAt       time.Time `dynamodbav:"last_seen_at,unixtime"`
	// EndedAt is set by a logout (Unix seconds).
	EndedAt int64 `dynamodbav:"ended_at,omitempty"`
	// ExpiresAt, the session's end however active, is the table's TTL
	// attribute too: DynamoDB deletes the item some time after.
	ExpiresAt time.Time `dynamodbav:"expires_at,unixtime"`
}

func uiSessionKey(id string) map[string]types.AttributeValue {
	return key("idempotency_key", uiSessionPrefix+id)
}

// CreateUISession stores a new session; an item already under its id (a
// collision of 256-bit secrets: never) is an error, not overwritten.
func (s *Store) CreateUISession(ctx context.Context, sess domain.UISession) error {
	item, err := attributevalue.MarshalMap(uiSessionRecord{Key: uiSessionPrefix + sess.ID, TokenFingerprint: sess.TokenFingerprint,
		CreatedAt: sess.CreatedAt, LastSeenAt: sess.LastSeenAt, ExpiresAt: sess.ExpiresAt})
	if err != nil {
		return fmt.Errorf("encode ui session: %w", err)
	}
	_, err = s.db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(s.tables.Idempotency), Item: item,
		ConditionExpression:      aws.String("attribute_not_exists(#k)"),
		ExpressionAttributeNames: map[string]string{"#k": "idempotency_key"}})
	return storeErr("create ui session", err)
}

// UISession reads session id (strongly consistent: a logout or a refresh
// on another instance is seen), and false when there is none.
func (s *Store) UISession(ctx context.Context, id string) (domain.UISession, bool, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.tables.Idempotency), Key: uiSessionKey(id),
		ConsistentRead: aws.Bool(true)})
	if err != nil {
		return domain.UISession{}, false, storeErr("get ui session", err)
	}
	var rec uiSessionRecord
	if out.Item == nil {
		return domain.UISession{}, false, nil
	}
	if err := unmarshal(out.Item, &rec); err != nil || rec.TokenFingerprint == "" || rec.EndedAt != 0 {
		return domain.UISession{}, false, nil // not a session's item, or logged out
	}
	return domain.UISession{ID: id, TokenFingerprint: rec.TokenFingerprint, CreatedAt: rec.CreatedAt.UTC(),
		LastSeenAt: rec.LastSeenAt.UTC(), ExpiresAt: rec.ExpiresAt.UTC()}, true, nil
}

// TouchUISession records activity of session id at seen, if the session
// exists, is not ended and its last activity is older: a refresh racing
// another, or one after a logout, writes nothing (and is no error).
func (s *Store) TouchUISession(ctx context.Context, id string, seen time.Time) error {
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(s.tables.Idempotency), Key: uiSessionKey(id),
		UpdateExpression:          aws.String("SET #seen = :seen"),
		ConditionExpression:       aws.String("attribute_exists(#fp) AND attribute_not_exists(#ended) AND #seen < :seen"),
		ExpressionAttributeNames:  map[string]string{"#seen": "last_seen_at", "#fp": "token_fingerprint", "#ended": "ended_at"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":seen": num(seen.Unix())}})
	if isConditionFailed(err) {
		return nil
	}
	return storeErr("touch ui session", err)
}

// EndUISession ends session id (a logout): no later read reports it, on
// any instance. The item is marked ended, its TTL brought to now, rather
// than deleted: the route functions' policy grants no DeleteItem, and
// needs none. Ending one that is ended or gone already is no error.
func (s *Store) EndUISession(ctx context.Context, id string) error {
	now := num(s.now().Unix())
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(s.tables.Idempotency), Key: uiSessionKey(id),
		UpdateExpression:          aws.String("SET #ended = :now, #ttl = :now"),
		ConditionExpression:       aws.String("attribute_exists(#fp) AND attribute_not_exists(#ended)"),
		ExpressionAttributeNames:  map[string]string{"#ended": "ended_at", "#ttl": "expires_at", "#fp": "token_fingerprint"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":now": now}})
	if isConditionFailed(err) {
		return nil
	}
	return storeErr("end ui session", err)
}
