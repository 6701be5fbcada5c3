package store_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
)

// TestBackfillIndexes: rows written before the roster and listing indexes
// (a worker row, a queue's counter row, a run row) are brought into them
// once, so the sweep finds the worker and the lists show the queue and the
// run; a second pass, from any process, costs one read. On moto: the
// embedded store does not index an item an update brings into an index.
func TestBackfillIndexes(t *testing.T) {
	ctx := context.Background()
	plain, prefix, old := motoStore(t)
	tables := old.Tables()

	// A worker as the old code wrote it: no roster entry.
	w := benchWorker(t, old, "m-old", "")
	strip(t, plain, tables.Workers, "worker_id", w.ID, "roster", "roster_until")
	// A queue's counters row with no listing entry, and a run row with no
	// listing attributes.
	put(t, plain, tables.Queues, map[string]types.AttributeValue{
		"queue": &types.AttributeValueMemberS{Value: "oldq"}, "done_count": &types.AttributeValueMemberN{Value: "3"},
	})
	run := domain.Run{ID: (&ids.Generator{}).New(ids.Run), Queue: "oldq", Total: 1, Submitted: true, CreatedAt: time.Now().UTC(), Version: 1}
	item, err := old.RunItem(run)
	if err != nil {
		t.Fatal(err)
	}
	delete(item, "listing")
	delete(item, "listed")
	put(t, plain, tables.Queues, item)

	visible := func(s *store.Store) (worker, queue, runListed bool) {
		t.Helper()
		if err := s.EachWorker(ctx, "test", func(got domain.Worker) error {
			worker = worker || got.ID == w.ID
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		qs, err := s.Queues(ctx)
		if err != nil {
			t.Fatal(err)
		}
		runs, _, err := s.Runs(ctx, "oldq", 10, "")
		if err != nil {
			t.Fatal(err)
		}
		return worker, slices.Contains(qs, "oldq"), slices.ContainsFunc(runs, func(r domain.Run) bool { return r.ID == run.ID })
	}
	if wk, q, r := visible(old); wk || q || r {
		t.Fatalf("before the backfill: worker %v, queue %v, run %v listed; the test's rows should be invisible", wk, q, r)
	}

	counter := &storetest.Counter{}
	s := store.New(storetest.CountingClient(plain, counter), prefix)
	n, err := s.BackfillIndexes(ctx)
	if err != nil || n != 3 {
		t.Fatalf("BackfillIndexes = %d, %v; want 3 rows written", n, err)
	}
	if wk, q, r := visible(s); !wk || !q || !r {
		t.Errorf("after the backfill: worker %v, queue %v, run %v listed; want all", wk, q, r)
	}
	if got, err := s.GetRun(ctx, run.ID); err != nil || got.Version != run.Version {
		t.Errorf("run after the backfill = %+v, %v; want it unchanged at version %d", got, err, run.Version)
	}

	again := &storetest.Counter{}
	other := store.New(storetest.CountingClient(plain, again), prefix)
	if n, err := other.BackfillIndexes(ctx); err != nil || n != 0 {
		t.Fatalf("second BackfillIndexes = %d, %v; want nothing to do", n, err)
	}
	if n, err := other.BackfillIndexes(ctx); err != nil || n != 0 {
		t.Fatalf("third BackfillIndexes = %d, %v; want nothing to do", n, err)
	}
	if got := again.Snapshot(); again.Total() != 1 || got["GetItem"] != 1 {
		t.Errorf("a finished backfill, asked twice by one process, made %v; want one read of its marker", got)
	}
}

func strip(t *testing.T, db *dynamodb.Client, table, hashKey, id string, attrs ...string) {
	t.Helper()
	expr := "REMOVE "
	names := map[string]string{}
	for i, a := range attrs {
		if i > 0 {
			expr += ", "
		}
		n := "#a" + string(rune('0'+i))
		names[n] = a
		expr += n
	}
	if _, err := db.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
		TableName: aws.String(table), Key: map[string]types.AttributeValue{hashKey: &types.AttributeValueMemberS{Value: id}},
		UpdateExpression: aws.String(expr), ExpressionAttributeNames: names,
	}); err != nil {
		t.Fatal(err)
	}
}

func put(t *testing.T, db *dynamodb.Client, table string, item map[string]types.AttributeValue) {
	t.Helper()
	if _, err := db.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(table), Item: item}); err != nil {
		t.Fatal(err)
	}
}

// oldWriterDB rewrites, just before the first UpdateItem through it, a
// worker row as a control plane not yet upgraded would: changed, and with
// no roster entry.
type oldWriterDB struct {
	store.DB
	once  sync.Once
	write func()
}

func (o *oldWriterDB) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	o.once.Do(o.write)
	return o.DB.UpdateItem(ctx, in, opts...)
}

// TestBackfillNeverWritesAStaleEntry: a worker row rewritten between the
// backfill's scan and its write (by a process of the old version, during a
// rolling deploy: here it reaped the worker) is read again and gets the
// entry of what that write made. The entry worked out from the row it
// scanned would list a reaped worker as live; skipping the row would leave
// it out of the index for good.
func TestBackfillNeverWritesAStaleEntry(t *testing.T) {
	ctx := context.Background()
	plain, prefix, old := motoStore(t)
	w := benchWorker(t, old, "m-old", "")
	strip(t, plain, old.Tables().Workers, "worker_id", w.ID, "roster", "roster_until")
	racing := &oldWriterDB{DB: plain, write: func() {
		cur, err := old.GetWorker(ctx, w.ID)
		if err != nil {
			t.Error(err)
			return
		}
		cur.Reaped, cur.Version = true, cur.Version+1
		item, err := old.WorkerItem(cur)
		if err != nil {
			t.Error(err)
			return
		}
		delete(item, "roster")
		delete(item, "roster_until")
		put(t, plain, old.Tables().Workers, item)
	}}
	s := store.New(racing, prefix)
	if n, err := s.BackfillIndexes(ctx); err != nil || n != 1 {
		t.Fatalf("BackfillIndexes = %d, %v; want the worker row written", n, err)
	}
	if err := s.EachWorker(ctx, "test", func(got domain.Worker) error {
		if got.ID == w.ID {
			t.Errorf("the sweep lists %s, reaped meanwhile, as live", w.ID)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	listed := false
	if err := s.EachListedWorker(ctx, "test", func(got domain.Worker) error {
		listed = listed || got.ID == w.ID
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !listed {
		t.Errorf("%s is in no part of the roster: the backfill skipped the row it found changed", w.ID)
	}
}

// motoStore is a store over fresh tables on moto_server, with its plain
// client: these tests write rows as the version before wrote them.
func motoStore(t *testing.T) (*dynamodb.Client, string, *store.Store) {
	t.Helper()
	plain := storetest.Moto(t)
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(context.Background(), plain, prefix); err != nil {
		t.Fatal(err)
	}
	return plain, prefix, store.New(plain, prefix)
}
