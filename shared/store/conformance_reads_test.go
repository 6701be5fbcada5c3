package store_test

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/dreamlake/lakeshore/shared/store"
	"github.com/dreamlake/lakeshore/shared/store/storetest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// readCases are the store's operator reads whose cost must follow live
// work, not history, run on every backend like conformanceCases.
var readCases = []conformanceCase{
	{"queue stats/cost independent of history", testQueueStatsCost},
}

// TestConformanceReads runs every read case on every backend, each case on
// tables of its own.
func TestConformanceReads(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			db := b.client(t)
			for _, c := range readCases {
				t.Run(c.name, func(t *testing.T) {
					c.run(t, newFixture(t, b, db))
				})
			}
		})
	}
}

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
		want := map[string]int{wire.StateQueued: 2, wire.StateRunning: 1, wire.StateSucceeded: 0, wire.StateFailed: 0,
			wire.StateCancelled: finished}
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
