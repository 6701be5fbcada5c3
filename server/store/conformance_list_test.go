package store_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The conformance cases of operator reads: invocation and worker lists,
// queue stats and the gauges, run on every backend.
func init() {
	conformanceCases = append(conformanceCases,
		conformanceCase{"list invocations/by queue", testListByQueue},
		conformanceCase{"list invocations/by queue and state", testListByQueueState},
		conformanceCase{"list invocations/all", testListAll},
		conformanceCase{"list workers/paging", testListWorkers},
		conformanceCase{"queue stats", testQueueStats},
		conformanceCase{"gauges/queues, depth, oldest queued, workers by state", testGauges},
	)
}

// testGauges: what the metrics read of the store: every queue that had
// work (noted at its first submit, before any outcome), its counts, its
// oldest queued invocation's age, and workers by the state they read.
func testGauges(t *testing.T, f *fixture) {
	first := f.submit(submitReq())
	f.clock.Advance(30 * time.Second)
	f.submit(submitReq())
	other := submitReq()
	other.Queue = "other"
	f.submit(other)
	f.worker("m-a", "")
	g, err := f.svc.Gauges(f.ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Queues) != 2 || g.Queues[0].Queue != "other" || g.Queues[1].Queue != "q" {
		t.Fatalf("queues %+v, want other and q", g.Queues)
	}
	q := g.Queues[1]
	if q.Counts[domain.StateQueued] != 2 || q.OldestQueuedAge != f.clock.Now().Sub(first.CreatedAt) {
		t.Fatalf("q: %d queued, oldest %s; want 2, %s", q.Counts[domain.StateQueued], q.OldestQueuedAge, f.clock.Now().Sub(first.CreatedAt))
	}
	if g.Workers["active"]+g.Workers["joining"]+g.Workers["pending"] != 1 {
		t.Fatalf("workers by state %v, want the one", g.Workers)
	}
	f.clock.Advance(2 * time.Minute)
	if g, _ = f.svc.Gauges(f.ctx, time.Hour); g.Workers["stale"] != 1 {
		t.Fatalf("workers by state %v after two silent minutes, want 1 stale", g.Workers)
	}
}

// listAll pages through ListInvocations with limit and returns every id,
// in the order the pages gave them, and the number of pages.
func (f *fixture) listAll(queue string, state domain.InvocationState, limit int) (got []string, pages int) {
	f.t.Helper()
	cursor := ""
	for pages = 1; pages <= 50; pages++ {
		invs, next, err := f.s.ListInvocations(f.ctx, queue, state, limit, cursor)
		if err != nil {
			f.t.Fatalf("ListInvocations(%q, %q, %d, page %d): %v", queue, state, limit, pages, err)
		}
		if len(invs) > limit {
			f.t.Fatalf("page of %d with limit %d", len(invs), limit)
		}
		for _, inv := range invs {
			if (queue != "" && inv.Queue != queue) || (state != "" && inv.State != state) {
				f.t.Fatalf("ListInvocations(%q, %q) returned %s in %s/%s", queue, state, inv.ID, inv.Queue, inv.State)
			}
			got = append(got, inv.ID)
		}
		if next == "" {
			return got, pages
		}
		cursor = next
	}
	f.t.Fatalf("ListInvocations(%q, %q): more than 50 pages", queue, state)
	return nil, 0
}

func sortedIDs(invs []domain.Invocation) []string {
	out := invIDs(invs)
	slices.Sort(out)
	return out
}

func testListByQueue(t *testing.T, f *fixture) {
	a := f.submitN("a", 5)
	f.submitN("b", 2)
	got, pages := f.listAll("a", "", 2)
	// The queue index is ordered by id: oldest first, newest last.
	if !slices.Equal(got, invIDs(a)) {
		t.Fatalf("queue a listed %v, want %v", got, invIDs(a))
	}
	if pages < 3 {
		t.Fatalf("5 items with limit 2 came in %d pages", pages)
	}
	if got, _ := f.listAll("nothing", "", 2); len(got) != 0 {
		t.Fatalf("empty queue listed %v", got)
	}
	_, _, err := f.s.ListInvocations(f.ctx, "a", "", 2, "not a cursor!")
	wantCode(t, err, wire.ErrInvalid)
	// A cursor is good only for the listing that returned it: given to
	// another, DynamoDB would refuse it as a start key (a 5xx); it is a 400.
	_, queueCursor, err := f.s.ListInvocations(f.ctx, "a", "", 2, "")
	if err != nil || queueCursor == "" {
		t.Fatalf("first page: cursor %q, %v", queueCursor, err)
	}
	_, scanCursor, err := f.s.ListInvocations(f.ctx, "", "", 2, "")
	if err != nil || scanCursor == "" {
		t.Fatalf("first scan page: cursor %q, %v", scanCursor, err)
	}
	for _, c := range []struct {
		queue  string
		state  domain.InvocationState
		cursor string
	}{
		{"b", "", queueCursor},
		{"a", domain.StateQueued, queueCursor},
		{"", "", queueCursor},
		{"a", "", scanCursor},
	} {
		_, _, err := f.s.ListInvocations(f.ctx, c.queue, c.state, 2, c.cursor)
		wantCode(t, err, wire.ErrInvalid)
	}
	_, _, err = f.s.ListWorkers(f.ctx, 2, queueCursor)
	wantCode(t, err, wire.ErrInvalid)
}

func testListByQueueState(t *testing.T, f *fixture) {
	a := f.submitN("a", 5)
	f.submitN("b", 1)
	w := f.worker("m1", "")
	res := f.claim(w, "a", 2)
	if len(res.Claimed) != 2 {
		t.Fatalf("claimed %d, want 2", len(res.Claimed))
	}
	running := sortedIDs(res.Claimed)
	var queued []string
	for _, inv := range a {
		if !slices.Contains(running, inv.ID) {
			queued = append(queued, inv.ID)
		}
	}
	if got, _ := f.listAll("a", domain.StateRunning, 1); !slices.Equal(got, running) {
		t.Fatalf("a/running = %v, want %v", got, running)
	}
	if got, _ := f.listAll("a", domain.StateQueued, 2); !slices.Equal(got, queued) {
		t.Fatalf("a/queued = %v, want %v", got, queued)
	}
	if got, _ := f.listAll("a", domain.StateSucceeded, 2); len(got) != 0 {
		t.Fatalf("a/succeeded = %v", got)
	}
}

func testListAll(t *testing.T, f *fixture) {
	subs := append(f.submitN("a", 4), f.submitN("b", 3)...)
	w := f.worker("m1", "")
	res := f.claim(w, "b", 2)
	got, _ := f.listAll("", "", 3)
	slices.Sort(got)
	if !slices.Equal(got, sortedIDs(subs)) {
		t.Fatalf("all invocations = %v, want %v", got, sortedIDs(subs))
	}
	// A state filter without a queue scans: pages may be short or empty.
	running, _ := f.listAll("", domain.StateRunning, 3)
	slices.Sort(running)
	if !slices.Equal(running, sortedIDs(res.Claimed)) {
		t.Fatalf("running = %v, want %v", running, sortedIDs(res.Claimed))
	}
}

func testListWorkers(t *testing.T, f *fixture) {
	var want []string
	for i := range 5 {
		want = append(want, f.hello(helloReq(fmt.Sprintf("m%d", i), "boot-1")).Worker.ID)
	}
	slices.Sort(want)
	var got []string
	cursor := ""
	for page := 0; ; page++ {
		if page > 20 {
			t.Fatal("ListWorkers: more than 20 pages")
		}
		ws, next, err := f.s.ListWorkers(f.ctx, 2, cursor)
		if err != nil {
			t.Fatalf("ListWorkers: %v", err)
		}
		if len(ws) > 2 {
			t.Fatalf("page of %d with limit 2", len(ws))
		}
		for _, w := range ws {
			got = append(got, w.ID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("ListWorkers = %v, want %v (each once)", got, want)
	}
	_, _, err := f.s.ListWorkers(f.ctx, 2, "bm90IGpzb24")
	wantCode(t, err, wire.ErrInvalid)
}

func testQueueStats(t *testing.T, f *fixture) {
	subs := f.submitN("q", 5)
	f.submitN("other", 1)
	w := f.worker("m1", "")
	res := f.claim(w, "q", 3)
	if len(res.Claimed) != 3 {
		t.Fatalf("claimed %d, want 3", len(res.Claimed))
	}
	f.mustAck(w, res.Claimed[0], 1, domain.StateSucceeded, true)
	f.mustAck(w, res.Claimed[1], 1, domain.StateFailed, true)
	for _, inv := range subs {
		if !slices.Contains(invIDs(res.Claimed), inv.ID) {
			if _, err := f.s.Cancel(f.ctx, inv.ID); err != nil {
				t.Fatalf("Cancel: %v", err)
			}
			break
		}
	}
	f.wantStats("q", map[domain.InvocationState]int{
		domain.StateQueued: 1, domain.StateRunning: 1, domain.StateSucceeded: 1, domain.StateFailed: 1, domain.StateCancelled: 1,
	}, 3)
	f.wantStats("other", map[domain.InvocationState]int{domain.StateQueued: 1}, 0)
	st := f.stats("never-used")
	if st.Queue != "never-used" || st.DoneCount != 0 || len(st.Counts) != len(wire.InvocationStates) {
		t.Fatalf("stats of an unused queue: %+v, want every state at 0", st)
	}
}
