package store_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// countedStores are n stores (n processes) over fresh tables of one
// embedded server, whose requests are all counted in one counter.
func countedStores(t *testing.T, n int) ([]*store.Store, *storetest.Counter) {
	t.Helper()
	plain := storetest.Embedded(t)
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(context.Background(), plain, prefix); err != nil {
		t.Fatal(err)
	}
	counter := &storetest.Counter{}
	var out []*store.Store
	for range n {
		out = append(out, store.New(storetest.CountingClient(plain, counter), prefix))
	}
	return out, counter
}

func claimOne(t *testing.T, s *store.Store, w domain.Worker) domain.Invocation {
	t.Helper()
	res, err := s.Claim(context.Background(), w, "q", 1)
	if err != nil || len(res.Claimed) != 1 {
		t.Fatalf("claim = %+v, %v; want one", res, err)
	}
	return res.Claimed[0]
}

// TestPooledClaimsNeverRace: many claimers of one process share one query's
// candidates and never lose a write to each other; every invocation is
// claimed exactly once.
func TestPooledClaimsNeverRace(t *testing.T) {
	ss, counter := countedStores(t, 1)
	s := ss[0]
	ctx := context.Background()
	svc := storetest.Control(s)
	const n = 40
	submitJobs(t, svc, n)
	workers := make([]domain.Worker, 8)
	for i := range workers {
		workers[i] = benchWorker(t, s, fmt.Sprintf("m%d", i), "")
	}
	counter.Reset()
	var mu sync.Mutex
	seen := map[string]int{}
	conflicts := 0
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			for range n {
				res, err := s.Claim(ctx, w, "q", 1)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				conflicts += res.Conflicts
				for _, inv := range res.Claimed {
					seen[inv.ID]++
				}
				mu.Unlock()
				if len(res.Claimed) == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	if len(seen) != n {
		t.Fatalf("claimed %d distinct invocations, want %d", len(seen), n)
	}
	for id, k := range seen {
		if k != 1 {
			t.Errorf("%s claimed %d times", id, k)
		}
	}
	if conflicts != 0 {
		t.Errorf("%d lost writes between claimers of one process, want 0", conflicts)
	}
	if q := counter.Get("Query"); q > n/2 {
		t.Errorf("%d claim queries for %d claims: the pool should serve most claims from one read", q, n)
	}
}

// TestAckOfOwnClaimNeedsNoRead: an ack of the attempt this store claimed is
// one request (the transaction), and counts as usual: the worker's token
// is checked inside it, against the hash its row carried at the claim.
func TestAckOfOwnClaimNeedsNoRead(t *testing.T) {
	ss, counter := countedStores(t, 1)
	s := ss[0]
	ctx := context.Background()
	svc := storetest.Control(s)
	if _, _, err := svc.Submit(ctx, submitReq("job").Spec()); err != nil {
		t.Fatal(err)
	}
	w := benchWorker(t, s, "m1", "")
	inv := claimOne(t, s, w)
	counter.Reset()
	resp, err := svc.Ack(ctx, ackReq(w, inv, inv.Attempt, domain.StateSucceeded).Outcome(), authorizeHash("bench-hash"))
	if err != nil || !resp.Recorded || resp.State != domain.StateSucceeded {
		t.Fatalf("ack = %+v, %v", resp, err)
	}
	if got := counter.Snapshot(); counter.Total() != 1 || got["TransactWriteItems"] != 1 {
		t.Fatalf("the ack made %v, want one TransactWriteItems", got)
	}
	if st, _ := s.QueueStats(ctx, "q"); st.DoneCount != 1 {
		t.Fatalf("done_count %d, want 1", st.DoneCount)
	}
}

// TestAckAfterAChangeReadsAgain: when the invocation changed after this
// store claimed it (an operator cancel), the ack reads it and decides on
// what is stored; a token a newer hello replaced is refused, however the
// ack is served; and an ack through another store (another Lambda) reads
// as before.
func TestAckAfterAChangeReadsAgain(t *testing.T) {
	ss, _ := countedStores(t, 2)
	s, other := ss[0], ss[1]
	ctx := context.Background()
	svc := storetest.Control(s)
	submitJobs(t, svc, 3)
	w := benchWorker(t, s, "m1", "")

	// Cancelled by an operator while it ran: the worker's cancelled
	// outcome counts (the operator asked), read from the store.
	a := claimOne(t, s, w)
	if _, err := svc.Cancel(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	resp, err := svc.Ack(ctx, ackReq(w, a, a.Attempt, domain.StateCancelled).Outcome(), authorizeHash("bench-hash"))
	if err != nil || !resp.Recorded || resp.State != domain.StateCancelled {
		t.Fatalf("ack after an operator cancel = %+v, %v; want recorded cancelled", resp, err)
	}

	// A newer hello of the same boot, served by another store (another
	// Lambda instance), replaces the token after the claim: the old token
	// is refused, on this store's cached entry and through the other
	// store, and the new one records.
	b := claimOne(t, s, w)
	if _, err := storetest.Control(other).Register(ctx, helloReq("m1", "boot-1").Registration(),
		func(string) (string, error) { return "newer-hash", nil }); err != nil {
		t.Fatalf("the newer hello: %v", err)
	}
	for name, st := range map[string]*store.Store{"cached": s, "another store": other} {
		if _, err := storetest.Control(st).Ack(ctx, ackReq(w, b, b.Attempt, domain.StateSucceeded).Outcome(), authorizeHash("bench-hash")); !errors.Is(err, wire.ErrUnauthorized) {
			t.Fatalf("ack with a replaced token (%s) = %v, want 401", name, err)
		}
	}
	if got, _ := s.GetInvocation(ctx, b.ID); got.State != domain.StateRunning {
		t.Fatalf("a refused ack changed the invocation: %+v", got)
	}
	resp, err = svc.Ack(ctx, ackReq(w, b, b.Attempt, domain.StateSucceeded).Outcome(), authorizeHash("newer-hash"))
	if err != nil || !resp.Recorded || resp.State != domain.StateSucceeded {
		t.Fatalf("ack with the newer token = %+v, %v; want recorded succeeded", resp, err)
	}

	// Through another store: the read path.
	c := claimOne(t, s, w)
	resp, err = storetest.Control(other).Ack(ctx, ackReq(w, c, c.Attempt, domain.StateFailed).Outcome(), authorizeHash("newer-hash"))
	if err != nil || !resp.Recorded || resp.State != domain.StateFailed {
		t.Fatalf("ack through another store = %+v, %v", resp, err)
	}
	// And the cached entry of c, now stale, is not used to record twice.
	resp, err = svc.Ack(ctx, ackReq(w, c, c.Attempt, domain.StateSucceeded).Outcome(), authorizeHash("newer-hash"))
	if err != nil || resp.Recorded || resp.State != domain.StateFailed {
		t.Fatalf("a second ack of c = %+v, %v; want a no-op answering failed", resp, err)
	}
}

// TestShardedClaims: with ClaimShards, queued work spreads over the
// shards of its partition, every shard is claimed from, and work handed
// back returns to its shard.
func TestShardedClaims(t *testing.T) {
	ss, _ := countedStores(t, 1)
	s := ss[0]
	s.ClaimShards = 4
	ctx := context.Background()
	svc := storetest.Control(s)
	const n = 24
	submitJobs(t, svc, n)
	keys := func() map[string]int {
		out, err := s.DB().Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(s.Tables().Invocations)})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, item := range out.Items {
			if v, ok := item["claim_key"].(*types.AttributeValueMemberS); ok {
				got[v.Value]++
			}
		}
		return got
	}
	before := keys()
	if len(before) < 3 {
		t.Fatalf("claim keys %v: 24 invocations over 4 shards should use at least 3", before)
	}
	for k := range before {
		if !strings.HasPrefix(k, "q##") {
			t.Fatalf("claim key %q is not a shard of q#", k)
		}
	}
	w := benchWorker(t, s, "m1", "")
	var claimed []domain.Invocation
	for range n + 1 {
		res, err := s.Claim(ctx, w, "q", 4)
		if err != nil {
			t.Fatal(err)
		}
		claimed = append(claimed, res.Claimed...)
		if len(res.Claimed) == 0 {
			break
		}
	}
	if len(claimed) != n {
		t.Fatalf("claimed %d of %d across the shards", len(claimed), n)
	}
	if left := keys(); len(left) != 0 {
		t.Fatalf("still queued after claiming all: %v", left)
	}
	if _, err := svc.HandBack(ctx, w.ID, domain.Loss{Kind: domain.EndStale}); err != nil {
		t.Fatal(err)
	}
	if after := keys(); !maps.Equal(after, before) {
		t.Fatalf("handed back to %v, want the shards they came from %v", after, before)
	}
}

// TestClaimReadsAWholeQueueOnce: a claim for more than a queue holds reads
// its partition once, takes all of it, and does not read again for the
// rest of what it wants; the next claim reads afresh and finds what came
// since.
func TestClaimReadsAWholeQueueOnce(t *testing.T) {
	ss, counter := countedStores(t, 1)
	s := ss[0]
	ctx := context.Background()
	svc := storetest.Control(s)
	submitJobs(t, svc, 2)
	w := benchWorker(t, s, "m1", "")
	counter.Reset()
	res, err := s.Claim(ctx, w, "q", 4)
	if err != nil || len(res.Claimed) != 2 {
		t.Fatalf("claim of 4 from a queue of 2 = %d claimed, %v", len(res.Claimed), err)
	}
	if got := counter.Snapshot()["Query"]; got != 1 {
		t.Errorf("claim of 4 from a queue of 2: %d claim index queries, want 1", got)
	}
	if _, _, err := svc.Submit(ctx, submitReq("job", "late").Spec()); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Claim(ctx, w, "q", 4); err != nil || len(res.Claimed) != 1 {
		t.Fatalf("the next claim = %d claimed, %v; want the one submitted since", len(res.Claimed), err)
	}
}

// submitJobs submits n jobs to queue "q" ("job 0", "job 1", ...).
func submitJobs(tb testing.TB, svc *control.Service, n int) {
	tb.Helper()
	for i := range n {
		if _, _, err := svc.Submit(context.Background(), submitReq("job", fmt.Sprint(i)).Spec()); err != nil {
			tb.Fatalf("submit job %d: %v", i, err)
		}
	}
}
