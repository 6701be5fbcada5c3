package store_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/ids"
)

// submitN queues n invocations on queue q and returns their ids, oldest
// first.
func submitN(t *testing.T, s *store.Store, n int) []string {
	t.Helper()
	svc := storetest.Control(s)
	var out []string
	for i := range n {
		inv, _, err := svc.Submit(context.Background(), submitReq("job", fmt.Sprint(i)).Spec())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, inv.ID)
	}
	return out
}

// oldestFirst is a Store.Shuffle under which a claim takes the first
// candidate its read found (the pool hands candidates out from the end).
func oldestFirst(n int, swap func(i, j int)) {
	for i := range n / 2 {
		swap(i, n-1-i)
	}
}

// TestSpreadClaimReadsFromARandomPoint: a store that spreads its claims
// takes the first candidate at its random point between the partition's
// first and last entry, not the head; one that does not takes the head.
func TestSpreadClaimReadsFromARandomPoint(t *testing.T) {
	ss, _ := countedStores(t, 2)
	ids0 := submitN(t, ss[0], 40)
	half := uint64(1) << 63
	pivot, ok := ids.Between(ids0[0], ids0[len(ids0)-1], half)
	if !ok {
		t.Fatalf("Between(%s, %s) refused", ids0[0], ids0[len(ids0)-1])
	}
	want := ids0[slices.IndexFunc(ids0, func(id string) bool { return id >= pivot })]
	if want == ids0[0] {
		t.Fatalf("the midpoint %s is the head: the test needs the two apart", pivot)
	}

	spread, head := ss[0], ss[1]
	spread.SpreadClaims, spread.Shuffle, spread.Random = true, oldestFirst, func() uint64 { return half }
	head.Shuffle, head.Random = oldestFirst, func() uint64 { return half }
	if got := claimOne(t, spread, benchWorker(t, spread, "m1", "")); got.ID != want {
		t.Errorf("spread claim took %s, want %s (the first at the midpoint)", got.ID, want)
	}
	if got := claimOne(t, head, benchWorker(t, head, "m2", "")); got.ID != ids0[0] {
		t.Errorf("head claim took %s, want the oldest %s", got.ID, ids0[0])
	}
}

// TestSpreadClaimOfASmallPartitionReadsOnce: a partition that holds no
// more than one read's window is read whole from its head: one query a
// claim, no span read.
func TestSpreadClaimOfASmallPartitionReadsOnce(t *testing.T) {
	ss, counter := countedStores(t, 1)
	s := ss[0]
	s.SpreadClaims = true
	submitN(t, s, 3)
	w := benchWorker(t, s, "m1", "")
	counter.Reset()
	res, err := s.Claim(context.Background(), w, "q", 3)
	if err != nil || len(res.Claimed) != 3 {
		t.Fatalf("claim = %+v, %v; want all three", res, err)
	}
	if q := counter.Get("Query"); q != 1 {
		t.Errorf("%d queries to claim a partition of 3, want 1", q)
	}
}

// racingDB lets another process claim first, just before each of the
// first steals claim puts of the store it wraps: those puts lose their race.
type racingDB struct {
	store.DB
	mu     sync.Mutex
	steals int
	first  func()
}

func (r *racingDB) PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	r.mu.Lock()
	steal := r.steals > 0
	r.steals--
	r.mu.Unlock()
	if steal {
		r.first()
	}
	return r.DB.PutItem(ctx, in, opts...)
}

// TestLostRaceAtTheTailYields: a claimer that loses races for a queue's
// last candidates (its reads did not fill their window) looks once more,
// and takes one a racer left; after a second loss there it yields rather
// than try the rest at once, which racers are taking too. In a deep queue
// it reads again and claims.
func TestLostRaceAtTheTailYields(t *testing.T) {
	for _, c := range []struct {
		queued, steals int
		want           int // the claim's room; 0 is 1
		wantClaimed    int
		wantConflicts  int // 0 is steals
	}{
		{queued: 3, steals: 1, wantClaimed: 1},
		{queued: 3, steals: 2, wantClaimed: 0},
		{queued: 20, steals: 2, wantClaimed: 1},
		// Room for two changes nothing at the tail: a loss there ends the
		// read, and a second loss the claim.
		{queued: 3, steals: 3, want: 2, wantClaimed: 0, wantConflicts: 2},
		{queued: 4, steals: 1, want: 2, wantClaimed: 2},
	} {
		t.Run(fmt.Sprintf("queued=%d/lost=%d/room=%d", c.queued, c.steals, max(c.want, 1)), func(t *testing.T) {
			ss, _ := countedStores(t, 1)
			other := ss[0]
			submitN(t, other, c.queued)
			other.Shuffle = oldestFirst
			otherWorker := benchWorker(t, other, "m-other", "")
			racing := &racingDB{DB: other.DB(), steals: c.steals, first: func() { claimOne(t, other, otherWorker) }}
			s := store.New(racing, prefixOf(other))
			s.SpreadClaims, s.Shuffle, s.Random = true, oldestFirst, func() uint64 { return 0 }
			w := benchWorker(t, other, "m1", "")
			res, err := s.Claim(context.Background(), w, "q", max(c.want, 1))
			if err != nil {
				t.Fatal(err)
			}
			conflicts := c.steals
			if c.wantConflicts > 0 {
				conflicts = c.wantConflicts
			}
			if res.Conflicts != conflicts || len(res.Claimed) != c.wantClaimed {
				t.Errorf("claim = %d claimed, %d conflicts; want %d claimed after %d", len(res.Claimed), res.Conflicts, c.wantClaimed, conflicts)
			}
		})
	}
}

// TestSpreadClaimReadsItsSpanAgain: the partition's first and last entry
// place spread reads for spanTTL (a second), then are read again, so work
// queued since is reached from its own part of the queue.
func TestSpreadClaimReadsItsSpanAgain(t *testing.T) {
	ss, _ := countedStores(t, 1)
	s := ss[0]
	fake := clock.NewFake(time.Now())
	s.Clock, s.SpreadClaims, s.Shuffle = fake.Clock(), true, oldestFirst
	s.Random = func() uint64 { return math.MaxUint64 } // the last entry
	w := benchWorker(t, s, "m1", "")
	first := submitN(t, s, 10)
	if got := claimOne(t, s, w); got.ID != first[9] {
		t.Fatalf("took %s, want the last %s", got.ID, first[9])
	}
	later := submitN(t, s, 10)
	fake.Advance(200 * time.Millisecond) // past the pool, within the span's second
	if got := claimOne(t, s, w); got.ID != later[0] {
		t.Fatalf("within the span's second took %s, want %s (the first past the old last entry)", got.ID, later[0])
	}
	fake.Advance(2 * time.Second)
	if got := claimOne(t, s, w); got.ID != later[9] {
		t.Errorf("after the span's second took %s, want the new last entry %s", got.ID, later[9])
	}
}
