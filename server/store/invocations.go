package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
)

// invocationItem renders inv as a whole item, adding the attributes its
// indexes are keyed on. claim_key and holder are sparse: present only while
// the invocation is queued, respectively running.
func (s *Store) invocationItem(inv domain.Invocation) (map[string]types.AttributeValue, error) {
	item, err := attributevalue.MarshalMap(toInvocationRecord(inv))
	if err != nil {
		return nil, fmt.Errorf("encode invocation %s: %w", inv.ID, err)
	}
	item["queue_state"] = str(queueState(inv.Queue, inv.State))
	switch {
	case inv.State == domain.StateQueued && !inv.RetryAt.IsZero():
		// Waiting out a retry backoff: out of its queue's claim partition,
		// in the one the sweep reads to release it (ReleaseRetries).
		item["claim_key"] = str(claimKeyRetrying)
	case inv.State == domain.StateQueued:
		item["claim_key"] = str(s.claimKey(inv.Queue, inv.HostKey, shardOf(inv.ID, s.ClaimShards)))
	case inv.State == domain.StateRunning:
		item["holder"] = str(inv.WorkerID)
	case inv.State.Terminal() && s.TerminalTTL > 0:
		item["expires_at"] = num(inv.FinishedAt.Add(s.TerminalTTL).Unix())
	}
	return item, nil
}

// invocationPut is the versioned put that replaces the invocation stored at
// version prev (0: none yet) with next, at version prev + 1, which it sets:
// callers compute the next state (domain transitions) and never the version.
func (s *Store) invocationPut(prev int64, next *domain.Invocation) (*types.Put, error) {
	next.Version = prev + 1
	item, err := s.invocationItem(*next)
	if err != nil {
		return nil, err
	}
	return versionedPut(s.tables.Invocations, "invocation_id", item, prev), nil
}

// GetInvocation reads one invocation (strongly consistent).
func (s *Store) GetInvocation(ctx context.Context, id string) (domain.Invocation, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.tables.Invocations),
		Key:            key("invocation_id", id),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return domain.Invocation{}, storeErr("get invocation "+id, err)
	}
	if out.Item == nil {
		return domain.Invocation{}, domain.Errorf(domain.KindNotFound, "invocation %s not found", id)
	}
	inv, err := decodeInvocation(out.Item)
	if err == nil {
		s.noteFinished(inv)
	}
	return inv, err
}

// idempotencyRecord remembers which invocation a submit key made, and a
// hash of the request, so a replay with a different body is refused.
type idempotencyRecord struct {
	Key          string `dynamodbav:"idempotency_key"`
	InvocationID string `dynamodbav:"invocation_id,omitempty"`
	RunID        string `dynamodbav:"run_id,omitempty"` // a run's key (CreateRun)
	RequestHash  string `dynamodbav:"request_hash"`
	ExpiresAt    int64  `dynamodbav:"expires_at"`
}

// Submit queues the invocation spec makes. With an idempotency key, the
// key is recorded with requestHash (what the caller hashes the request to)
// in the same transaction; a replay with the same hash answers the
// invocation the first one made (created false), and a different hash
// under the same key is a conflict.
func (s *Store) Submit(ctx context.Context, spec domain.Spec, requestHash string) (inv domain.Invocation, created bool, err error) {
	now := s.now()
	inv = domain.NewInvocation(s.IDs.New(ids.Invocation), spec, now)
	put, err := s.invocationPut(0, &inv)
	if err != nil {
		return domain.Invocation{}, false, err
	}
	if spec.IdempotencyKey == "" {
		if err := s.putNew(ctx, put); err != nil {
			return domain.Invocation{}, false, storeErr("submit", err)
		}
		return inv, true, nil
	}

	prev, first, err := s.putOnce(ctx, "submit", idempotencyRecord{
		Key: spec.IdempotencyKey, InvocationID: inv.ID, RequestHash: requestHash,
		ExpiresAt: now.Add(s.TerminalTTL).Unix(),
	}, put)
	if err != nil || first {
		return inv, first, err
	}
	if prev.InvocationID == "" {
		return domain.Invocation{}, false, domain.Errorf(domain.KindConflict,
			"idempotency_key %q was used for a different request", spec.IdempotencyKey)
	}
	inv, err = s.GetInvocation(ctx, prev.InvocationID)
	return inv, false, err
}

// putOnce writes put with idempotency record rec, in one transaction. If
// rec's key was recorded before, it writes nothing and answers that
// record (first false); a record of another request (another hash) is a
// conflict.
func (s *Store) putOnce(ctx context.Context, op string, rec idempotencyRecord, put *types.Put) (prev idempotencyRecord, first bool, err error) {
	item, err := attributevalue.MarshalMap(rec)
	if err != nil {
		return prev, false, fmt.Errorf("encode idempotency record: %w", err)
	}
	_, err = s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Put: versionedPut(s.tables.Idempotency, "idempotency_key", item, 0)},
		{Put: put},
	}})
	if err == nil {
		return rec, true, nil
	}
	if failed, ok := cancelledBy(err); !ok || len(failed) == 0 || failed[0] != 0 {
		return prev, false, storeErr(op, err)
	}
	// The key was used before: answer what it made.
	if prev, err = s.idempotencyRecord(ctx, rec.Key); err != nil {
		return prev, false, err
	}
	if prev.RequestHash != rec.RequestHash {
		made := "invocation " + prev.InvocationID
		if prev.RunID != "" {
			made = "run " + prev.RunID
		}
		return prev, false, domain.Errorf(domain.KindConflict,
			"idempotency_key %q was used for a different request (%s)", strings.TrimPrefix(rec.Key, runIdempotencyPrefix), made)
	}
	return prev, false, nil
}

// putAndCount makes put (next, over the version it was read at) in one
// transaction with extra items (the token check of an ack this store
// claimed) and, when next is terminal, with its queue's done_count and
// per-state count (and its run's, for a job of a run): the counts move if
// and only if this put wins. A cancel, a requeue that ends the invocation
// and an ack's outcome all record through here (saveInvocation).
func (s *Store) putAndCount(ctx context.Context, put *types.Put, next *domain.Invocation, extra ...types.TransactWriteItem) error {
	items := []types.TransactWriteItem{{Put: put}}
	if next.State.Terminal() {
		items = append(items, types.TransactWriteItem{Update: &types.Update{
			TableName:                 aws.String(s.tables.Queues),
			Key:                       key("queue", next.Queue),
			UpdateExpression:          aws.String("ADD done_count :one, #s :one"),
			ExpressionAttributeNames:  map[string]string{"#s": string(next.State) + "_count"},
			ExpressionAttributeValues: map[string]types.AttributeValue{":one": num(1)},
		}})
		if next.RunID != "" {
			items = append(items, s.runCount(next))
		}
	}
	firstExtra := len(items)
	items = append(items, extra...)
	_, err := s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
	if failed, ok := cancelledBy(err); ok {
		for _, i := range failed {
			if i == 0 {
				return errVersion
			}
			if i >= firstExtra {
				return errExtraCondition
			}
		}
	}
	return err
}

// noteFinished remembers that inv is finished, when it is
// (RememberWrites): a finished invocation stays finished, so a poll that
// still lists it is told so without reading it (KnownFinished).
func (s *Store) noteFinished(inv domain.Invocation) {
	if s.RememberWrites && inv.State.Terminal() {
		s.finished.put(inv.ID, struct{}{})
	}
}

// KnownFinished reports whether this store wrote or read invocation id
// finished (RememberWrites): it is then finished for good, whatever else
// changed. false says nothing.
func (s *Store) KnownFinished(id string) bool {
	_, ok := s.finished.get(id)
	return ok
}

// errExtraCondition reports that a transaction's caller-supplied condition
// (not the invocation's version) failed.
var errExtraCondition = errors.New("transaction condition failed")

// readForAck reads an invocation and the acking worker's row in one
// request, both strongly consistent, so the token is checked before
// anything about the invocation is revealed, without a second round trip.
// The read is the token check of the write that follows: a token a newer
// hello replaced is refused from the moment that hello is stored
// (docs/security.md).
func (s *Store) readForAck(ctx context.Context, invocationID, workerID string) (*domain.Invocation, *domain.Worker, error) {
	var inv *domain.Invocation
	var w *domain.Worker
	err := s.batchGetItems(ctx, "ack: read "+invocationID, map[string]types.KeysAndAttributes{
		s.tables.Invocations: {Keys: []map[string]types.AttributeValue{key("invocation_id", invocationID)}, ConsistentRead: aws.Bool(true)},
		s.tables.Workers:     {Keys: []map[string]types.AttributeValue{key("worker_id", workerID)}, ConsistentRead: aws.Bool(true)},
	}, func(table string, item map[string]types.AttributeValue) error {
		if table == s.tables.Workers {
			got, err := decodeWorker(item)
			w = &got
			return err
		}
		got, err := decodeInvocation(item)
		inv = &got
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return inv, w, nil
}

// AckResult is what an ack did: whether its outcome counts (Recorded), and
// the invocation's state after it.
type AckResult struct {
	Recorded bool
	// HandedBack: what was recorded is a hand-back (the body asked to be
	// queued again as its worker drained), not an outcome: the invocation
	// is queued again, or ended once max_attempts is spent.
	HandedBack bool
	State      domain.InvocationState
	Queue      string // the invocation's queue, when it was recorded
	HostKey    string // and its host key (a requeued one wakes a poll for it)
}

// Ack records outcome o of one attempt of invocation id. The first
// succeeded or failed outcome of any attempt wins; a later one is a no-op
// (recorded false), and so is a cancelled outcome unless an operator
// cancelled the attempt running now (domain.Invocation.Record). The
// worker's token is checked first (auth), against its row read strongly
// consistent in the same request, so a token a newer hello replaced is
// refused from the moment that hello is stored. Only the worker that ran
// that attempt may ack it.
func (s *Store) Ack(ctx context.Context, id string, o domain.Outcome, auth Authorize) (AckResult, error) {
	if c, ok := s.claimed.take(id); ok && c.inv.Attempt == o.Attempt && c.inv.WorkerID == o.WorkerID {
		if done, res, err := s.ackClaimed(ctx, c, o, auth); done {
			return res, err
		}
	}
	var res AckResult
	err := retryVersion("ack "+id, func() error {
		found, w, err := s.readForAck(ctx, id, o.WorkerID)
		if err != nil {
			return err
		}
		if err := authorizeRow(w, o.WorkerID, auth); err != nil {
			return err
		}
		if found == nil {
			return domain.Errorf(domain.KindNotFound, "invocation %s not found", id)
		}
		inv := *found
		next, recorded, err := inv.Record(o, s.now())
		if err != nil {
			return err
		}
		if !recorded {
			// An outcome already won, or a cancelled attempt nobody cancelled
			// (it was superseded): a recorded no-op.
			res = AckResult{Recorded: false, State: inv.State}
			return nil
		}
		if err := s.saveInvocation(ctx, "ack", inv.Version, &next); err != nil {
			return err
		}
		res = ackResult(o, next)
		return nil
	})
	return res, err
}

// ackResult is what an ack that recorded o, leaving next, reports.
func ackResult(o domain.Outcome, next domain.Invocation) AckResult {
	return AckResult{Recorded: true, HandedBack: o.State == domain.AckRequeued, State: next.State, Queue: next.Queue, HostKey: next.HostKey}
}

// authorizeRow checks a token against worker id's row w, read strongly
// consistent (nil: no such worker): the check every write a worker token
// asks for passes first.
func authorizeRow(w *domain.Worker, id string, auth Authorize) error {
	if w == nil {
		return UnknownWorker(id, auth)
	}
	if auth != nil {
		return auth(*w)
	}
	return nil
}

// ackClaimed records o over the invocation as this store claimed it,
// without reading it first, in the one request the ack writes anyway: the
// put is conditional on the version claimed, and the worker's token is
// checked inside the same transaction (its row must still carry the hash
// it had at the claim, which auth matched the token to). done is false
// when that is not enough to decide (the invocation changed since, the
// outcome would not count, or the worker row as claimed does not pass
// auth): the caller then reads and decides as usual, so the rules are
// domain.Invocation.Record either way. Only `lakeshore dev` gets here: on
// Lambda the ack function never claims.
func (s *Store) ackClaimed(ctx context.Context, c claimedEntry, o domain.Outcome, auth Authorize) (done bool, res AckResult, err error) {
	if auth != nil && auth(c.worker) != nil {
		return false, AckResult{}, nil
	}
	next, recorded, err := c.inv.Record(o, s.now())
	if err != nil || !recorded {
		return false, AckResult{}, nil
	}
	switch err := s.saveInvocation(ctx, "ack", c.inv.Version, &next, s.tokenCheck(o.WorkerID, c.worker.TokenHash)); {
	case errors.Is(err, errVersion):
		return false, AckResult{}, nil
	case errors.Is(err, errExtraCondition):
		return true, AckResult{}, ErrWorkerToken
	case err != nil:
		return true, AckResult{}, err
	}
	return true, ackResult(o, next), nil
}

// tokenCheck is the transaction item that holds only while worker id's
// row carries token hash h: a token a newer hello replaced fails the
// write.
func (s *Store) tokenCheck(id, h string) types.TransactWriteItem {
	return types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{
		TableName:                 aws.String(s.tables.Workers),
		Key:                       key("worker_id", id),
		ConditionExpression:       aws.String("token_hash = :h"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":h": str(h)},
	}}
}

// Cancel cancels an invocation (domain.Invocation.Cancel): a queued one at
// once (terminal, counted), a running one by flagging it so its worker's
// next poll carries a cancel command. A finished one is a conflict.
func (s *Store) Cancel(ctx context.Context, id string) (domain.Invocation, error) {
	var result domain.Invocation
	err := retryVersion("cancel "+id, func() error {
		inv, err := s.GetInvocation(ctx, id)
		if err != nil {
			return err
		}
		next, changed, err := inv.Cancel(s.now())
		if err != nil || !changed {
			result = inv
			return err
		}
		if err := s.saveInvocation(ctx, "cancel", inv.Version, &next); err != nil {
			return err
		}
		result = next
		return nil
	})
	return result, err
}

// saveInvocation writes next over the invocation stored at version prev:
// a terminal next, or one with extra transaction items, in one transaction
// (putAndCount); any other as one versioned put. A lost race is
// errVersion, a failed extra item errExtraCondition.
func (s *Store) saveInvocation(ctx context.Context, op string, prev int64, next *domain.Invocation, extra ...types.TransactWriteItem) error {
	put, err := s.invocationPut(prev, next)
	if err != nil {
		return err
	}
	if next.State.Terminal() || len(extra) > 0 {
		err = s.putAndCount(ctx, put, next, extra...)
	} else {
		err = s.put(ctx, put)
	}
	switch {
	case errors.Is(err, errVersion), errors.Is(err, errExtraCondition):
		return err
	case err != nil:
		return storeErr(op+" "+next.ID, err)
	}
	s.noteFinished(*next)
	return nil
}

// Requeue hands back the running attempt of invocation id held by worker
// (its worker was lost, for loss; domain.Invocation.Requeue): queued again
// with attempt + 1 on the next claim, or failed with error type worker_lost
// once max_attempts is spent, or cancelled if a cancel was pending. It is a
// no-op when the invocation is no longer running that worker's attempt.
// It returns the invocation as it now stands and whether this call handed
// the attempt back (false: it was not running that worker's attempt any
// more).
func (s *Store) Requeue(ctx context.Context, id, workerID string, loss domain.Loss) (domain.Invocation, bool, error) {
	var result domain.Invocation
	handed := false
	err := retryVersion("requeue "+id, func() error {
		inv, err := s.GetInvocation(ctx, id)
		if err != nil {
			return err
		}
		result = inv
		next, changed := inv.Requeue(workerID, loss, s.now())
		if !changed {
			return nil
		}
		if err := s.saveInvocation(ctx, "requeue", inv.Version, &next); err != nil {
			return err
		}
		result, handed = next, true
		return nil
	})
	return result, handed, err
}

// Held lists the invocations running on worker, from the sparse holder index.
func (s *Store) Held(ctx context.Context, workerID string) ([]domain.Invocation, error) {
	var out []domain.Invocation
	err := s.queryEach(ctx, "held by "+workerID, &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Invocations),
		IndexName:                 aws.String(indexHolder),
		KeyConditionExpression:    aws.String("holder = :w"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":w": str(workerID)},
	}, func(item map[string]types.AttributeValue) error {
		inv, err := decodeInvocation(item)
		if err == nil && inv.Running(workerID) {
			out = append(out, inv)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ChangeArtifacts applies change, a domain transition of the artifacts of
// an attempt worker workerID holds (domain.Invocation.StartUpload,
// CompleteUpload), to invocation id and saves it: one versioned put, so it
// lands only while the invocation is as change saw it (the attempt still
// held and running). The token is checked first (auth, against the
// worker's row read strongly consistent with the invocation), before
// anything about the invocation is revealed. It reports the invocation as
// saved.
func (s *Store) ChangeArtifacts(ctx context.Context, id, workerID string, auth Authorize,
	change func(domain.Invocation, time.Time) (domain.Invocation, error)) (domain.Invocation, error) {
	var result domain.Invocation
	err := retryVersion("artifacts of "+id, func() error {
		found, w, err := s.readForAck(ctx, id, workerID)
		if err != nil {
			return err
		}
		if err := authorizeRow(w, workerID, auth); err != nil {
			return err
		}
		if found == nil {
			return domain.Errorf(domain.KindNotFound, "invocation %s not found", id)
		}
		next, err := change(*found, s.now())
		if err != nil {
			return err
		}
		if err := s.saveInvocation(ctx, "artifacts of", found.Version, &next); err != nil {
			return err
		}
		result = next
		return nil
	})
	return result, err
}
