// Package store keeps the control plane's state in DynamoDB through the AWS
// SDK: one implementation, the same code against AWS, moto_server, LocalStack
// and the embedded minidyn server.
//
// Every state transition is a conditional write. Items are written whole, as
// a put guarded by their version attribute (optimistic concurrency: read,
// compute the next item in Go, put with version = :v). That is also how the
// sparse index attributes (claim_key, holder) come and go: an UpdateExpression
// REMOVE would do it on AWS, but minidyn v0.8.2 ignores a top-level REMOVE
// and the index would keep the item, while a whole-item put is indexed right
// on every engine. UpdateExpressions are kept to SET and ADD.
package store

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
)

// DB is the part of the DynamoDB client the store uses.
type DB interface {
	GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	Query(context.Context, *dynamodb.QueryInput, ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	Scan(context.Context, *dynamodb.ScanInput, ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
	TransactWriteItems(context.Context, *dynamodb.TransactWriteItemsInput, ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
	BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
}

var _ DB = (*dynamodb.Client)(nil)

// Index names on the invocations table (template.yaml).
const (
	indexClaim      = "claim"       // claim_key = queue#host_key, only while queued
	indexHolder     = "holder"      // holder = worker id, only while running
	indexQueue      = "queue"       // every invocation of a queue
	indexQueueState = "queue_state" // queue_state = queue#state (queueState)
)

// Defaults of the knobs on Store.
const (
	defaultClaimWindow = 64
	// defaultClaimPoolTTL bounds how stale a pooled candidate may be: a
	// second, so work another process queued meanwhile waits at most that.
	defaultClaimPoolTTL = time.Second
	claimRounds         = 4
	maxClaimWindow      = 256
	defaultTerminalTTL  = 30 * 24 * time.Hour
	maxVersionRetries   = 10
)

// errVersion reports a lost optimistic-concurrency race: the item changed
// between our read and our put. Callers re-read and try again.
var errVersion = errors.New("item changed concurrently")

// Store is the control plane's state. Its fields may be set before first use.
type Store struct {
	db     DB
	tables TableNames

	// Clock is read once per operation (zero: real time; times are stored
	// in UTC).
	Clock clock.Clock
	// IDs makes invocation, worker and command ids.
	IDs *ids.Generator
	// Shuffle orders claim candidates so racing pollers spread out over the
	// head of the queue instead of all fighting for its first item.
	Shuffle func(n int, swap func(i, j int))
	// Random places a spread claim's read in its partition (readSpread).
	Random func() uint64
	// SpreadClaims reads claim candidates from a random point of the
	// partition from the first claim on, not from its head: for a process
	// that is one of many claiming from the same queue (each Lambda
	// instance). Without it a process reads the head, in order, until it
	// loses a race to another process.
	SpreadClaims bool
	// ClaimWindow is how many queued candidates one claim query reads.
	ClaimWindow int
	// ClaimPoolTTL is how long candidates a claim query read are handed to
	// this store's later claims before the index is read again (claimPool;
	// 0: every claim reads the index).
	ClaimPoolTTL time.Duration
	// ClaimShards splits each queue's claim partition in this many (0 or
	// 1: one). Raise it for a queue busier than one index partition takes;
	// never lower it while work is queued: work in a dropped shard would
	// wait until the count is raised again.
	ClaimShards int
	// RememberWrites is for a process that serves all of its workers'
	// polls and acks (`lakeshore dev`). Its store remembers the rows it
	// writes and reads. A heartbeat that changes a worker's row then
	// writes it against the row remembered, without reading it first
	// (Store.Heartbeat); the version guards the write, and a row another
	// process changed since costs a failed write and a read. And a poll
	// that still lists an invocation this store recorded finished is told
	// so without a read (KnownFinished). Off for a Lambda instance, one of
	// many that a worker's requests reach, where what it remembers is
	// mostly stale.
	RememberWrites bool
	// TerminalTTL is how long a finished invocation is kept (DynamoDB TTL).
	TerminalTTL time.Duration
	// LogTTL is how long shipped output is kept (DynamoDB TTL).
	LogTTL time.Duration
	// WorkerRetention is how long a gone worker's row is kept after it
	// went gone, once the sweep is done with it (reaped; DynamoDB TTL).
	WorkerRetention time.Duration
	// NeverPolledRetention is how long a worker that said hello and never
	// polled (joining) is kept (DynamoDB TTL); its first poll clears it.
	NeverPolledRetention time.Duration

	pool claimPool
	// claimed remembers, for the ack, the invocations this store claimed
	// as it wrote them: an ack of the attempt it claimed (the common case,
	// when one process serves polls and acks) is written against that
	// version at once, with no read first; one that changed since falls
	// back to reading it (Store.Ack).
	claimed recent[claimedEntry]
	// workers remembers each worker row as this store last wrote or read
	// it: a poll's heartbeat that changes the row writes it against that
	// version without reading it first (Store.Heartbeat). A busy worker's
	// row changes at every poll, and one process serves all its polls in
	// `lakeshore dev`.
	workers recent[domain.Worker]
	// finished holds invocations this store wrote or read finished
	// (RememberWrites; KnownFinished).
	finished recent[struct{}]
	// queuesNoted holds the queues this process recorded in the queues
	// table (NoteQueue): at most one write per queue per process.
	queuesNoted sync.Map
	// backfill records that BackfillIndexes found its work done.
	backfill backfilled
}

// New returns a store over db with tables named prefix + fixed suffixes.
func New(db DB, prefix string) *Store {
	return &Store{
		db:           db,
		tables:       NamesFor(prefix),
		IDs:          &ids.Generator{},
		Shuffle:      rand.Shuffle,
		Random:       rand.Uint64,
		ClaimWindow:  defaultClaimWindow,
		ClaimPoolTTL: defaultClaimPoolTTL,
		TerminalTTL:  defaultTerminalTTL,
		LogTTL:       domain.DefaultLogRetention,

		WorkerRetention:      domain.DefaultWorkerRetention,
		NeverPolledRetention: domain.DefaultNeverPolledRetention,
	}
}

// DB reports the client the store reads and writes through.
func (s *Store) DB() DB { return s.db }

// Tables reports the table names the store uses.
func (s *Store) Tables() TableNames { return s.tables }

func (s *Store) now() time.Time { return s.Clock.Now().UTC() }

// Ping reports whether the store answers.
func (s *Store) Ping(ctx context.Context) error {
	_, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Queues),
		Key:       key("queue", "_healthz"),
	})
	if err != nil {
		return storeErr("ping", err)
	}
	return nil
}

func key(name, value string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{name: &types.AttributeValueMemberS{Value: value}}
}

// queueState is an invocation's key in the queue_state index.
func queueState(queue string, state domain.InvocationState) string {
	return queue + "#" + string(state)
}

func str[S ~string](v S) types.AttributeValue {
	return &types.AttributeValueMemberS{Value: string(v)}
}

func num(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

// versionCondition guards a whole-item put: the item must not exist yet
// (prev == 0) or must still be at version prev.
func versionCondition(hashKey string, prev int64) (string, map[string]string, map[string]types.AttributeValue) {
	if prev == 0 {
		return "attribute_not_exists(#k)", map[string]string{"#k": hashKey}, nil
	}
	return "#v = :v", map[string]string{"#v": "version"}, map[string]types.AttributeValue{":v": num(prev)}
}

// versionedPut returns the put of item guarded by versionCondition.
func versionedPut(table, hashKey string, item map[string]types.AttributeValue, prev int64) *types.Put {
	cond, names, values := versionCondition(hashKey, prev)
	return &types.Put{
		TableName:                 aws.String(table),
		Item:                      dropEmpty(item),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
	}
}

// dropEmpty removes empty maps and lists, at any depth, from item. minidyn
// v0.8.2 drops an empty M or L from a stored item and garbles it in an index
// projection; leaving them out reads back the same (zero) value everywhere.
func dropEmpty(item map[string]types.AttributeValue) map[string]types.AttributeValue {
	for k, v := range item {
		switch v := v.(type) {
		case *types.AttributeValueMemberM:
			dropEmpty(v.Value)
			if len(v.Value) == 0 {
				delete(item, k)
			}
		case *types.AttributeValueMemberL:
			v.Value = dropEmptyElems(v.Value)
			if len(v.Value) == 0 {
				delete(item, k)
			}
		}
	}
	return item
}

// dropEmptyElems does dropEmpty for the elements of a list: empty maps and
// lists in it are removed, and the rest cleaned.
func dropEmptyElems(list []types.AttributeValue) []types.AttributeValue {
	out := list[:0]
	for _, e := range list {
		switch e := e.(type) {
		case *types.AttributeValueMemberM:
			if len(dropEmpty(e.Value)) == 0 {
				continue
			}
		case *types.AttributeValueMemberL:
			if e.Value = dropEmptyElems(e.Value); len(e.Value) == 0 {
				continue
			}
		}
		out = append(out, e)
	}
	return out
}

// put runs one versioned put, mapping a failed condition to errVersion.
func (s *Store) put(ctx context.Context, p *types.Put) error {
	_, err := s.db.PutItem(ctx, putInput(p))
	if isConditionFailed(err) || isTransactionConflict(err) {
		return errVersion
	}
	return err
}

// putNew runs the put of an item under an id this process just made (a
// new ULID): its condition fails only if the item exists, and nothing but
// this put writes that id, so the item is this put's own, applied by an
// earlier try whose answer was lost (the SDK retries a 5xx or a dropped
// connection). That counts as written.
func (s *Store) putNew(ctx context.Context, p *types.Put) error {
	_, err := s.db.PutItem(ctx, putInput(p))
	if isConditionFailed(err) {
		return nil
	}
	return err
}

// putInput is a transaction's put as a PutItem of its own.
func putInput(p *types.Put) *dynamodb.PutItemInput {
	return &dynamodb.PutItemInput{
		TableName:                 p.TableName,
		Item:                      p.Item,
		ConditionExpression:       p.ConditionExpression,
		ExpressionAttributeNames:  p.ExpressionAttributeNames,
		ExpressionAttributeValues: p.ExpressionAttributeValues,
	}
}

// isConditionFailed reports whether err is a failed condition expression.
func isConditionFailed(err error) bool {
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return true
	}
	var api smithy.APIError
	return errors.As(err, &api) && api.ErrorCode() == "ConditionalCheckFailedException"
}

// isTransactionConflict reports whether a write lost to a concurrent
// transaction on the same item (AWS, never the emulators): a race like a
// failed version check, retried the same way.
func isTransactionConflict(err error) bool {
	var tc *types.TransactionConflictException
	return errors.As(err, &tc)
}

// cancelledBy reports, for a cancelled transaction, the index of each item
// whose condition failed. A transaction cancelled only because it collided
// with another (reason TransactionConflict, AWS only) reports every item as
// failed at index 0, the invocation's version: the caller re-reads and
// retries, as for a lost version race.
func cancelledBy(err error) (failed []int, ok bool) {
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) {
		return nil, false
	}
	for i, r := range tce.CancellationReasons {
		switch aws.ToString(r.Code) {
		case "ConditionalCheckFailed":
			failed = append(failed, i)
		case "TransactionConflict":
			return []int{0}, true
		}
	}
	return failed, true
}

// storeErr wraps an unexpected store failure as unavailable: the caller may
// retry; the cause stays in the log, never in an answer.
func storeErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var de *domain.Error
	if errors.As(err, &de) {
		return fmt.Errorf("%s: %w", op, err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return domain.Interrupted(fmt.Errorf("%s: %w", op, err))
	}
	return &domain.Error{Kind: domain.KindUnavailable, Message: "the store did not answer; try again", Err: fmt.Errorf("%s: %w", op, err)}
}

// retryVersion runs fn until it does not lose a version race, at most
// maxVersionRetries times.
func retryVersion(op string, fn func() error) error {
	for range maxVersionRetries {
		err := fn()
		if !errors.Is(err, errVersion) {
			return err
		}
	}
	return &domain.Error{Kind: domain.KindConflict, Message: op + ": too many concurrent changes; try again", Err: errVersion}
}

// encodeCursor and decodeCursor turn a LastEvaluatedKey (string attributes
// only: every key here is a string) into an opaque cursor and back.
func encodeCursor(k map[string]types.AttributeValue) string {
	if len(k) == 0 {
		return ""
	}
	m := map[string]string{}
	for name, v := range k {
		if s, ok := v.(*types.AttributeValueMemberS); ok {
			m[name] = s.Value
		}
	}
	b, _ := json.Marshal(m)
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeCursor accepts only a cursor of the listing it is given back to: it
// must hold exactly the key attributes of that table or index, and the
// partition values fixed by the query. DynamoDB refuses a foreign start key
// with a ValidationException (a 500 here); this answers 400 instead.
func decodeCursor(c string, fixed map[string]string, keys ...string) (map[string]types.AttributeValue, error) {
	if c == "" {
		return nil, nil
	}
	bad := domain.Errorf(domain.KindInvalid, "cursor is not one this listing returned")
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return nil, bad
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil || len(m) != len(keys) {
		return nil, bad
	}
	out := map[string]types.AttributeValue{}
	for _, k := range keys {
		v, ok := m[k]
		if !ok || v == "" {
			return nil, bad
		}
		if want, ok := fixed[k]; ok && v != want {
			return nil, bad
		}
		out[k] = str(v)
	}
	return out, nil
}

func unmarshal(item map[string]types.AttributeValue, out any) error {
	if err := attributevalue.UnmarshalMap(item, out); err != nil {
		return fmt.Errorf("decode item: %w", err)
	}
	return nil
}
