package ui

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The timeline: for the last window, one lane per worker, one bar per
// attempt, coloured by how it ended, and a line joining a handed-back
// attempt to the next attempt of the same invocation on whatever lane it
// ran: a worker's death and the hand-off of its work are seen at a glance.

// Timeline geometry, in SVG user units.
const (
	tlLabelW  = 170 // the lane labels' column
	tlPlotW   = 760 // the time axis
	tlRowH    = 14  // one bar's row
	tlLaneGap = 8
	tlAxisH   = 22
	// tlBarGap is the least space between two bars of one row: attempts
	// back to back (one ends as the next is claimed) read as two bars.
	tlBarGap = 3
)

// tlMinSpan is the least the axis spans: a few seconds of activity fill
// the width rather than a corner of a minute.
const tlMinSpan = 10 * time.Second

type timeline struct {
	Width, Height int
	Minutes       int    // the window asked for
	Span          string // what the axis spans ("4 min")
	Lanes         []lane
	Bars          []bar
	Links         []link
	Ticks         []tick
	NowX          int
	Empty         bool
}

type lane struct {
	Y, H     int
	Label    string
	WorkerID string
	State    string
}

type bar struct {
	X, Y, W, H   int
	Class        string // how the attempt ended (a CSS class)
	Title        string
	InvocationID string
}

type link struct{ X1, Y1, X2, Y2 int }

type tick struct {
	X     int
	Label string
}

// barClass names the colour of an attempt by its outcome.
func barClass(a wire.Attempt) string {
	switch a.Outcome {
	case "":
		return "running"
	case wire.StateSucceeded, wire.StateFailed, wire.StateCancelled:
		return a.Outcome
	case string(domain.EndSuperseded):
		return "superseded"
	default: // stale, gone, bye, omitted, undelivered, requeued: taken back and handed on
		return "handed-back"
	}
}

// layoutTimeline lays out the attempts of invs over [now-window, now], a
// lane per worker they ran on (labelled from workers where known).
//
// The axis starts at the earliest attempt shown (a little before it), so
// a few seconds or minutes of activity fill the width; it never spans
// less than tlMinSpan or more than window. A bar's title holds the
// attempt's UTC start and end; attempts back to back in one row keep
// tlBarGap between their bars.
func layoutTimeline(invs []wire.Invocation, workers []wire.Worker, now time.Time, window time.Duration) timeline {
	minutes := int(window / time.Minute) // what was asked for (?minutes=)
	start := now.Add(-window)
	first := now
	for _, inv := range invs {
		for _, a := range inv.Attempts {
			if (a.EndedAt == nil || a.EndedAt.After(start)) && a.ClaimedAt.Before(first) {
				first = a.ClaimedAt
			}
		}
	}
	if fit := now.Sub(first) * 21 / 20; fit < window {
		window = max(fit, tlMinSpan)
		start = now.Add(-window)
	}
	x := func(t time.Time) int {
		if t.Before(start) {
			t = start
		}
		if t.After(now) {
			t = now
		}
		return tlLabelW + int(float64(tlPlotW)*float64(t.Sub(start))/float64(window))
	}
	known := map[string]wire.Worker{}
	for _, w := range workers {
		known[w.WorkerID] = w
	}
	type span struct {
		inv      *wire.Invocation
		a        wire.Attempt
		from, to time.Time
	}
	byWorker := map[string][]span{}
	for i := range invs {
		inv := &invs[i]
		for _, a := range inv.Attempts {
			to := now
			if a.EndedAt != nil {
				to = *a.EndedAt
			}
			if to.Before(start) || a.WorkerID == "" {
				continue
			}
			byWorker[a.WorkerID] = append(byWorker[a.WorkerID], span{inv, a, a.ClaimedAt, to})
		}
	}
	ids := make([]string, 0, len(byWorker))
	for id := range byWorker {
		ids = append(ids, id)
	}
	label := func(id string) string { return printable(cmp.Or(known[id].Label, known[id].MachineID, id)) }
	slices.SortFunc(ids, func(a, b string) int { return cmp.Or(cmp.Compare(label(a), label(b)), cmp.Compare(a, b)) })

	tl := timeline{Width: tlLabelW + tlPlotW + 10, Minutes: minutes, Span: shortAge(window), NowX: x(now), Empty: len(ids) == 0}
	where := map[string]int{} // "invocation/attempt" → its bar's index
	y := tlAxisH
	for _, id := range ids {
		spans := byWorker[id]
		slices.SortFunc(spans, func(a, b span) int { return a.from.Compare(b.from) })
		// Each row's last bar and when its attempt ended: attempts that
		// overlap in time stack in rows.
		type rowEnd struct {
			bar int
			at  time.Time
		}
		var rows []rowEnd
		for _, s := range spans {
			x1, x2 := x(s.from), max(x(s.to), x(s.from)+2)
			row := slices.IndexFunc(rows, func(r rowEnd) bool { return !r.at.After(s.from) })
			if row < 0 {
				row = len(rows)
				rows = append(rows, rowEnd{})
			} else if last := &tl.Bars[rows[row].bar]; last.X+last.W+tlBarGap > x1 {
				// Back to back with the row's last bar: that one gives up
				// its end to the gap (as much as it can); this one stays
				// at its own time.
				last.W = max(x1-tlBarGap-last.X, 1)
			}
			rows[row] = rowEnd{bar: len(tl.Bars), at: s.to}
			where[fmt.Sprintf("%s/%d", s.inv.InvocationID, s.a.Attempt)] = len(tl.Bars)
			tl.Bars = append(tl.Bars, bar{X: x1, Y: y + row*tlRowH + 1, W: x2 - x1, H: tlRowH - 2, Class: barClass(s.a),
				InvocationID: s.inv.InvocationID, Title: barTitle(s.inv.InvocationID, s.a, s.from, s.a.EndedAt)})
		}
		h := max(len(rows), 1) * tlRowH
		tl.Lanes = append(tl.Lanes, lane{Y: y, H: h, Label: label(id), WorkerID: id, State: known[id].State})
		y += h + tlLaneGap
	}
	// Join each attempt to the invocation's next one, wherever it ran.
	for _, inv := range invs {
		for i := 0; i+1 < len(inv.Attempts); i++ {
			from, ok1 := where[fmt.Sprintf("%s/%d", inv.InvocationID, inv.Attempts[i].Attempt)]
			to, ok2 := where[fmt.Sprintf("%s/%d", inv.InvocationID, inv.Attempts[i+1].Attempt)]
			if ok1 && ok2 {
				a, b := tl.Bars[from], tl.Bars[to]
				tl.Links = append(tl.Links, link{a.X + a.W, a.Y + tlRowH/2 - 1, b.X, b.Y + tlRowH/2 - 1})
			}
		}
	}
	step := tickStep(window)
	tl.Ticks = append(tl.Ticks, tick{X: x(now), Label: "now"})
	for t := now.Add(-step); !t.Before(start); t = t.Add(-step) {
		tl.Ticks = append(tl.Ticks, tick{X: x(t), Label: tickLabel(now.Sub(t))})
	}
	tl.Height = y + 4
	return tl
}

// barTitle is what hovering an attempt's bar shows: the invocation, the
// attempt, how it ended and its UTC start and end (an attempt still
// running has no end).
func barTitle(id string, a wire.Attempt, from time.Time, to *time.Time) string {
	const layout = "2006-01-02 15:04:05Z"
	end := "running"
	if to != nil {
		end = to.UTC().Format(layout) + " (" + shortAge(to.Sub(from)) + ")"
	}
	return fmt.Sprintf("%s attempt %d: %s, %s – %s", id, a.Attempt, cmp.Or(a.Outcome, "running"), from.UTC().Format(layout), end)
}

// tickLabel names a tick d before now: "-90 s" under two minutes, "-5 min",
// "-2 h".
func tickLabel(d time.Duration) string {
	switch {
	case d < 2*time.Minute:
		return fmt.Sprintf("-%d s", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("-%d min", int(d.Minutes()))
	}
	return fmt.Sprintf("-%d h", int(d.Hours()))
}

// tickStep is a round step that puts four to eight ticks on window.
func tickStep(window time.Duration) time.Duration {
	for _, step := range []time.Duration{10 * time.Second, 15 * time.Second, 30 * time.Second, time.Minute,
		2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour} {
		if window/step <= 8 {
			return step
		}
	}
	return 2 * time.Hour
}
