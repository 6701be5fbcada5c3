package store_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// readCases are the store's operator reads whose cost must follow live
// work, not history, run on every backend like conformanceCases.
var readCases = []conformanceCase{
	{"queue stats/cost independent of history", testQueueStatsCost},
	{"list invocations/ordered across queues", testListAcrossQueues},
	{"list invocations/live work past history", testListLivePastHistory},
	{"logs/tail", testLogsTail},
}

// TestConformanceReads runs every read case on every backend, each case on
// tables of its own.
func TestConformanceReads(t *testing.T) { runCases(t, readCases) }

// counted is f's store over a client that counts requests and items read.
func (f *fixture) counted() (s *store.Store, requests, items *storetest.Counter) {
	requests, items = &storetest.Counter{}, &storetest.Counter{}
	db := dynamodb.New(f.db.Options(), storetest.CountRequests(requests), storetest.CountItemsRead(items))
	return store.New(db, prefixOf(f.s)), requests, items
}

// finishN submits n invocations to queue and cancels each while queued:
// the quickest way to a terminal, counted invocation.
func (f *fixture) finishN(queue string, n int) {
	f.t.Helper()
	for _, inv := range f.submitN(queue, n) {
		if _, err := f.s.Cancel(f.ctx, inv.ID); err != nil {
			f.t.Fatalf("Cancel(%s): %v", inv.ID, err)
		}
	}
}

// testQueueStatsCost: QueueStats reads as many items and sends as many
// requests with 1,000 finished invocations as with 10 (100 on moto, whose
// writes are slow), and still counts every state right.
func testQueueStatsCost(t *testing.T, f *fixture) {
	history := 1000
	if f.backend.name == "moto" {
		history = 100
	}
	counted, requests, items := f.counted()
	f.submitN("q", 3)
	f.claim(f.worker("m1", ""), "q", 1)
	cost := func(finished int) (reqs, read int) {
		t.Helper()
		requests.Reset()
		items.Reset()
		st, err := counted.QueueStats(f.ctx, "q")
		if err != nil {
			t.Fatalf("QueueStats: %v", err)
		}
		want := map[domain.InvocationState]int{domain.StateQueued: 2, domain.StateRunning: 1, domain.StateSucceeded: 0, domain.StateFailed: 0,
			domain.StateCancelled: finished}
		for state, n := range want {
			if st.Counts[state] != n {
				t.Fatalf("with %d finished: counts %v, want %v", finished, st.Counts, want)
			}
		}
		if st.DoneCount != finished || len(st.Counts) != len(wire.InvocationStates) {
			t.Fatalf("with %d finished: %+v, want done_count %d and every state", finished, st, finished)
		}
		return requests.Total(), items.Total()
	}
	f.finishN("q", 10)
	reqs10, read10 := cost(10)
	f.finishN("q", history-10)
	reqsMany, readMany := cost(history)
	t.Logf("QueueStats: %d requests, %d items read with 10 finished; %d, %d with %d", reqs10, read10, reqsMany, readMany, history)
	if reqsMany > reqs10 || readMany > read10 {
		t.Fatalf("QueueStats grows with history: %d requests and %d items read with 10 finished, %d and %d with %d",
			reqs10, read10, reqsMany, readMany, history)
	}
	if read10 > 3 {
		t.Fatalf("QueueStats read %d items; the live work is 3", read10)
	}
}

// listQuery pages through q with its limit and returns every id in the
// order the pages gave them.
func (f *fixture) listQuery(q store.ListQuery) []string {
	f.t.Helper()
	return slices.Concat(f.pages(q)...)
}

// testListAcrossQueues: without a queue, an ordered listing merges every
// queue's invocations by id, oldest or newest first, a state filter
// included, paging each once; a queue's listing orders newest first too.
func testListAcrossQueues(t *testing.T, f *fixture) {
	var all []string
	for i := range 4 {
		all = append(all, invIDs(f.submitN("a", 1+i%2))...)
		all = append(all, invIDs(f.submitN("b", 1))...)
	}
	newest := slices.Clone(all)
	slices.Reverse(newest)
	for _, limit := range []int{1, 3, 100} {
		if got := f.listQuery(store.ListQuery{Order: wire.OrderNewest, Limit: limit}); !slices.Equal(got, newest) {
			t.Fatalf("newest first, limit %d: %v, want %v", limit, got, newest)
		}
		if got := f.listQuery(store.ListQuery{Order: wire.OrderOldest, Limit: limit}); !slices.Equal(got, all) {
			t.Fatalf("oldest first, limit %d: %v, want %v", limit, got, all)
		}
	}
	var a []string
	for _, id := range all {
		if f.get(id).Queue == "a" {
			a = append(a, id)
		}
	}
	slices.Reverse(a)
	if got := f.listQuery(store.ListQuery{Queue: "a", Order: wire.OrderNewest, Limit: 2}); !slices.Equal(got, a) {
		t.Fatalf("queue a newest first: %v, want %v", got, a)
	}
	// A cursor of one listing is refused by another (400, not a 5xx).
	_, across, err := f.s.List(f.ctx, store.ListQuery{State: domain.StateQueued, Limit: 1})
	if err != nil || across == "" {
		t.Fatalf("first page across queues: cursor %q, %v", across, err)
	}
	_, scan, err := f.s.List(f.ctx, store.ListQuery{Limit: 1})
	if err != nil || scan == "" {
		t.Fatalf("first scan page: cursor %q, %v", scan, err)
	}
	for _, q := range []store.ListQuery{
		{State: domain.StateQueued, Limit: 1, Cursor: scan},
		{Limit: 1, Cursor: across},
		{Queue: "a", Limit: 1, Cursor: across},
		{Order: wire.OrderNewest, Limit: 1, Cursor: "not a cursor!"},
	} {
		_, _, err := f.s.List(f.ctx, q)
		wantCode(t, err, wire.ErrInvalid)
	}
}

// testListLivePastHistory: the running and queued invocations of every
// queue are listed in their first page, whatever the number of finished
// ones around them.
func testListLivePastHistory(t *testing.T, f *fixture) {
	first := f.submitN("slow", 1)[0]
	f.finishN("q", 30)
	running := f.submitN("q", 1)[0]
	f.claimOne(f.worker("m1", ""), running)
	last := f.submitN("q", 1)[0]
	f.finishN("q", 30)
	for state, want := range map[domain.InvocationState][]string{
		domain.StateQueued:  {first.ID, last.ID},
		domain.StateRunning: {running.ID},
	} {
		invs, next, err := f.s.ListInvocations(f.ctx, "", state, 5, "")
		if err != nil || next != "" || !slices.Equal(invIDs(invs), want) {
			t.Fatalf("%s: %v (next %q), %v; want %v in one page", state, invIDs(invs), next, err, want)
		}
	}
}

// testLogsTail: LogsTail reads an attempt's last chunks in order, of that
// attempt only, leaving out expired ones.
func testLogsTail(t *testing.T, f *fixture) {
	at := f.clock.Now()
	var chunks []domain.LogChunk
	for seq := range 40 {
		chunks = append(chunks, domain.LogChunk{Seq: seq, Stream: domain.LogStdout, Data: fmt.Appendf(nil, "line %d\n", seq), At: at})
	}
	if err := f.s.PutLogs(f.ctx, "inv_a", 1, chunks); err != nil {
		t.Fatal(err)
	}
	if err := f.s.PutLogs(f.ctx, "inv_a", 2, chunks[:2]); err != nil {
		t.Fatal(err)
	}
	seqs := func(attempt, n int) (out []string) {
		t.Helper()
		got, err := f.s.LogsTail(f.ctx, "inv_a", attempt, n)
		if err != nil {
			t.Fatalf("LogsTail(%d, %d): %v", attempt, n, err)
		}
		for _, c := range got {
			out = append(out, string(c.Data))
		}
		return out
	}
	if got, want := seqs(1, 3), []string{"line 37\n", "line 38\n", "line 39\n"}; !slices.Equal(got, want) {
		t.Fatalf("tail 3 of attempt 1: %q, want %q", got, want)
	}
	if got, want := seqs(2, 64), []string{"line 0\n", "line 1\n"}; !slices.Equal(got, want) {
		t.Fatalf("tail 64 of attempt 2: %q, want %q", got, want)
	}
	if got := seqs(3, 5); len(got) != 0 {
		t.Fatalf("tail of an attempt with no output: %q", got)
	}
	f.clock.Advance(f.s.LogTTL + time.Minute)
	if got := seqs(1, 3); len(got) != 0 {
		t.Fatalf("tail of expired output: %q", got)
	}
}
