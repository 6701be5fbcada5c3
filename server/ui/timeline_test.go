package ui

import (
	"strconv"
	"strings"
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
		head, _, _ := strings.Cut(b.Title, ",")
		classes[head] = b.Class
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
	if l.X1 != a1.X+a1.W || l.Y1 >= tl.Lanes[1].Y || l.Y2 < tl.Lanes[1].Y || l.X2 <= l.X1 {
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

// TestTimelineSeparatesBackToBack: attempts one worker ran back to back
// (each claimed as the last ended) are bars of one row with a visible gap
// between them, not one long bar.
func TestTimelineSeparatesBackToBack(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	at := func(s int) *time.Time { v := now.Add(time.Duration(s) * time.Second); return &v }
	var invs []wire.Invocation
	for i := range 3 {
		from := -600 + 200*i
		invs = append(invs, wire.Invocation{InvocationID: "inv_" + strconv.Itoa(i), Attempts: []wire.Attempt{
			{Attempt: 1, WorkerID: "wrk_a", ClaimedAt: *at(from), EndedAt: at(from + 200), Outcome: "succeeded"}}})
	}
	tl := layoutTimeline(invs, nil, now, 15*time.Minute)
	if len(tl.Bars) != 3 || len(tl.Lanes) != 1 || tl.Lanes[0].H != tlRowH {
		t.Fatalf("bars %+v lanes %+v: want three bars in one row", tl.Bars, tl.Lanes)
	}
	for i := 1; i < len(tl.Bars); i++ {
		prev, b := tl.Bars[i-1], tl.Bars[i]
		if gap := b.X - (prev.X + prev.W); gap < tlBarGap || b.Y != prev.Y {
			t.Errorf("bars %d and %d: gap %d units (want at least %d) in one row: %+v %+v", i-1, i, gap, tlBarGap, prev, b)
		}
	}
}

// TestTimelineBarTitles: hovering a bar shows the attempt's start and end
// in UTC, whatever the zone of the times it was given.
func TestTimelineBarTitles(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	zone := time.FixedZone("X", 5*3600)
	claimed, ended := now.Add(-90*time.Second).In(zone), now.Add(-30*time.Second).In(zone)
	invs := []wire.Invocation{
		{InvocationID: "inv_done", Attempts: []wire.Attempt{{Attempt: 2, WorkerID: "wrk_a", ClaimedAt: claimed, EndedAt: &ended, Outcome: "failed"}}},
		{InvocationID: "inv_run", Attempts: []wire.Attempt{{Attempt: 1, WorkerID: "wrk_a", ClaimedAt: claimed}}},
	}
	tl := layoutTimeline(invs, nil, now, 15*time.Minute)
	want := map[string]string{
		"inv_done": "inv_done attempt 2: failed, 2026-12-02 11:58:30Z – 2026-12-02 11:59:30Z (1 min)",
		"inv_run":  "inv_run attempt 1: running, 2026-12-02 11:58:30Z – running",
	}
	for _, b := range tl.Bars {
		if b.Title != want[b.InvocationID] {
			t.Errorf("bar of %s: title %q, want %q", b.InvocationID, b.Title, want[b.InvocationID])
		}
	}
}

// TestTimelineAxisFitsActivity: 25 s of activity spans about 25 s of the
// axis (its ticks within it), not a minute.
func TestTimelineAxisFitsActivity(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	claimed, ended := now.Add(-25*time.Second), now.Add(-2*time.Second)
	invs := []wire.Invocation{{InvocationID: "inv_a", Attempts: []wire.Attempt{{Attempt: 1, WorkerID: "wrk_a", ClaimedAt: claimed, EndedAt: &ended, Outcome: "succeeded"}}}}
	tl := layoutTimeline(invs, nil, now, 15*time.Minute)
	if tl.Span != "26 s" {
		t.Errorf("span %q, want 26 s (25 s of activity and a margin)", tl.Span)
	}
	for _, tk := range tl.Ticks {
		if tk.Label == "-60 s" || tk.Label == "-30 s" {
			t.Errorf("tick %q on an axis of 25 s of activity: %+v", tk.Label, tl.Ticks)
		}
	}
	if b := tl.Bars[0]; b.X > tlLabelW+tlPlotW/10 {
		t.Errorf("the bar starts at x=%d: the activity does not fill the axis (plot from %d)", b.X, tlLabelW)
	}
}

// TestTimelineBarsStayAtTheirTime: many short attempts back to back in
// one row each start where their time puts them, so none is pushed past
// the axis's now (a gap taken from each bar's start would add up).
func TestTimelineBarsStayAtTheirTime(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	var invs []wire.Invocation
	for i := range 250 {
		from, to := now.Add(time.Duration(-2510+10*i)*time.Second), now.Add(time.Duration(-2500+10*i)*time.Second)
		invs = append(invs, wire.Invocation{InvocationID: "inv_" + strconv.Itoa(i), Attempts: []wire.Attempt{
			{Attempt: 1, WorkerID: "wrk_a", ClaimedAt: from, EndedAt: &to, Outcome: "succeeded"}}})
	}
	tl := layoutTimeline(invs, nil, now, 2*time.Hour)
	for _, b := range tl.Bars {
		if b.X+b.W > tl.NowX {
			t.Fatalf("bar %s ends at %d, past now at %d", b.InvocationID, b.X+b.W, tl.NowX)
		}
	}
}
