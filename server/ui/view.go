package ui

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/dreamlake/lakeshore/shared/display"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// shortAge writes a duration as an operator reads it on a page: "12 s",
// "4 min", "3 h", "2 d".
func shortAge(d time.Duration) string {
	switch d = max(d, 0); {
	case d < time.Minute:
		return fmt.Sprintf("%d s", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d min", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h", int(d.Hours()))
	}
	return fmt.Sprintf("%d d", int(d.Hours()/24))
}

// printable shows a string a worker or a submitter supplied on one line,
// its hidden characters (terminal escapes, bidi controls) escaped
// (display.Line); html/template escapes the markup.
func printable(s string) string { return display.Line(s) }

// workerStates is the order the fleet page groups workers in.
var workerStates = []string{"active", "setting_up", "joining", "pending", "draining", "stale", "gone"}

type workerGroup struct {
	State   string
	Workers []workerRow
}

type workerRow struct {
	ID, Label, State, Phase, HostStatus, HostKey, LastSeen, Why, Setup string
	Running, Max                                                       int
}

type queueRow struct {
	Queue                        string
	Queued, Running, Done        int
	Succeeded, Failed, Cancelled int
	Oldest                       string
}

type invRow struct {
	ID, Queue, State, Worker, Age string
	// Command is the argv shortened (Argv whole, as its title);
	// Duration how long it ran or runs; ExitCode its exit status.
	Command, Argv, Duration, ExitCode string
	Attempt                           int
	Cancellable                       bool
}

// fleet is what the fleet page shows.
type fleet struct {
	Groups   []workerGroup
	Queues   []queueRow
	Recent   recentList
	Timeline timeline
	// LiveURL is where the page's live parts are read: with its window
	// and its list's filter and page.
	LiveURL string
	// States are what the list's state filter offers.
	States []string
	CSRF   string
}

func workerRowOf(w wire.Worker, now time.Time) workerRow {
	row := workerRow{ID: w.WorkerID, Label: printable(cmp.Or(w.Label, w.MachineID)), State: w.State, Phase: w.Phase,
		HostStatus: w.HostStatus, HostKey: w.HostKey, Running: w.CurrentInvocations, Max: w.MaxConcurrency,
		Why: printable(w.StateWhy), LastSeen: "never"}
	if w.LastSeenAt != nil {
		row.LastSeen = shortAge(now.Sub(*w.LastSeenAt)) + " ago"
	}
	if r := w.LastSetupResult; r != nil && r.Status == wire.SetupFailed {
		row.Setup = printable(fmt.Sprintf("setup failed: %s (exit %d)", r.Command, r.ExitCode))
	}
	return row
}

// groupWorkers groups ws by state, in workerStates order, by label within.
func groupWorkers(ws []wire.Worker, now time.Time) []workerGroup {
	by := map[string][]workerRow{}
	for _, w := range ws {
		by[w.State] = append(by[w.State], workerRowOf(w, now))
	}
	var out []workerGroup
	for _, s := range append(slices.Clone(workerStates), "unknown") {
		rows := by[s]
		delete(by, s)
		if s == "unknown" {
			for _, rest := range by {
				rows = append(rows, rest...)
			}
		}
		if len(rows) == 0 {
			continue
		}
		slices.SortFunc(rows, func(a, b workerRow) int { return cmp.Or(cmp.Compare(a.Label, b.Label), cmp.Compare(a.ID, b.ID)) })
		out = append(out, workerGroup{State: s, Workers: rows})
	}
	return out
}

// labels maps worker ids to their labels, for the invocation rows.
func labels(ws []wire.Worker) map[string]string {
	m := map[string]string{}
	for _, w := range ws {
		m[w.WorkerID] = printable(cmp.Or(w.Label, w.MachineID))
	}
	return m
}

func invRowOf(inv wire.Invocation, names map[string]string, now time.Time) invRow {
	return invRow{ID: inv.InvocationID, Queue: inv.Queue, State: inv.State, Attempt: inv.Attempt,
		Worker: cmp.Or(names[inv.WorkerID], inv.WorkerID), Age: shortAge(now.Sub(inv.CreatedAt)),
		Command: shortCommand(inv.Argv, commandWidth), Argv: shortCommand(inv.Argv, 1000),
		Duration: runTime(inv, now), ExitCode: exitCode(inv), Cancellable: !wire.Terminal(inv.State)}
}
