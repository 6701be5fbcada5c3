package store

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strconv"
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
	item["queue_state"] = str(inv.Queue + "#" + inv.State)
	switch {
	case inv.State == domain.StateQueued && !inv.RetryAt.IsZero():
		// Waiting out a retry backoff: out of its queue's claim partition,
		// in the one the sweep reads to release it (ReleaseRetries).
		item["claim_key"] = str(claimKeyRetrying)
	case inv.State == domain.StateQueued:
		item["claim_key"] = str(s.claimKey(inv.Queue, inv.HostKey, shardOf(inv.ID, s.ClaimShards)))
	case inv.State == domain.StateRunning:
		item["holder"] = str(inv.WorkerID)
	case domain.Terminal(inv.State) && s.TerminalTTL > 0:
		item["expires_at"] = num(inv.FinishedAt.Add(s.TerminalTTL).Unix())
	}
	return item, nil
}

// claimKey is the partition of the claim index: work for one queue and one
// host key ("" for work any host may run), and with ClaimShards > 1 one
// shard of it. On AWS one partition of an index takes about 1,000 writes a
// second, and every submit and claim writes the claim index: shards spread
// a busy queue over several (docs/dispatch.md).
func (s *Store) claimKey(queue, hostKey string, shard int) string {
	if s.ClaimShards <= 1 {
		return queue + "#" + hostKey
	}
	return queue + "#" + hostKey + "#" + strconv.Itoa(shard)
}

// shardOf is the claim shard of invocation id: fixed by the id, so a
// requeue lands where the submit did and encoding stays deterministic.
func shardOf(id string, shards int) int {
	if shards <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(shards))
}

// claimPartitions are the partitions a claim of w on queue reads, in order:
// its host key's, then any host's, each shard from a random one on, so
// racing claimers spread over the shards.
func (s *Store) claimPartitions(w domain.Worker, queue string) []string {
	hostKeys := []string{""}
	if w.HostKey != "" {
		hostKeys = []string{w.HostKey, ""}
	}
	shards := max(s.ClaimShards, 1)
	first := 0
	if shards > 1 {
		first = rand.IntN(shards)
	}
	parts := make([]string, 0, len(hostKeys)*shards)
	for _, hk := range hostKeys {
		for i := range shards {
			parts = append(parts, s.claimKey(queue, hk, (first+i)%shards))
		}
	}
	return parts
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
	return decodeInvocation(out.Item)
}

// idempotencyRecord remembers which invocation a submit key made, and a
// hash of the request, so a replay with a different body is refused.
type idempotencyRecord struct {
	Key          string `dynamodbav:"idempotency_key"`
	InvocationID string `dynamodbav:"invocation_id"`
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
		if err := s.put(ctx, put); err != nil {
			return domain.Invocation{}, false, storeErr("submit", err)
		}
		return inv, true, nil
	}

	rec, err := attributevalue.MarshalMap(idempotencyRecord{
		Key: spec.IdempotencyKey, InvocationID: inv.ID, RequestHash: requestHash,
		ExpiresAt: now.Add(s.TerminalTTL).Unix(),
	})
	if err != nil {
		return domain.Invocation{}, false, fmt.Errorf("encode idempotency record: %w", err)
	}
	_, err = s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Put: versionedPut(s.tables.Idempotency, "idempotency_key", rec, 0)},
		{Put: put},
	}})
	if err == nil {
		return inv, true, nil
	}
	if failed, ok := cancelledBy(err); !ok || len(failed) == 0 || failed[0] != 0 {
		return domain.Invocation{}, false, storeErr("submit", err)
	}
	// The key was used before: answer what it made.
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Idempotency), Key: key("idempotency_key", spec.IdempotencyKey),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil || out.Item == nil {
		return domain.Invocation{}, false, storeErr("submit: read idempotency key", errors.Join(err, errors.New("key vanished")))
	}
	var prev idempotencyRecord
	if err := unmarshal(out.Item, &prev); err != nil {
		return domain.Invocation{}, false, err
	}
	if prev.RequestHash != requestHash {
		return domain.Invocation{}, false, domain.Errorf(domain.KindConflict,
			"idempotency_key %q was used for a different request (invocation %s)", spec.IdempotencyKey, prev.InvocationID)
	}
	inv, err = s.GetInvocation(ctx, prev.InvocationID)
	return inv, false, err
}

// ClaimResult is what one claim pass got. Conflicts counts conditional
// writes lost to racing pollers (the benchmark reports it).
type ClaimResult struct {
	Claimed   []domain.Invocation
	Conflicts int
}

// Claim hands up to max queued invocations of queue to worker w: those for
// its host key first, then those any host may run. Each is taken by one
// conditional put (state queued at the version read → running, attempt + 1,
// holder w); of two racing pollers only one put can win. Candidates come from
// the sparse claim index, so a claim never scans.
func (s *Store) Claim(ctx context.Context, w domain.Worker, queue string, max int) (ClaimResult, error) {
	var res ClaimResult
	for _, part := range s.claimPartitions(w, queue) {
		// A few rounds: a window lost to racers is read again, twice as wide,
		// so contention spreads pollers over more of the queue while a quiet
		// queue pays only for the small read.
		window := s.ClaimWindow
		for round := 0; round < claimRounds && len(res.Claimed) < max; round++ {
			_, more, err := s.claimRound(ctx, w, part, window, max-len(res.Claimed), &res)
			if err != nil {
				return res, err
			}
			if !more {
				break
			}
			window = min(window*2, maxClaimWindow)
		}
		if len(res.Claimed) >= max {
			break
		}
	}
	return res, nil
}

// claimRound claims up to want candidates of partition part from the
// claim pool, which reads a window of the claim index when it is empty or
// stale. more reports whether another round may find work: the last read
// filled its window, or the round stopped early because racers (other
// processes) were taking the candidates; then the pool is dropped, so the
// next round reads afresh.
func (s *Store) claimRound(ctx context.Context, w domain.Worker, part string, window, want int, res *ClaimResult) (got int, more bool, err error) {
	window = max(window, want)
	lost := 0
	for got < want {
		// Each lost race means the candidates we hold are going stale under
		// other pollers: after as many losses as claims wanted, a fresh read
		// (cheap) beats more failed conditional writes (each one billed).
		if lost >= want {
			s.pool.contended(part, s.now())
			return got, true, nil
		}
		now := s.now()
		inv, ok, full, err := s.pool.take(part, now, s.ClaimPoolTTL, func(trying int) ([]domain.Invocation, bool, error) {
			return s.readCandidates(ctx, part, min(window+trying, maxClaimWindow))
		})
		if err != nil {
			return got, false, err
		}
		if !ok {
			return got, full, nil
		}
		next, err := inv.Claim(w, now)
		if err != nil {
			s.pool.tried(part, inv.ID)
			continue // not queued: an index lagging its table (AWS GSIs are eventually consistent)
		}
		put, err := s.invocationPut(inv.Version, &next)
		if err != nil {
			s.pool.tried(part, inv.ID)
			return got, false, err
		}
		err = s.put(ctx, put)
		s.pool.tried(part, inv.ID)
		switch {
		case errors.Is(err, errVersion):
			res.Conflicts++
			lost++
		case err != nil:
			return got, false, storeErr("claim "+inv.ID, err)
		default:
			res.Claimed = append(res.Claimed, next)
			s.claimed.put(next, w)
			got++
		}
	}
	return got, false, nil
}

// readCandidates reads up to window queued invocations of partition part,
// shuffled so racing processes spread over the head of the queue, and
// whether the window was full (more may be queued).
func (s *Store) readCandidates(ctx context.Context, part string, window int) ([]domain.Invocation, bool, error) {
	out, err := s.db.Query(ctx, &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Invocations),
		IndexName:                 aws.String(indexClaim),
		KeyConditionExpression:    aws.String("claim_key = :k"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":k": str(part)},
		Limit:                     aws.Int32(int32(window)),
	})
	if err != nil {
		return nil, false, storeErr("claim: query", err)
	}
	invs := make([]domain.Invocation, 0, len(out.Items))
	for _, item := range out.Items {
		inv, err := decodeInvocation(item)
		if err != nil {
			return nil, false, err
		}
		invs = append(invs, inv)
	}
	s.Shuffle(len(invs), func(i, j int) { invs[i], invs[j] = invs[j], invs[i] })
	return invs, len(out.Items) >= window || out.LastEvaluatedKey != nil, nil
}

// putAndCount puts next over the invocation stored at version prev in one
// transaction, with extra items (e.g. a worker token check), and when next
// is terminal counts it in its queue's done_count and per-state count: the
// count moves if and only if this put wins. Next may be any state: an ack
// writes every outcome it records through here, a retried one (queued
// again, not counted) included, and saveInvocation every terminal write
// (a cancel, a requeue that ends the invocation).
func (s *Store) putAndCount(ctx context.Context, prev int64, next *domain.Invocation, extra ...types.TransactWriteItem) error {
	put, err := s.invocationPut(prev, next)
	if err != nil {
		return err
	}
	items := []types.TransactWriteItem{{Put: put}}
	if domain.Terminal(next.State) {
		items = append(items, types.TransactWriteItem{Update: &types.Update{
			TableName:                 aws.String(s.tables.Queues),
			Key:                       key("queue", next.Queue),
			UpdateExpression:          aws.String("ADD done_count :one, #s :one"),
			ExpressionAttributeNames:  map[string]string{"#s": next.State + "_count"},
			ExpressionAttributeValues: map[string]types.AttributeValue{":one": num(1)},
		}})
	}
	firstExtra := len(items)
	items = append(items, extra...)
	_, err = s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
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
	if err != nil {
		return storeErr("record "+next.ID, err)
	}
	return nil
}

// errExtraCondition reports that a transaction's caller-supplied condition
// (not the invocation's version) failed.
var errExtraCondition = errors.New("transaction condition failed")

// readForAck reads an invocation and the acking worker's row in one
// strongly consistent request, so the token is checked before anything about
// the invocation is revealed, without a second round trip.
func (s *Store) readForAck(ctx context.Context, invocationID, workerID string) (*domain.Invocation, *domain.Worker, error) {
	out, err := s.db.TransactGetItems(ctx, &dynamodb.TransactGetItemsInput{TransactItems: []types.TransactGetItem{
		{Get: &types.Get{TableName: aws.String(s.tables.Invocations), Key: key("invocation_id", invocationID)}},
		{Get: &types.Get{TableName: aws.String(s.tables.Workers), Key: key("worker_id", workerID)}},
	}})
	if err != nil {
		return nil, nil, storeErr("ack: read "+invocationID, err)
	}
	if len(out.Responses) != 2 {
		return nil, nil, storeErr("ack: read "+invocationID, fmt.Errorf("%d responses to 2 gets", len(out.Responses)))
	}
	var inv *domain.Invocation
	var w *domain.Worker
	if item := out.Responses[0].Item; len(item) > 0 {
		got, err := decodeInvocation(item)
		if err != nil {
			return nil, nil, err
		}
		inv = &got
	}
	if item := out.Responses[1].Item; len(item) > 0 {
		got, err := decodeWorker(item)
		if err != nil {
			return nil, nil, err
		}
		w = &got
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
	State      string
	Queue      string // the invocation's queue, when it was recorded
	HostKey    string // and its host key (a requeued one wakes a poll for it)
}

// Ack records outcome o of one attempt of invocation id. The first
// succeeded or failed outcome of any attempt wins; a later one is a no-op
// (recorded false), and so is a cancelled outcome unless an operator
// cancelled the attempt running now (domain.Invocation.Record). The worker's
// token is checked first (auth, against the row read with the invocation),
// and again inside the recording transaction (its hash must still be
// tokenHash) so a token revoked meanwhile cannot record. Only the worker that
// ran that attempt may ack it.
func (s *Store) Ack(ctx context.Context, id string, o domain.Outcome, auth Authorize, tokenHash string) (AckResult, error) {
	if c, ok := s.claimed.take(id); ok && c.inv.Attempt == o.Attempt && c.inv.WorkerID == o.WorkerID {
		if done, res, err := s.ackClaimed(ctx, c, o, auth, tokenHash); done {
			return res, err
		}
	}
	var res AckResult
	err := retryVersion("ack "+id, func() error {
		found, w, err := s.readForAck(ctx, id, o.WorkerID)
		if err != nil {
			return err
		}
		if w == nil {
			return UnknownWorker(o.WorkerID, auth)
		}
		if auth != nil {
			if err := auth(*w); err != nil {
				return err
			}
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
		switch err := s.putAndCount(ctx, inv.Version, &next, s.tokenCheck(o.WorkerID, tokenHash)); {
		case errors.Is(err, errExtraCondition):
			return ErrWorkerToken
		case err != nil:
			return err
		}
		res = AckResult{Recorded: true, HandedBack: o.State == domain.AckRequeued, State: next.State, Queue: next.Queue, HostKey: next.HostKey}
		return nil
	})
	return res, err
}

// ackClaimed records o over the invocation as this store claimed it, in
// the one transaction the ack writes anyway, without reading it first: the
// write is conditional on the version claimed, and the worker token check
// is the transaction's condition on the worker row. done is false when
// that is not enough to decide (the invocation changed since, the outcome
// would not count, or the cached worker row does not pass auth): the caller
// then reads and decides as usual, so the rules are domain.Invocation.Record
// either way.
func (s *Store) ackClaimed(ctx context.Context, c claimedEntry, o domain.Outcome, auth Authorize, tokenHash string) (done bool, res AckResult, err error) {
	if auth != nil && auth(c.worker) != nil {
		return false, AckResult{}, nil
	}
	next, recorded, err := c.inv.Record(o, s.now())
	if err != nil || !recorded {
		return false, AckResult{}, nil
	}
	switch err := s.putAndCount(ctx, c.inv.Version, &next, s.tokenCheck(o.WorkerID, tokenHash)); {
	case errors.Is(err, errVersion):
		return false, AckResult{}, nil
	case errors.Is(err, errExtraCondition):
		return true, AckResult{}, ErrWorkerToken
	case err != nil:
		return true, AckResult{}, err
	}
	return true, AckResult{Recorded: true, HandedBack: o.State == domain.AckRequeued, State: next.State, Queue: next.Queue, HostKey: next.HostKey}, nil
}

// tokenCheck is the transaction item that holds only while worker id's
// row carries token hash h: a token revoked meanwhile fails the write.
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

// saveInvocation writes next over the invocation stored at version prev: a
// terminal next with its counters (putAndCount), any other as one
// versioned put.
func (s *Store) saveInvocation(ctx context.Context, op string, prev int64, next *domain.Invocation) error {
	if domain.Terminal(next.State) {
		return s.putAndCount(ctx, prev, next)
	}
	put, err := s.invocationPut(prev, next)
	if err != nil {
		return err
	}
	if err := s.put(ctx, put); err != nil {
		return storeErr(op+" "+next.ID, err)
	}
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

// ListInvocations pages through invocations, optionally of one queue and
// one state, oldest first (ListQuery).
func (s *Store) ListInvocations(ctx context.Context, queue, state string, limit int, cursor string) ([]domain.Invocation, string, error) {
	return s.List(ctx, ListQuery{Queue: queue, State: state, Limit: limit, Cursor: cursor})
}

// Listing orders (ListQuery.Order): by id, which is by creation time (ids
// are ULIDs). They are the API's order= values.
const (
	OrderOldest = "oldest"
	OrderNewest = "newest"
)

// ListQuery selects a page of invocations: of one queue or every queue,
// optionally in one state, in an order.
type ListQuery struct {
	Queue, State string
	// Order is OrderOldest or OrderNewest (by id: by creation
	// time), or "" for oldest first where an index orders the listing and
	// no particular order for the whole table.
	Order  string
	Limit  int
	Cursor string
}

// List answers one page of q and the cursor of the next ("": none).
//
// Of one queue it reads the queue (or queue_state) index, in id order.
// Without a queue but with a state or an order it reads each queue's
// partition of that index, as many as the page holds from each, and merges
// them by id: its cost follows the page and the number of queues, not the
// table, and live work (queued, running) is found however long the
// history. Queues are those the queues table names (NoteQueue). Without a
// queue, a state or an order it scans the table (no particular order).
func (s *Store) List(ctx context.Context, q ListQuery) ([]domain.Invocation, string, error) {
	if q.Queue == "" && (q.State != "" || q.Order != "") {
		return s.listAcross(ctx, q)
	}
	var start map[string]types.AttributeValue
	var err error
	switch {
	case q.Queue != "" && q.State != "":
		start, err = decodeCursor(q.Cursor, map[string]string{"queue_state": q.Queue + "#" + q.State}, "queue_state", "invocation_id")
	case q.Queue != "":
		start, err = decodeCursor(q.Cursor, map[string]string{"queue": q.Queue}, "queue", "invocation_id")
	default:
		start, err = decodeCursor(q.Cursor, nil, "invocation_id")
	}
	if err != nil {
		return nil, "", err
	}
	var items []map[string]types.AttributeValue
	var last map[string]types.AttributeValue
	if q.Queue != "" {
		in := s.queueQuery(q.Queue, q.State, q.Order, q.Limit)
		in.ExclusiveStartKey = start
		out, err := s.db.Query(ctx, in)
		if err != nil {
			return nil, "", storeErr("list invocations", err)
		}
		items, last = out.Items, out.LastEvaluatedKey
	} else {
		out, err := s.db.Scan(ctx, &dynamodb.ScanInput{
			TableName:         aws.String(s.tables.Invocations),
			Limit:             aws.Int32(int32(q.Limit)),
			ExclusiveStartKey: start,
		})
		if err != nil {
			return nil, "", storeErr("list invocations", err)
		}
		items, last = out.Items, out.LastEvaluatedKey
	}
	invs, err := decodeInvocations(items)
	if err != nil {
		return nil, "", err
	}
	return invs, encodeCursor(last), nil
}

// queueQuery reads up to limit invocations of queue (in state, if set)
// from the queue or queue_state index, in order.
func (s *Store) queueQuery(queue, state, order string, limit int) *dynamodb.QueryInput {
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Invocations),
		IndexName:                 aws.String(indexQueue),
		KeyConditionExpression:    aws.String("#q = :q"),
		ExpressionAttributeNames:  map[string]string{"#q": "queue"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":q": str(queue)},
		Limit:                     aws.Int32(int32(limit)),
		ScanIndexForward:          aws.Bool(order != OrderNewest),
	}
	if state != "" {
		in.IndexName = aws.String(indexQueueState)
		in.ExpressionAttributeNames["#q"] = "queue_state"
		in.ExpressionAttributeValues[":q"] = str(queue + "#" + state)
	}
	return in
}

// listCursorKey is the one attribute of a cursor of a listing across
// queues: the id the page ended at (ids order the merge, so the next page
// starts past it in every queue).
const listCursorKey = "listed_to"

// listAcross answers a page of q (no queue) merged from every queue's
// partition of the queue or queue_state index.
func (s *Store) listAcross(ctx context.Context, q ListQuery) ([]domain.Invocation, string, error) {
	start, err := decodeCursor(q.Cursor, nil, listCursorKey)
	if err != nil {
		return nil, "", err
	}
	newest := q.Order == OrderNewest
	bound := ""
	if start != nil {
		bound = start[listCursorKey].(*types.AttributeValueMemberS).Value
		if !ids.Valid(ids.Invocation, bound) {
			return nil, "", domain.Errorf(domain.KindInvalid, "cursor is not one this listing returned")
		}
	}
	queues, err := s.Queues(ctx)
	if err != nil {
		return nil, "", err
	}
	var invs []domain.Invocation
	more := false
	for _, queue := range queues {
		in := s.queueQuery(queue, q.State, q.Order, q.Limit)
		if bound != "" {
			op := ">"
			if newest {
				op = "<"
			}
			*in.KeyConditionExpression += " AND invocation_id " + op + " :b"
			in.ExpressionAttributeValues[":b"] = str(bound)
		}
		out, err := s.db.Query(ctx, in)
		if err != nil {
			return nil, "", storeErr("list invocations of "+queue, err)
		}
		page, err := decodeInvocations(out.Items)
		if err != nil {
			return nil, "", err
		}
		invs = append(invs, page...)
		more = more || out.LastEvaluatedKey != nil
	}
	slices.SortFunc(invs, func(a, b domain.Invocation) int {
		if newest {
			return strings.Compare(b.ID, a.ID)
		}
		return strings.Compare(a.ID, b.ID)
	})
	if len(invs) > q.Limit {
		invs, more = invs[:q.Limit], true
	}
	if !more || len(invs) == 0 {
		return invs, "", nil
	}
	return invs, encodeCursor(map[string]types.AttributeValue{listCursorKey: str(invs[len(invs)-1].ID)}), nil
}

func decodeInvocations(items []map[string]types.AttributeValue) ([]domain.Invocation, error) {
	invs := make([]domain.Invocation, 0, len(items))
	for _, item := range items {
		inv, err := decodeInvocation(item)
		if err != nil {
			return nil, err
		}
		invs = append(invs, inv)
	}
	return invs, nil
}

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
		if domain.Terminal(state) {
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
func (s *Store) countLive(ctx context.Context, queue, state string) (int, error) {
	n := 0
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Invocations),
		IndexName:                 aws.String(indexQueueState),
		KeyConditionExpression:    aws.String("queue_state = :q"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":q": str(queue + "#" + state)},
		Select:                    types.SelectCount,
	}
	for {
		out, err := s.db.Query(ctx, in)
		if err != nil {
			return 0, storeErr("count "+state+" of "+queue, err)
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
func (c QueueCounters) ByState() map[string]int {
	return map[string]int{domain.StateSucceeded: c.Succeeded, domain.StateFailed: c.Failed, domain.StateCancelled: c.Cancelled}
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
		ExpressionAttributeValues: map[string]types.AttributeValue{":q": str(queue + "#" + domain.StateQueued)},
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

// claimKeyRetrying is the claim index partition of every invocation that
// waits out a retry backoff. No queue's claim key can be it: queue names
// hold no "!".
const claimKeyRetrying = "!retrying"

// ReleaseRetries makes every invocation whose retry backoff has passed at
// now claimable again (domain.Invocation.ReleaseRetry), and reports them.
// The sweep calls it: an invocation becomes claimable at the first sweep
// after its backoff. One that cannot be released is in the error; the
// others are still tried.
func (s *Store) ReleaseRetries(ctx context.Context) ([]domain.Invocation, error) {
	var due []string
	if err := s.queryEach(ctx, "read retrying invocations", &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Invocations),
		IndexName:                 aws.String(indexClaim),
		KeyConditionExpression:    aws.String("claim_key = :k"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":k": str(claimKeyRetrying)},
	}, func(item map[string]types.AttributeValue) error {
		inv, err := decodeInvocation(item)
		if err != nil {
			return err
		}
		if _, ok := inv.ReleaseRetry(s.now()); ok {
			due = append(due, inv.ID)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	var out []domain.Invocation
	var errs []error
	for _, id := range due {
		err := retryVersion("release retry "+id, func() error {
			inv, err := s.GetInvocation(ctx, id)
			if err != nil {
				return err
			}
			next, changed := inv.ReleaseRetry(s.now())
			if !changed {
				return nil
			}
			if err := s.saveInvocation(ctx, "release retry", inv.Version, &next); err != nil {
				return err
			}
			out = append(out, next)
			return nil
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}
