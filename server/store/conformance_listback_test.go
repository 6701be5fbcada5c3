package store_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/domain"
)

func init() {
	conformanceCases = append(conformanceCases,
		conformanceCase{"list invocations/back a page", testListBack},
		conformanceCase{"list invocations/by id prefix", testListByPrefix},
	)
}

// pages reads q page by page and returns each page's ids (empty pages
// left out), checking that each holds at most its limit, of its queue and
// state.
func (f *fixture) pages(q store.ListQuery) [][]string {
	f.t.Helper()
	var out [][]string
	for range 50 {
		invs, next, err := f.s.List(f.ctx, q)
		if err != nil {
			f.t.Fatalf("List(%+v): %v", q, err)
		}
		if len(invs) > q.Limit {
			f.t.Fatalf("page of %d with limit %d", len(invs), q.Limit)
		}
		var page []string
		for _, inv := range invs {
			if (q.Queue != "" && inv.Queue != q.Queue) || (q.State != "" && inv.State != q.State) {
				f.t.Fatalf("List(%+v) returned %s in %s/%s", q, inv.ID, inv.Queue, inv.State)
			}
			page = append(page, inv.ID)
		}
		if len(page) > 0 {
			out = append(out, page)
		}
		if next == "" {
			return out
		}
		q.Cursor = next
	}
	f.t.Fatalf("List(%+v): more than 50 pages", q)
	return nil
}

// testListBack: on every ordered listing (across queues, of a queue, of a
// queue's state), CursorAt a page's first id, read in the other order,
// gives the page before it, nearest first.
func testListBack(t *testing.T, f *fixture) {
	f.submitN("a", 5)
	f.submitN("b", 3)
	for _, q := range []store.ListQuery{
		{Order: store.OrderNewest, Limit: 2},
		{State: domain.StateQueued, Order: store.OrderNewest, Limit: 2},
		{Queue: "a", Order: store.OrderNewest, Limit: 2},
		{Queue: "a", State: domain.StateQueued, Order: store.OrderNewest, Limit: 2},
		{Queue: "a", Limit: 2},
	} {
		pages := f.pages(q)
		if len(pages) < 2 {
			t.Fatalf("%+v: %d pages", q, len(pages))
		}
		for k := 1; k < len(pages); k++ {
			back := q
			back.Order = store.OrderOldest
			if q.Order == store.OrderOldest || q.Order == "" {
				back.Order = store.OrderNewest
			}
			back.Cursor = store.CursorAt(q, pages[k][0])
			invs, _, err := f.s.List(f.ctx, back)
			if err != nil {
				t.Fatalf("%+v: back from page %d: %v", q, k, err)
			}
			var got []string
			for _, inv := range invs {
				got = append(got, inv.ID)
			}
			slices.Reverse(got)
			if !slices.Equal(got, pages[k-1]) {
				t.Errorf("%+v: back from page %d %v: %v, want %v", q, k, pages[k], got, pages[k-1])
			}
		}
	}
	if c := store.CursorAt(store.ListQuery{Limit: 2}, "inv_x"); c != "" {
		t.Errorf("a table scan has no way back; CursorAt = %q", c)
	}
}

// testListByPrefix: an id prefix keeps the ids that start with it, on
// every listing, paged, in order; one that no id starts with lists none.
func testListByPrefix(t *testing.T, f *fixture) {
	subs := append(f.submitN("a", 6), f.submitN("b", 6)...)
	var all []string
	for _, inv := range subs {
		all = append(all, inv.ID)
	}
	slices.Sort(all)
	for _, n := range []int{len("inv_") + 10, len("inv_") + 9, len("inv_") + 26} {
		prefix := all[5][:n]
		want := slices.DeleteFunc(slices.Clone(all), func(id string) bool { return !strings.HasPrefix(id, prefix) })
		for _, q := range []store.ListQuery{
			{IDPrefix: prefix, Limit: 2},
			{IDPrefix: prefix, Order: store.OrderNewest, Limit: 2},
			{IDPrefix: prefix, State: domain.StateQueued, Order: store.OrderNewest, Limit: 2},
			{IDPrefix: prefix, Queue: "a", Order: store.OrderOldest, Limit: 2},
		} {
			wantQ := want
			if q.Queue != "" {
				wantQ = slices.DeleteFunc(slices.Clone(want), func(id string) bool { return !isIn(subs[:6], id) })
			}
			got := slices.Concat(f.pages(q)...)
			if q.Order == store.OrderNewest {
				slices.Reverse(got)
			}
			if !slices.Equal(got, wantQ) || len(wantQ) == 0 {
				t.Errorf("%+v: %v, want %v", q, got, wantQ)
			}
		}
	}
	if got := f.pages(store.ListQuery{IDPrefix: "inv_ZZ", Order: store.OrderNewest, Limit: 2}); len(got) != 0 {
		t.Errorf("prefix inv_ZZ: %v, want none", got)
	}
	// A queue's cursor outside the prefix asked for (a bookmark edited):
	// invalid, not DynamoDB's ValidationException.
	other := store.CursorAt(store.ListQuery{Queue: "a"}, all[0])
	if _, _, err := f.s.List(f.ctx, store.ListQuery{Queue: "a", IDPrefix: "inv_ZZ", Limit: 2, Cursor: other}); domain.KindOf(err) != domain.KindInvalid {
		t.Errorf("a cursor outside the prefix: %v, want invalid", err)
	}
}

func isIn(invs []domain.Invocation, id string) bool {
	return slices.ContainsFunc(invs, func(inv domain.Invocation) bool { return inv.ID == id })
}
