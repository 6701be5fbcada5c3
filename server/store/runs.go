package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
)

// A run's row lives in the queues table beside the queues' counter rows,
// under a key no queue can have (queue names start with a letter or
// digit): the transaction that records a job's outcome moves its queue's
// counters and its run's on the same table.
const runKeyPrefix = "!run#"

// runIdempotencyPrefix keeps a run's idempotency keys apart from
// invocations' in the idempotency table.
const runIdempotencyPrefix = "!run#"

func runKey(id string) map[string]types.AttributeValue { return key("queue", runKeyPrefix+id) }

// runRecord is the stored form of domain.Run.
type runRecord struct {
	Key             string    `dynamodbav:"queue"`
	Listing         string    `dynamodbav:"listing"` // runListing(Queue): the listing index's partition
	Listed          string    `dynamodbav:"listed"`  // ID: its order there
	ID              string    `dynamodbav:"run_id"`
	Queue           string    `dynamodbav:"run_queue"`
	Name            string    `dynamodbav:"name,omitempty"`
	Total           int       `dynamodbav:"total"`
	Submitted       bool      `dynamodbav:"submitted"`
	CancelRequested bool      `dynamodbav:"cancel_requested,omitempty"`
	IdempotencyKey  string    `dynamodbav:"idempotency_key,omitempty"`
	RequestHash     string    `dynamodbav:"request_hash,omitempty"`
	CreatedAt       time.Time `dynamodbav:"created_at"`
	Done            int       `dynamodbav:"done_count"`
	Succeeded       int       `dynamodbav:"succeeded_count"`
	Failed          int       `dynamodbav:"failed_count"`
	Cancelled       int       `dynamodbav:"cancelled_count"`
	Version         int64     `dynamodbav:"version"`
}

func toRunRecord(r domain.Run) runRecord {
	return runRecord{Key: runKeyPrefix + r.ID, Listing: runListing(r.Queue), Listed: r.ID, ID: r.ID, Queue: r.Queue, Name: r.Name, Total: r.Total,
		Submitted: r.Submitted, CancelRequested: r.CancelRequested, IdempotencyKey: r.IdempotencyKey, RequestHash: r.RequestHash, CreatedAt: r.CreatedAt,
		Done: r.Counts.Done, Succeeded: r.Counts.Succeeded, Failed: r.Counts.Failed, Cancelled: r.Counts.Cancelled,
		Version: r.Version}
}

func (r runRecord) domain() domain.Run {
	return domain.Run{ID: r.ID, Queue: r.Queue, Name: r.Name, Total: r.Total, Submitted: r.Submitted, CancelRequested: r.CancelRequested,
		IdempotencyKey: r.IdempotencyKey, RequestHash: r.RequestHash, CreatedAt: r.CreatedAt,
		Counts:  domain.RunCounts{Done: r.Done, Succeeded: r.Succeeded, Failed: r.Failed, Cancelled: r.Cancelled},
		Version: r.Version}
}

// CreateRun writes the row of the run spec asks for, not yet submitted. With an idempotency key
// the key is recorded in the same transaction; a replay with the same
// request hash answers the run the first one made (created false: its
// jobs may be partly written, PutJobs finishes them), and a different
// hash under the same key is a conflict.
func (s *Store) CreateRun(ctx context.Context, spec domain.RunSpec) (run domain.Run, created bool, err error) {
	r := domain.NewRun(s.IDs.New(ids.Run), spec, s.now())
	item, err := attributevalue.MarshalMap(toRunRecord(r))
	if err != nil {
		return domain.Run{}, false, fmt.Errorf("encode run %s: %w", r.ID, err)
	}
	put := versionedPut(s.tables.Queues, "queue", item, 0)
	if r.IdempotencyKey == "" {
		if err := s.putNew(ctx, put); err != nil {
			return domain.Run{}, false, storeErr("create run", err)
		}
		return r, true, nil
	}
	prev, first, err := s.putOnce(ctx, "create run", idempotencyRecord{
		Key: runIdempotencyPrefix + r.IdempotencyKey, RunID: r.ID, RequestHash: r.RequestHash,
		ExpiresAt: r.CreatedAt.Add(s.TerminalTTL).Unix(),
	}, put)
	if err != nil || first {
		return r, first, err
	}
	if prev.RunID == "" {
		return domain.Run{}, false, domain.Errorf(domain.KindConflict,
			"idempotency_key %q was used for a different request", r.IdempotencyKey)
	}
	run, err = s.GetRun(ctx, prev.RunID)
	return run, false, err
}

// idempotencyRecord reads the record of idempotency key k (strongly
// consistent); it must exist.
func (s *Store) idempotencyRecord(ctx context.Context, k string) (idempotencyRecord, error) {
	var rec idempotencyRecord
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Idempotency), Key: key("idempotency_key", k), ConsistentRead: aws.Bool(true),
	})
	if err != nil || out.Item == nil {
		return rec, storeErr("read idempotency key", errors.Join(err, errors.New("key vanished")))
	}
	return rec, unmarshal(out.Item, &rec)
}

// PutJobs writes jobs that are not written yet, jobWriters at a time,
// each put only if its id is new: a job a replay finds written (and
// perhaps claimed, or done) is left as it is. It reports how many it
// wrote.
//
// One conditional put per job, not BatchWriteItem: a batch write cannot
// be conditional, and a replay that overwrote a job a worker had claimed
// would run it twice. A conditional put costs one write unit, as a batched
// item does (a transaction's item costs two), and the puts run in
// parallel, so a run of 10,000 jobs is written within a request's time
// (docs/runs.md).
func (s *Store) PutJobs(ctx context.Context, jobs []domain.Invocation) (int, error) {
	var (
		wrote atomic.Int64
		wg    sync.WaitGroup
		errs  = make([]error, min(jobWriters, len(jobs)))
		next  atomic.Int64
	)
	for w := range errs {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(jobs) || ctx.Err() != nil {
					return
				}
				put, err := s.invocationPut(0, &jobs[i])
				if err == nil {
					err = s.put(ctx, put)
				}
				switch {
				case err == nil:
					wrote.Add(1)
				case errors.Is(err, errVersion): // written before
				default:
					errs[w] = storeErr("write job "+jobs[i].ID, err)
					next.Store(int64(len(jobs))) // the others stop too
					return
				}
			}
		})
	}
	wg.Wait()
	return int(wrote.Load()), errors.Join(errs...)
}

// jobWriters is how many of a run's job puts are in flight at once.
const jobWriters = 16

// MarkRunSubmitted records that every job of run id is written, and
// answers the run as it now stands (an operator may have cancelled it
// meanwhile: CancelRequested).
func (s *Store) MarkRunSubmitted(ctx context.Context, id string) (domain.Run, error) {
	return s.setRunFlag(ctx, "mark run submitted", id, "submitted")
}

// MarkRunCancelled records that an operator cancelled run id, before its
// jobs are cancelled: a replay of its submit that writes jobs after this
// cancels them too (control.Service.SubmitRun).
func (s *Store) MarkRunCancelled(ctx context.Context, id string) (domain.Run, error) {
	return s.setRunFlag(ctx, "mark run cancelled", id, "cancel_requested")
}

// setRunFlag sets run id's flag attribute to true and answers the run.
func (s *Store) setRunFlag(ctx context.Context, op, id, flag string) (domain.Run, error) {
	out, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.tables.Queues), Key: runKey(id),
		UpdateExpression:          aws.String("SET #f = :t ADD version :one"),
		ConditionExpression:       aws.String("attribute_exists(run_id)"),
		ExpressionAttributeNames:  map[string]string{"#f": flag},
		ExpressionAttributeValues: map[string]types.AttributeValue{":t": &types.AttributeValueMemberBOOL{Value: true}, ":one": num(1)},
		ReturnValues:              types.ReturnValueAllNew,
	})
	if isConditionFailed(err) {
		return domain.Run{}, domain.Errorf(domain.KindNotFound, "run %s not found", id)
	}
	if err != nil {
		return domain.Run{}, storeErr(op, err)
	}
	var r runRecord
	if err := unmarshal(out.Attributes, &r); err != nil {
		return domain.Run{}, err
	}
	return r.domain(), nil
}

// GetRun reads run id (strongly consistent).
func (s *Store) GetRun(ctx context.Context, id string) (domain.Run, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Queues), Key: runKey(id), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return domain.Run{}, storeErr("get run "+id, err)
	}
	if out.Item == nil {
		return domain.Run{}, domain.Errorf(domain.KindNotFound, "run %s not found", id)
	}
	var r runRecord
	if err := unmarshal(out.Item, &r); err != nil {
		return domain.Run{}, err
	}
	if r.ID == "" { // a counter row written by an outcome before the run's own
		return domain.Run{}, domain.Errorf(domain.KindNotFound, "run %s not found", id)
	}
	return r.domain(), nil
}

// Runs answers one page of the runs (of queue, "" for every queue), newest
// first: up to limit, and the cursor of the next page ("": none). Of a
// queue it reads that queue's partition of the queues table's listing
// index; of every queue it reads a page from each queue's and merges them
// by id. Its cost follows the page and the number of queues, never the
// runs that ever were.
func (s *Store) Runs(ctx context.Context, queue string, limit int, cursor string) ([]domain.Run, string, error) {
	start, err := decodeCursor(cursor, nil, runCursorKey)
	if err != nil {
		return nil, "", err
	}
	bound := ""
	if start != nil {
		bound = start[runCursorKey].(*types.AttributeValueMemberS).Value
		if !ids.Valid(ids.Run, bound) {
			return nil, "", domain.Errorf(domain.KindInvalid, "cursor is not one this listing returned")
		}
	}
	queues := []string{queue}
	if queue == "" {
		if queues, err = s.Queues(ctx); err != nil {
			return nil, "", err
		}
	}
	var out []domain.Run
	more := false
	for _, q := range queues {
		in := &dynamodb.QueryInput{
			TableName:                 aws.String(s.tables.Queues),
			IndexName:                 aws.String(indexListing),
			KeyConditionExpression:    aws.String("listing = :l"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":l": str(runListing(q))},
			ScanIndexForward:          aws.Bool(false),
			Limit:                     aws.Int32(int32(limit)),
		}
		if bound != "" {
			*in.KeyConditionExpression += " AND listed < :b"
			in.ExpressionAttributeValues[":b"] = str(bound)
		}
		page, err := s.db.Query(ctx, in)
		if err != nil {
			return nil, "", storeErr("list runs of "+q, err)
		}
		for _, item := range page.Items {
			var r runRecord
			if err := unmarshal(item, &r); err != nil {
				return nil, "", err
			}
			out = append(out, r.domain())
		}
		more = more || page.LastEvaluatedKey != nil
	}
	slices.SortFunc(out, func(a, b domain.Run) int { return strings.Compare(b.ID, a.ID) })
	if len(out) > limit {
		out, more = out[:limit], true
	}
	if !more || len(out) == 0 {
		return out, "", nil
	}
	return out, encodeCursor(map[string]types.AttributeValue{runCursorKey: str(out[len(out)-1].ID)}), nil
}

// runCursorKey names the last run of a page in a runs cursor.
const runCursorKey = "run_id"

// runListing is the listing index partition of queue's runs.
func runListing(queue string) string { return "run#" + queue }

// RunningJobs counts the jobs of run id running now, from its queue's
// running partition of the state index: its cost follows the queue's
// running work (at most the fleet's capacity), never the run's size.
func (s *Store) RunningJobs(ctx context.Context, queue, id string) (int, error) {
	n := 0
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Invocations),
		IndexName:                 aws.String(indexQueueState),
		KeyConditionExpression:    aws.String("queue_state = :q"),
		FilterExpression:          aws.String("run_id = :r"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":q": str(queueState(queue, domain.StateRunning)), ":r": str(id)},
		Select:                    types.SelectCount,
	}
	for {
		out, err := s.db.Query(ctx, in)
		if err != nil {
			return 0, storeErr("count running jobs of "+id, err)
		}
		n += int(out.Count)
		if out.LastEvaluatedKey == nil {
			return n, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// GetInvocations reads the invocations ids name (strongly consistent),
// by id; one not written is not in the answer.
func (s *Store) GetInvocations(ctx context.Context, ids []string) (map[string]domain.Invocation, error) {
	out := make(map[string]domain.Invocation, len(ids))
	err := s.batchGet(ctx, "read invocations", s.tables.Invocations, "invocation_id", ids, func(item map[string]types.AttributeValue) error {
		var r invocationRecord
		if err := unmarshal(item, &r); err != nil {
			return err
		}
		inv := r.domain()
		out[inv.ID] = inv
		return nil
	})
	return out, err
}

// runCount is the update that counts terminal job next in its run, in the
// transaction that records it (putAndCount).
func (s *Store) runCount(next *domain.Invocation) types.TransactWriteItem {
	return types.TransactWriteItem{Update: &types.Update{
		TableName:                 aws.String(s.tables.Queues),
		Key:                       runKey(next.RunID),
		UpdateExpression:          aws.String("ADD done_count :one, #s :one"),
		ExpressionAttributeNames:  map[string]string{"#s": string(next.State) + "_count"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":one": num(1)},
	}}
}

// Rerun queues failed invocation id again (domain.Invocation.Rerun) and,
// in the same transaction, takes its failure off its run's counters, so
// the run counts the job once, when its new attempts end. It answers the
// invocation as it now stands, and whether this call queued it (false: it
// was not failed). The queue's counters are left as they are: they count
// terminal transitions, and the rerun job's next end is another.
func (s *Store) Rerun(ctx context.Context, id string) (domain.Invocation, bool, error) {
	var result domain.Invocation
	rerun := false
	err := retryVersion("rerun "+id, func() error {
		inv, err := s.GetInvocation(ctx, id)
		if err != nil {
			return err
		}
		next, changed := inv.Rerun(s.now())
		result, rerun = inv, false
		if !changed {
			return nil
		}
		put, err := s.invocationPut(inv.Version, &next)
		if err != nil {
			return err
		}
		items := []types.TransactWriteItem{{Put: put}}
		if next.RunID != "" {
			items = append(items, types.TransactWriteItem{Update: &types.Update{
				TableName:                 aws.String(s.tables.Queues),
				Key:                       runKey(next.RunID),
				UpdateExpression:          aws.String("ADD done_count :less, failed_count :less"),
				ExpressionAttributeValues: map[string]types.AttributeValue{":less": num(-1)},
			}})
		}
		_, err = s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
		if failed, ok := cancelledBy(err); ok && slices.Contains(failed, 0) {
			return errVersion
		}
		if err != nil {
			return storeErr("rerun "+id, err)
		}
		result, rerun = next, true
		return nil
	})
	return result, rerun, err
}
