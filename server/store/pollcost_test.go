package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// pollFixture is one counted store on a fake clock, its control service
// (default stale window: a 5 s poll interval) and one ready worker.
type pollFixture struct {
	t     *testing.T
	ctx   context.Context
	clock *clock.Fake
	s     *store.Store
	// other is a second store over the same tables (another process),
	// counted with s.
	other *store.Store
	w     domain.Worker
	count func() map[string]int
}

func newPollFixture(t *testing.T) *pollFixture {
	t.Helper()
	ss, counter := countedStores(t, 2)
	fake := clock.NewFake(time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC))
	ss[0].Clock, ss[1].Clock = fake.Clock(), fake.Clock()
	f := &pollFixture{t: t, ctx: context.Background(), clock: fake, s: ss[0], other: ss[1]}
	f.w = benchWorker(t, f.s, "m1", "")
	f.count = func() map[string]int {
		defer counter.Reset()
		return counter.Snapshot()
	}
	f.count()
	return f
}

// poll polls as the fixture's worker, listing inflight, and reports the
// DynamoDB requests it made by operation.
func (f *pollFixture) poll(inflight ...string) map[string]int {
	f.t.Helper()
	if inflight == nil {
		inflight = []string{}
	}
	p := wire.PollRequest{WorkerID: f.w.ID, Phase: wire.PhaseReady, Invocations: inflight}.Poll()
	if _, err := storetest.Control(f.s).Poll(f.ctx, p, nil); err != nil {
		f.t.Fatalf("poll: %v", err)
	}
	return f.count()
}

func (f *pollFixture) worker() domain.Worker {
	f.t.Helper()
	w, err := f.s.GetWorker(f.ctx, f.w.ID)
	if err != nil {
		f.t.Fatal(err)
	}
	return w
}

// TestQuietPollWritesNoHeartbeat: a poll that changes nothing on the worker
// row but last_seen_at, within a poll interval of the stored one, writes
// nothing; a poll that changes something, or comes an interval later,
// writes the row.
func TestQuietPollWritesNoHeartbeat(t *testing.T) {
	f := newPollFixture(t)
	first := f.worker().LastSeenAt

	f.clock.Advance(2 * time.Second)
	if got := f.poll(); got["PutItem"] != 0 {
		t.Errorf("a poll 2 s after the last, changing nothing: %v; want no PutItem", got)
	}
	if w := f.worker(); !w.LastSeenAt.Equal(first) {
		t.Errorf("last_seen_at = %v, want the stored %v kept", w.LastSeenAt, first)
	}

	f.clock.Advance(2 * time.Second)
	if got := f.poll("inv_a"); got["PutItem"] != 1 {
		t.Errorf("a poll listing new work: %v; want the row written", got)
	}
	if w := f.worker(); len(w.Listed) != 1 || !w.LastSeenAt.Equal(f.clock.Now()) {
		t.Errorf("row after a poll listing inv_a: listed %v, last seen %v; want [inv_a] at %v", w.Listed, w.LastSeenAt, f.clock.Now())
	}

	f.clock.Advance(5 * time.Second)
	if got := f.poll("inv_a"); got["PutItem"] != 1 {
		t.Errorf("a poll a full interval after the stored one: %v; want the row written", got)
	}
	if w := f.worker(); !w.LastSeenAt.Equal(f.clock.Now()) {
		t.Errorf("last_seen_at = %v, want %v", w.LastSeenAt, f.clock.Now())
	}
}

// TestPollReadsSetupOnlyOnceGiven: a worker never given a setup command
// polls without reading its setup FIFO; once it is given one, its polls
// read the FIFO and carry the command.
func TestPollReadsSetupOnlyOnceGiven(t *testing.T) {
	f := newPollFixture(t)
	if got := f.poll(); got["Query"] != 2 {
		t.Errorf("a poll of a worker never given setup: %v; want 2 queries (held work, claim index)", got)
	}
	svc := storetest.Control(f.s)
	cmd, err := svc.AddSetup(f.ctx, f.w.ID, []string{"true"})
	if err != nil {
		t.Fatal(err)
	}
	f.count()
	p := wire.PollRequest{WorkerID: f.w.ID, Phase: wire.PhaseReady, Invocations: []string{}}.Poll()
	cmds, err := svc.Poll(f.ctx, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != 1 || cmds[0].CommandID != cmd.CommandID {
		t.Fatalf("poll after AddSetup = %+v; want setup command %s", cmds, cmd.CommandID)
	}
	if got := f.count(); got["Query"] != 2 {
		t.Errorf("a poll of a worker given setup: %v; want its FIFO and held work read (the setup blocks the claim)", got)
	}
}

// TestPollOfUncountedRowReadsSetup: a worker row stored before setup
// commands were counted (no setup_added) may hold any, so its polls read
// the FIFO.
func TestPollOfUncountedRowReadsSetup(t *testing.T) {
	f := newPollFixture(t)
	// The row as it was stored before: put again without the attribute
	// (minidyn ignores a top-level REMOVE).
	table := aws.String(f.s.Tables().Workers)
	got, err := f.s.DB().GetItem(f.ctx, &dynamodb.GetItemInput{TableName: table, ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"worker_id": &types.AttributeValueMemberS{Value: f.w.ID}}})
	if err != nil || got.Item["setup_added"] == nil {
		t.Fatalf("stored row %v, %v; want one with setup_added", got, err)
	}
	delete(got.Item, "setup_added")
	if _, err := f.s.DB().PutItem(f.ctx, &dynamodb.PutItemInput{TableName: table, Item: got.Item}); err != nil {
		t.Fatal(err)
	}
	if w := f.worker(); !w.MayHaveSetup() {
		t.Fatalf("a row without setup_added: SetupAdded %d; want it read as uncounted", w.SetupAdded)
	}
	f.count()
	if got := f.poll(); got["Query"] != 3 {
		t.Errorf("a poll of an uncounted row: %v; want 3 queries (setup FIFO, held work, claim index)", got)
	}
	f.clock.Advance(10 * time.Second)
	f.poll()
	if w := f.worker(); !w.MayHaveSetup() {
		t.Errorf("after its row was written again: SetupAdded %d; want still uncounted", w.SetupAdded)
	}
}
