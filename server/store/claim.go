package store

import (
	"context"
	"errors"
	"hash/fnv"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
)

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
		tailRetried := false
		for round := 0; round < claimRounds && len(res.Claimed) < max; round++ {
			_, more, lostAtTail, err := s.claimRound(ctx, w, part, window, max-len(res.Claimed), &res)
			if err != nil {
				return res, err
			}
			if lostAtTail && !tailRetried {
				// One more look at a queue's last candidates: a racer that
				// took the one this claimer wanted may have left others.
				tailRetried, more = true, true
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
// processes) were taking the candidates of a partition deeper than one
// read; then the pool is dropped, so the next round reads afresh.
// lostAtTail reports a round that stopped on lost races where the last
// read did not fill its window: the partition holds fewer candidates than
// there are racers for them (a queue's last jobs), and each further try
// would mostly lose again. Claim gives such a partition one more round,
// then yields: the poll looks again on its backoff, or its next wake.
func (s *Store) claimRound(ctx context.Context, w domain.Worker, part string, window, want int, res *ClaimResult) (got int, more, lostAtTail bool, err error) {
	window = max(window, want)
	lost := 0
	full := false
	// readWhole: this round read the partition and found all of it (the
	// read did not fill its window). Once those candidates are taken, a
	// second read at once would find only what arrived in between, which
	// its submit wakes a poll for: the round ends instead of reading again.
	readWhole := false
	for got < want {
		// Each lost race means the candidates we hold are going stale under
		// other pollers: after as many losses as claims wanted, a fresh read
		// (cheap) beats more failed conditional writes (each one billed).
		// Where the read held every candidate (not full: a queue's last
		// few), one loss is enough: the rest have racers of their own.
		if lost >= want || (lost > 0 && !full) {
			s.pool.contended(part, s.now())
			return got, full, !full, nil
		}
		now := s.now()
		inv, ok, wasFull, err := s.pool.take(part, now, s.ClaimPoolTTL, s.SpreadClaims, func(trying int, span *claimSpan) ([]domain.Invocation, bool, error) {
			if readWhole {
				return nil, false, nil
			}
			invs, full, err := s.readWindow(ctx, part, window, trying, span, now)
			readWhole = err == nil && !full
			return invs, full, err
		})
		if err != nil {
			return got, false, false, err
		}
		full = wasFull
		if !ok {
			return got, full, false, nil
		}
		next, err := inv.Claim(w, now)
		if err != nil {
			s.pool.tried(part, inv.ID)
			continue // not queued: an index lagging its table (AWS GSIs are eventually consistent)
		}
		put, err := s.invocationPut(inv.Version, &next)
		if err != nil {
			s.pool.tried(part, inv.ID)
			return got, false, false, err
		}
		err = s.put(ctx, put)
		s.pool.tried(part, inv.ID)
		switch {
		case errors.Is(err, errVersion):
			res.Conflicts++
			lost++
		case err != nil:
			return got, false, false, storeErr("claim "+inv.ID, err)
		default:
			res.Claimed = append(res.Claimed, next)
			s.claimed.put(next.ID, claimedEntry{next, w})
			got++
		}
	}
	return got, false, false, nil
}

// readWindow reads candidates of partition part for the claim pool, which
// is trying trying of them already: spread from a random point when span
// is set (readSpread), else from the head (readCandidates), the window
// widened by those being tried.
func (s *Store) readWindow(ctx context.Context, part string, window, trying int, span *claimSpan, now time.Time) ([]domain.Invocation, bool, error) {
	if span != nil {
		return s.readSpread(ctx, part, min(spreadWindow+trying, maxClaimWindow), span, now)
	}
	return s.readCandidates(ctx, part, min(window+trying, maxClaimWindow))
}

// readCandidates reads up to window queued invocations of partition part
// from its head, shuffled so racing pollers spread over the head of the
// queue, and whether the window was full (more may be queued).
func (s *Store) readCandidates(ctx context.Context, part string, window int) ([]domain.Invocation, bool, error) {
	invs, full, err := s.queryClaim(ctx, part, "", "", window, true)
	if err != nil {
		return nil, false, err
	}
	s.Shuffle(len(invs), func(i, j int) { invs[i], invs[j] = invs[j], invs[i] })
	return invs, full, nil
}

// spreadWindow is how many candidates a contended read takes from its
// random point: enough for a few tries, few enough that two claimers'
// windows seldom meet.
const spreadWindow = 8

// spanTTL is how long a partition's first and last entry, once read, place
// contended reads.
const spanTTL = time.Second

// readSpread is readCandidates for a partition other processes claim from
// too (Lambda instances each claim on their own): all reading its head,
// they would race for the same few candidates, each lost race a billed
// write. It reads up to window candidates from a random point between the
// partition's first and last entry (span, read again when older than
// spanTTL), so claimers spread over the whole queue and meet about as
// often as their number over its length: work is taken roughly, not
// strictly, oldest first. A partition that holds no more than window
// candidates is read whole from its head, as racers there cannot spread.
func (s *Store) readSpread(ctx context.Context, part string, window int, span *claimSpan, now time.Time) ([]domain.Invocation, bool, error) {
	if span.head == "" || now.Sub(span.read) > spanTTL {
		*span = claimSpan{}
		head, full, err := s.queryClaim(ctx, part, "", "", window, true)
		if err != nil || !full {
			s.Shuffle(len(head), func(i, j int) { head[i], head[j] = head[j], head[i] })
			return head, false, err
		}
		tail, _, err := s.queryClaim(ctx, part, "", "", 1, false)
		if err != nil || len(tail) == 0 {
			return nil, false, err
		}
		*span = claimSpan{head: head[0].ID, tail: tail[0].ID, read: now}
	}
	pivot, ok := ids.Between(span.head, span.tail, s.Random())
	if !ok {
		pivot = span.head
	}
	invs, full, err := s.queryClaim(ctx, part, ">=", pivot, window, true)
	if err != nil {
		return nil, false, err
	}
	if len(invs) < window && pivot > span.head {
		// Near the end of the partition: the rest comes from its head.
		more, _, err := s.queryClaim(ctx, part, "<", pivot, window-len(invs), true)
		if err != nil {
			return nil, false, err
		}
		invs = append(invs, more...)
		full = len(invs) >= window
	}
	if len(invs) == 0 {
		*span = claimSpan{} // claimed meanwhile: read the span afresh
	}
	s.Shuffle(len(invs), func(i, j int) { invs[i], invs[j] = invs[j], invs[i] })
	return invs, full, nil
}

// queryClaim reads up to limit queued invocations of claim partition part
// in id order (forward: oldest first), those with an id op pivot when op
// is set, and whether the read filled its limit.
func (s *Store) queryClaim(ctx context.Context, part, op, pivot string, limit int, forward bool) ([]domain.Invocation, bool, error) {
	cond := "claim_key = :k"
	vals := map[string]types.AttributeValue{":k": str(part)}
	if op != "" {
		cond += " AND invocation_id " + op + " :p"
		vals[":p"] = str(pivot)
	}
	out, err := s.db.Query(ctx, &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Invocations),
		IndexName:                 aws.String(indexClaim),
		KeyConditionExpression:    aws.String(cond),
		ExpressionAttributeValues: vals,
		ScanIndexForward:          aws.Bool(forward),
		Limit:                     aws.Int32(int32(limit)),
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
	return invs, len(out.Items) >= limit || out.LastEvaluatedKey != nil, nil
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
