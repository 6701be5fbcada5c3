package ui

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// What one render of the runs pages reads, so a page stays light however
// big the run (`lakeshore run results` reads all of it):
const (
	// runRows is how many runs the runs page lists, newest first.
	runRows = 200
	// failedRows is how many failed jobs a run's page lists.
	failedRows = 100
)

// resultsPage and resultsPages bound the results a run's page reads: its
// first 10,000 jobs, in pages of 1,000 (variables for the tests of the
// cap).
var resultsPage, resultsPages = 1000, 10

// detailReads is how many jobs' invocations (GET /v1/invocations/{id}) a
// run's page reads, for the failed jobs' errors and the timeline: the
// failed jobs it lists, then running jobs, then the latest others (a
// variable for the tests of the cap).
var detailReads = 120

// runRow is one run in the runs page.
type runRow struct {
	ID, Queue, Name, State, Created string
	Total, Done                     int
	Succeeded, Failed, Cancelled    int
}

// runsPage is what the runs page shows.
type runsPage struct {
	Runs []runRow
	More bool // older runs than the page shows
	CSRF string
}

// failedJob is one failed job of a run's page.
type failedJob struct {
	Index               int
	ID, ExitCode, Error string
}

// runPage is what a run's page shows.
type runPage struct {
	Run                          wire.Run
	Name, Created                string
	Queued, Running              int
	Succeeded, Failed, Cancelled int
	Live                         bool
	FailedJobs                   []failedJob
	// FailedMore counts the failed jobs the page does not list.
	FailedMore int
	// Read is how many jobs' results the page read (all when it is the
	// run's total).
	Read     int
	Timeline timeline
	// Artifacts: the counted artifacts of its jobs (runArtifacts).
	Artifacts artifactsView
	Flash     string
	CSRF      string
}

func runRowOf(r wire.Run, now time.Time) runRow {
	row := runRow{ID: r.RunID, Queue: r.Queue, Name: printable(r.Name), State: r.State, Total: r.Total, Done: r.DoneCount,
		Succeeded: r.Counts[wire.StateSucceeded], Failed: r.Counts[wire.StateFailed], Cancelled: r.Counts[wire.StateCancelled],
		Created: "—"}
	if t, err := time.Parse(time.RFC3339Nano, r.CreatedAt); err == nil {
		row.Created = shortAge(now.Sub(t)) + " ago"
	}
	return row
}

func (u *UI) runs(w http.ResponseWriter, r *http.Request, sess string) {
	p, err := u.runsPage(r.Context(), sess)
	u.page(w, "runs.html", p, err)
}

func (u *UI) runsLive(w http.ResponseWriter, r *http.Request, sess string) {
	p, err := u.runsPage(r.Context(), sess)
	u.liveParts(w, p, err, "runs")
}

func (u *UI) runsPage(ctx context.Context, sess string) (runsPage, error) {
	rl, err := u.api.RunsPage(ctx, client.RunsParams{Limit: runRows})
	if err != nil {
		return runsPage{}, fmt.Errorf("list runs: %w", err)
	}
	now := u.now()
	p := runsPage{CSRF: u.csrfToken(sess), More: rl.NextCursor != ""}
	for _, r := range rl.Runs {
		p.Runs = append(p.Runs, runRowOf(r, now))
	}
	return p, nil
}

func (u *UI) run(w http.ResponseWriter, r *http.Request, sess string) {
	p, err := u.runPage(r.Context(), sess, r.PathValue("id"), true)
	p.Flash = flashOf(r.URL.Query())
	u.page(w, "run.html", p, err)
}

func (u *UI) runLive(w http.ResponseWriter, r *http.Request, sess string) {
	p, err := u.runPage(r.Context(), sess, r.PathValue("id"), false)
	u.liveParts(w, p, err, "run", "run-failed", "timeline")
}

// errNoRun answers a path that names no run id: the API would call it
// invalid, but to the view's reader it is a page that does not exist.
func errNoRun(id string) error {
	return wire.Errorf(wire.CodeNotFound, "no run %q", printable(id))
}

// runPage reads what run id's page shows: its counts, its failed jobs
// (from its results, at most resultsPages pages), their errors and the
// timeline of its jobs (from at most detailReads jobs' invocations), and,
// withArtifacts (the whole page, not its live parts), its jobs' counted
// artifacts (runArtifacts).
func (u *UI) runPage(ctx context.Context, sess, id string, withArtifacts bool) (runPage, error) {
	if !ids.Valid(ids.Run, id) {
		return runPage{}, errNoRun(id)
	}
	run, err := u.api.Run(ctx, id)
	if err != nil {
		return runPage{}, err
	}
	now := u.now()
	row := runRowOf(run, now)
	p := runPage{Run: run, Name: row.Name, Created: row.Created, Queued: run.Counts[wire.StateQueued], Running: run.Counts[wire.StateRunning],
		Succeeded: row.Succeeded, Failed: row.Failed, Cancelled: row.Cancelled, Live: run.State != wire.RunDone, CSRF: u.csrfToken(sess)}
	jobs, err := u.runResults(ctx, id)
	if err != nil {
		return runPage{}, err
	}
	p.Read = len(jobs)
	var failed, running, others []wire.RunResult
	for _, j := range jobs {
		switch j.State {
		case wire.StateFailed:
			failed = append(failed, j)
		case wire.StateRunning:
			running = append(running, j)
		case wire.StateQueued:
		default:
			others = append(others, j)
		}
	}
	shown := failed[:min(len(failed), failedRows)]
	p.FailedMore = max(len(failed), p.Failed) - len(shown)
	slices.Reverse(others) // the latest first
	detail := slices.Concat(shown, running, others)
	detail = detail[:min(len(detail), detailReads)]
	invs := make(map[string]wire.Invocation, len(detail))
	var timed []wire.Invocation
	for _, j := range detail {
		inv, err := u.api.GetInvocation(ctx, j.InvocationID)
		if err != nil {
			return runPage{}, fmt.Errorf("run %s job %d: %w", id, j.Index, err)
		}
		invs[j.InvocationID] = inv
		timed = append(timed, inv)
	}
	for _, j := range shown {
		fj := failedJob{Index: j.Index, ID: j.InvocationID, ExitCode: "—"}
		if j.ExitCode != nil {
			fj.ExitCode = strconv.Itoa(*j.ExitCode)
		}
		if e := invs[j.InvocationID].Error; e != nil {
			fj.Error = printable(e.Type + ": " + e.Message)
		}
		p.FailedJobs = append(p.FailedJobs, fj)
	}
	wl, err := u.api.ListWorkers(ctx, listLimit, "")
	if err != nil {
		return runPage{}, fmt.Errorf("list workers: %w", err)
	}
	// The axis spans the run's life, up to a day.
	win := defaultWindow
	if t, err := time.Parse(time.RFC3339Nano, run.CreatedAt); err == nil {
		win = min(max(win, now.Sub(t)+time.Minute), 24*time.Hour)
	}
	p.Timeline = layoutTimeline(timed, wl.Workers, now, win)
	if withArtifacts {
		p.Artifacts = u.runArtifacts(ctx, id, jobs, run.Total)
	}
	return p, nil
}

// runResults reads the results of run id's first resultsPages pages.
func (u *UI) runResults(ctx context.Context, id string) ([]wire.RunResult, error) {
	var out []wire.RunResult
	pages := 0
	err := u.api.RunResults(ctx, id, client.RunResultsParams{Limit: resultsPage}, func(line json.RawMessage) error {
		var j wire.RunResult
		if err := json.Unmarshal(line, &j); err != nil {
			return fmt.Errorf("run %s: a result line: %w", id, err)
		}
		out = append(out, j)
		if len(out)%resultsPage == 0 {
			if pages++; pages == resultsPages {
				return client.ErrStop
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("run %s results: %w", id, err)
	}
	return out, nil
}

// askAgainCalls bounds how many times a run action asks the API again
// while it answers jobs remaining; askAgainFor stops asking once the
// action has taken that long (a call that ran out its own budget leaves
// the rest to the next press, well under API Gateway's 29 s).
const (
	askAgainCalls = 5
	askAgainFor   = 5 * time.Second
)

// askAgain calls act until it answers nothing remaining, at most
// askAgainCalls times and while askAgainFor has not passed; it reports
// the jobs acted on and those still remaining.
func (u *UI) askAgain(act func() (done, remaining int, err error)) (done, remaining int, err error) {
	start := u.now()
	for range askAgainCalls {
		n, rest, err := act()
		if err != nil {
			return done, rest, err
		}
		done, remaining = done+n, rest
		if rest == 0 || u.now().Sub(start) >= askAgainFor {
			break
		}
	}
	return done, remaining, nil
}

func (u *UI) cancelRun(w http.ResponseWriter, r *http.Request, _ string) {
	u.runAction(w, r, "cancelled", func(ctx context.Context, id string) (int, int, error) {
		c, err := u.api.CancelRun(ctx, id)
		return c.Cancelled, c.Remaining, err
	})
}

func (u *UI) retryRun(w http.ResponseWriter, r *http.Request, _ string) {
	u.runAction(w, r, "retried", func(ctx context.Context, id string) (int, int, error) {
		c, err := u.api.RetryRun(ctx, id)
		return c.Retried, c.Remaining, err
	})
}

// runAction does a run action (asking again while jobs remain) and goes
// back to the run's page, with what it did in the flash.
func (u *UI) runAction(w http.ResponseWriter, r *http.Request, did string, act func(ctx context.Context, id string) (int, int, error)) {
	id := r.PathValue("id")
	if !ids.Valid(ids.Run, id) {
		u.fail(w, errNoRun(id))
		return
	}
	n, left, err := u.askAgain(func() (int, int, error) { return act(r.Context(), id) })
	if err != nil && n > 0 {
		err = fmt.Errorf("%s %d jobs, then: %w", did, n, err)
	}
	q := url.Values{"did": {did}, "n": {strconv.Itoa(n)}, "left": {strconv.Itoa(left)}}
	u.acted(w, r, did+" run "+id, err, "/ui/runs/"+id+"?"+q.Encode())
}

// flashOf reads what a run action did from the page's query (did=, n=,
// left=), in the view's own words: the query names one of its actions
// and numbers, never text to show.
func flashOf(q url.Values) string {
	did := q.Get("did")
	if did != "cancelled" && did != "retried" {
		return ""
	}
	n, err1 := strconv.Atoi(q.Get("n"))
	left, err2 := strconv.Atoi(q.Get("left"))
	if err := errors.Join(err1, err2); err != nil || n < 0 || left < 0 {
		return ""
	}
	s := fmt.Sprintf("%s %d jobs.", did, n)
	s = string(s[0]-'a'+'A') + s[1:]
	if left > 0 {
		s += fmt.Sprintf(" %d still to do: press again.", left)
	}
	return s
}
