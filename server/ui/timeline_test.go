package ui

import (
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestLayoutTimeline: a lane per worker the attempts ran on (labelled,
// sorted), a bar per attempt coloured by how it ended, overlapping
// attempts of one worker stacked, and a line from a handed-back attempt to
// the invocation's next attempt on another lane; old attempts left out.
func TestLayoutTimeline(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	at := func(s int) *time.Time { v := now.Add(time.Duration(s) * time.Second); return &v }
	workers := []wire.Worker{{WorkerID: "wrk_b", Label: "b\x1b[0m", State: "active"}, {WorkerID: "wrk_a", Label: "a", State: "stale"}}
	invs := []wire.Invocation{
		{InvocationID: "inv_1", Attempts: []wire.Attempt{
			{Attempt: 1, WorkerID: "wrk_a", ClaimedAt: *at(-120), EndedAt: at(-60), Outcome: "stale"},
			{Attempt: 2, WorkerID: "wrk_b", ClaimedAt: *at(-50)},
		}},
		{InvocationID: "inv_2", Attempts: []wire.Attempt{{Attempt: 1, WorkerID: "wrk_b", ClaimedAt: *at(-55), EndedAt: at(-10), Outcome: "succeeded", Recorded: true}}},
		{InvocationID: "inv_old", Attempts: []wire.Attempt{{Attempt: 1, WorkerID: "wrk_c", ClaimedAt: *at(-7200), EndedAt: at(-7100), Outcome: "failed"}}},
	}
	tl := layoutTimeline(invs, workers, now, 15*time.Minute)
	if len(tl.Lanes) != 2 || tl.Lanes[0].Label != "a" || tl.Lanes[1].Label != `b\x1b[0m` || tl.Lanes[0].State != "stale" {
		t.Fatalf("lanes %+v: want a (stale) then b, the escape shown escaped, no lane for the old attempt's worker", tl.Lanes)
	}
	classes := map[string]string{}
	for _, b := range tl.Bars {
		classes[b.Title] = b.Class
	}
	want := map[string]string{"inv_1 attempt 1: stale": "handed-back", "inv_1 attempt 2: running": "running", "inv_2 attempt 1: succeeded": "succeeded"}
	if len(classes) != len(want) {
		t.Fatalf("bars %+v", tl.Bars)
	}
	for k, v := range want {
		if classes[k] != v {
			t.Errorf("bar %q: class %q, want %q", k, classes[k], v)
		}
	}
	if tl.Lanes[1].H != 2*tlRowH {
		t.Errorf("b's two overlapping attempts: lane height %d, want two rows (%d)", tl.Lanes[1].H, 2*tlRowH)
	}
	if len(tl.Links) != 1 {
		t.Fatalf("links %+v: want one hand-off", tl.Links)
	}
	l, a1 := tl.Links[0], tl.Bars[0]
	if l.X1 != a1.X+a1.W+1 || l.Y1 >= tl.Lanes[1].Y || l.Y2 < tl.Lanes[1].Y || l.X2 <= l.X1 {
		t.Errorf("the hand-off %+v does not run from a's bar end (%+v) to b's lane", l, a1)
	}
	// The axis fits the activity (about two minutes), not the 15 asked for.
	if tl.Span != "2 min" || tl.Minutes != 15 || tl.Ticks[0].Label != "now" || tl.Ticks[0].X != tl.NowX {
		t.Errorf("axis: span %q, minutes %d, ticks %+v", tl.Span, tl.Minutes, tl.Ticks)
	}
	if empty := layoutTimeline(nil, workers, now, 15*time.Minute); !empty.Empty {
		t.Error("no attempts: not Empty")
	}
}
