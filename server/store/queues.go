package store

import (
	"context"
	"slices"
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

// NoteQueue records queue in the queues table, so Queues lists it before
// any of its work has finished. Each process writes a queue once.
func (s *Store) NoteQueue(ctx context.Context, queue string) error {
	if _, seen := s.queuesNoted.Load(queue); seen {
		return nil
	}
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.tables.Queues),
		Key:                       key("queue", queue),
		UpdateExpression:          aws.String("SET #seen = :t"),
		ExpressionAttributeNames:  map[string]string{"#seen": "has_work"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":t": &types.AttributeValueMemberBOOL{Value: true}},
	})
	if err != nil {
		return storeErr("note queue "+queue, err)
	}
	s.queuesNoted.Store(queue, true)
	return nil
}

// Queues lists every queue that ever had work (a scan of the small queues
// table: one item per queue; an off-path read for metrics).
func (s *Store) Queues(ctx context.Context) ([]string, error) {
	var out []string
	var start map[string]types.AttributeValue
	for {
		page, err := s.db.Scan(ctx, &dynamodb.ScanInput{
			TableName:                aws.String(s.tables.Queues),
			ProjectionExpression:     aws.String("#q"),
			ExpressionAttributeNames: map[string]string{"#q": "queue"},
			ExclusiveStartKey:        start,
		})
		if err != nil {
			return nil, storeErr("list queues", err)
		}
		for _, item := range page.Items {
			if v, ok := item["queue"].(*types.AttributeValueMemberS); ok && domain.ValidQueue(v.Value) {
				out = append(out, v.Value)
			}
		}
		if page.LastEvaluatedKey == nil {
			break
		}
		start = page.LastEvaluatedKey
	}
	slices.Sort(out)
	return out, nil
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
