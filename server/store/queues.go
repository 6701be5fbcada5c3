package store

import (
	"context"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// QueueStats reports a queue's invocations by state and its done_count, at
// a cost bounded by its live work, never its history: queued and running
// are counted from their partitions of the queue_state index, which hold
// only live invocations, and the terminal states are read from the queue's
// counters row (QueueCounters), moved in the transaction that records each
// outcome. The terminal counts are totals since the queue began; the
// invocations themselves expire after TerminalTTL.
func (s *Store) QueueStats(ctx context.Context, queue string) (domain.QueueStats, error) {
	c, err := s.Counters(ctx, queue)
	if err != nil {
		return domain.QueueStats{}, err
	}
	st := domain.QueueStats{Queue: queue, Counts: c.ByState(), DoneCount: c.Done}
	for _, state := range domain.InvocationStates {
		if state.Terminal() {
			continue
		}
		n, err := s.countLive(ctx, queue, state)
		if err != nil {
			return domain.QueueStats{}, err
		}
		st.Counts[state] = n
	}
	return st, nil
}

// countLive counts the invocations of queue in live state (queued or
// running) from its partition of the queue_state index.
func (s *Store) countLive(ctx context.Context, queue string, state domain.InvocationState) (int, error) {
	n := 0
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Invocations),
		IndexName:                 aws.String(indexQueueState),
		KeyConditionExpression:    aws.String("queue_state = :q"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":q": str(queueState(queue, state))},
		Select:                    types.SelectCount,
	}
	for {
		out, err := s.db.Query(ctx, in)
		if err != nil {
			return 0, storeErr("count "+string(state)+" of "+queue, err)
		}
		n += int(out.Count)
		if out.LastEvaluatedKey == nil {
			return n, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// QueueCounters is a queue's counters row: how many invocations became
// terminal (Done) and how many in each terminal state. Each moves only in
// the transaction that records the outcome (putAndCount), so they equal
// the terminal invocations however often a write was retried.
type QueueCounters struct {
	Done      int `dynamodbav:"done_count"`
	Succeeded int `dynamodbav:"succeeded_count"`
	Failed    int `dynamodbav:"failed_count"`
	Cancelled int `dynamodbav:"cancelled_count"`
}

// ByState maps each terminal state to its count.
func (c QueueCounters) ByState() map[domain.InvocationState]int {
	return map[domain.InvocationState]int{domain.StateSucceeded: c.Succeeded, domain.StateFailed: c.Failed, domain.StateCancelled: c.Cancelled}
}

// Counters reads queue's counters row (strongly consistent); a queue
// nothing finished in reads all zero.
func (s *Store) Counters(ctx context.Context, queue string) (QueueCounters, error) {
	var c QueueCounters
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Queues), Key: key("queue", queue), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return c, storeErr("queue counters "+queue, err)
	}
	if out.Item == nil {
		return c, nil
	}
	return c, unmarshal(out.Item, &c)
}

// NoteQueue records queue in the queues table's listing index, so Queues
// lists it before any of its work has finished. Each process writes a
// queue once. The entry is an item of its own (queueListingPrefix + the
// queue), written whole, beside the queue's counters row: a put is indexed
// right on every engine, where an update that brings an existing item
// into an index is not (minidyn v0.8.2 garbles the index).
func (s *Store) NoteQueue(ctx context.Context, queue string) error {
	if _, seen := s.queuesNoted.Load(queue); seen {
		return nil
	}
	_, err := s.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(s.tables.Queues),
		Item: map[string]types.AttributeValue{
			"queue": str(queueListingPrefix + queue), "listing": str(queueListing), "listed": str(queue),
		},
	})
	if err != nil {
		return storeErr("note queue "+queue, err)
	}
	s.queuesNoted.Store(queue, true)
	return nil
}

// indexListing is the queues table's index of its queue rows
// (queueListing) and of each queue's run rows (runListing).
const indexListing = "listing"

// queueListing is the listing index partition of the queues, and
// queueListingPrefix the key of a queue's entry there (no queue name
// starts with "!").
const (
	queueListing       = "queue"
	queueListingPrefix = "!queue#"
)

// Queues lists every queue that ever had work (NoteQueue), from the queue
// rows' partition of the listing index: the run rows beside them in the
// queues table cost it nothing.
func (s *Store) Queues(ctx context.Context) ([]string, error) {
	var out []string
	err := s.queryEach(ctx, "list queues", &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Queues),
		IndexName:                 aws.String(indexListing),
		KeyConditionExpression:    aws.String("listing = :l"),
		ProjectionExpression:      aws.String("listed"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":l": str(queueListing)},
	}, func(item map[string]types.AttributeValue) error {
		if v, ok := item["listed"].(*types.AttributeValueMemberS); ok && domain.ValidQueue(v.Value) {
			out = append(out, v.Value)
		}
		return nil
	})
	return out, err
}

// OldestQueued reports when the oldest queued invocation of queue was
// created (ok false: none is queued). Ids sort by creation time, so it is
// the first item of the queue's queued partition of the state index.
func (s *Store) OldestQueued(ctx context.Context, queue string) (time.Time, bool, error) {
	out, err := s.db.Query(ctx, &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Invocations),
		IndexName:                 aws.String(indexQueueState),
		KeyConditionExpression:    aws.String("queue_state = :q"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":q": str(queueState(queue, domain.StateQueued))},
		Limit:                     aws.Int32(1),
	})
	if err != nil {
		return time.Time{}, false, storeErr("oldest queued of "+queue, err)
	}
	if len(out.Items) == 0 {
		return time.Time{}, false, nil
	}
	inv, err := decodeInvocation(out.Items[0])
	if err != nil {
		return time.Time{}, false, err
	}
	return inv.CreatedAt, true, nil
}
