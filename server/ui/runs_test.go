package ui_test

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/server/ui"
	"github.com/dreamlake/lakeshore/server/ui/uitest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// hostileRunName holds markup, a terminal escape and a bidi override.
const hostileRunName = "<script>alert(1)</script><b>nightly</b>\x1b[31m\u202egnp"

// submitRun submits a run of jobs sh -c 'exit {x}' for each x of xs to
// queue, each with one attempt.
func (s served) submitRun(t *testing.T, queue, name string, xs ...string) string {
	t.Helper()
	run, _, err := s.op.SubmitRun(t.Context(), wire.RunRequest{Queue: queue, Name: name, MaxAttempts: 1,
		Argv: []string{"/bin/sh", "-c", "exit {x}"}, Matrix: map[string][]string{"x": xs}})
	if err != nil {
		t.Fatalf("submit a run to %s: %v", queue, err)
	}
	return run.RunID
}

// finishAll claims every job of queue with one worker and acks each by
// its argv: "exit 0" succeeded, any other failed with that exit code and
// an error whose message is msg.
func (s served) finishAll(t *testing.T, queue string, jobs int, msg string) {
	t.Helper()
	ctx := t.Context()
	four := 4
	w, err := client.New(s.url, enrollToken).Hello(ctx, wire.HelloRequest{MachineID: "m-run", BootID: "b", Lanes: []string{queue},
		Capabilities: wire.Capabilities{MaxConcurrency: &four}})
	if err != nil {
		t.Fatal(err)
	}
	daemon := client.New(s.url, w.Token)
	acked := 0
	for range 4 * jobs {
		if acked == jobs {
			return
		}
		poll, err := daemon.Poll(ctx, wire.PollRequest{WorkerID: w.WorkerID, Queue: queue, Phase: wire.PhaseReady})
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		for _, c := range poll.Commands {
			if c.Invocation == nil {
				continue
			}
			inv := c.Invocation
			code := 0
			ack := wire.AckRequest{WorkerID: w.WorkerID, InvocationID: inv.InvocationID, Attempt: inv.Attempt, State: wire.StateSucceeded, ExitCode: &code}
			if arg := inv.Argv[len(inv.Argv)-1]; arg != "exit 0" {
				if code, err = strconv.Atoi(strings.TrimPrefix(arg, "exit ")); err != nil {
					t.Fatalf("job argv %q", inv.Argv)
				}
				ack.State, ack.Error = wire.StateFailed, &wire.ErrorInfo{Type: wire.ErrorTypeExitCode, Message: msg}
			}
			if _, err := daemon.Ack(ctx, ack); err != nil {
				t.Fatalf("ack %s: %v", inv.InvocationID, err)
			}
			acked++
		}
	}
	t.Fatalf("acked %d of %d jobs", acked, jobs)
}

// TestRunPages: the runs page lists a run with its counts and progress;
// the run's page shows its counts, its failed job with exit code and
// error linking to the job's page, and its jobs on the timeline; a
// hostile run name and error read as text, in the pages and their live
// parts.
func TestRunPages(t *testing.T) {
	s := serve(t)
	id := s.submitRun(t, "q", hostileRunName, "0", "3", "0", "0")
	s.finishAll(t, "q", 4, "<img src=x onerror=alert(2)>exit status 3")
	lines, _, _, err := s.op.RunResultsPage(t.Context(), id, client.RunResultsParams{From: 1, Limit: 1})
	var job wire.RunResult
	if err != nil || len(lines) != 1 || json.Unmarshal(lines[0], &job) != nil || job.State != wire.StateFailed {
		t.Fatalf("job 1's result: %s %v", lines, err)
	}
	failedInv := job.InvocationID

	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	if _, fleet := s.do(t, "GET", "/ui/", nil); !strings.Contains(fleet, `href="/ui/runs"`) {
		t.Error("the fleet page does not link to the runs")
	}
	for _, path := range []string{"/ui/runs", "/ui/runs/live"} {
		body := s.html(t, path)
		for _, want := range []string{`data-run="` + id + `" data-state="done"`, `<progress value="4" max="4">`,
			`<td class="succeeded">3</td><td class="failed">1</td><td class="cancelled">0</td>`} {
			if !strings.Contains(body, want) {
				t.Errorf("%s lacks %s", path, want)
			}
		}
		wantText(t, path, body)
	}
	for _, path := range []string{"/ui/runs/" + id, "/ui/runs/" + id + "/live"} {
		body := s.html(t, path)
		for _, want := range []string{
			`<tr id="run-counts"><td class="queued">0</td><td class="running">0</td><td class="succeeded">3</td><td class="failed">1</td>`,
			`<td class="done">4</td><td class="total">4</td>`,
			`data-index="1" data-invocation="` + failedInv + `"`, `<a href="/ui/invocations/` + failedInv + `">`,
			`<td class="exit">3</td>`, `exit_code: &lt;img src=x onerror=alert(2)&gt;exit status 3`,
			`data-invocation="` + failedInv + `" x=`, // its bar on the timeline
			`id="retry-run"`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("%s lacks %s", path, want)
			}
		}
		if strings.Contains(body, "cancel-run") {
			t.Errorf("%s offers to cancel a done run", path)
		}
		if strings.Contains(body, "<img") {
			t.Errorf("%s renders the job's error as markup", path)
		}
		wantText(t, path, body)
	}
	for _, bad := range []string{"nope", "run_01J0000000000000000000000X", "inv_" + id[4:]} {
		if resp, _ := s.do(t, "GET", "/ui/runs/"+bad, nil); resp.StatusCode != http.StatusNotFound {
			t.Errorf("the page of run %q: %d, want 404", bad, resp.StatusCode)
		}
	}
}

// html reads the page at path, 200, as HTML: a page's live parts (JSON of
// HTML fragments) joined in the order of their names.
func (s served) html(t *testing.T, path string) string {
	t.Helper()
	resp, body := s.do(t, "GET", path, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d %s", path, resp.StatusCode, body)
	}
	if !strings.HasSuffix(path, "/live") {
		return body
	}
	var parts map[string]string
	if err := json.Unmarshal([]byte(body), &parts); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return strings.Join(slices.Sorted(maps.Values(parts)), "\n")
}

// wantText checks that the hostile run name reads as text in body (of
// path): no markup, the escapes shown.
func wantText(t *testing.T, path, body string) {
	t.Helper()
	if strings.Contains(body, "<script>alert") || strings.Contains(body, "<b>nightly") || strings.Contains(body, "\x1b") ||
		strings.ContainsRune(body, '\u202e') {
		t.Errorf("%s renders the run's name as markup or keeps its escapes", path)
	}
	if want := `&lt;b&gt;nightly&lt;/b&gt;\x1b[31m\u202egnp`; !strings.Contains(body, want) {
		t.Errorf("%s does not show the run's name as %s", path, want)
	}
}

// TestRunActionsNeedCSRF: cancelling a run or retrying its failed jobs
// without the CSRF token is refused and changes nothing; with it, the
// action is done and goes back to the run's page, which says what it did.
func TestRunActionsNeedCSRF(t *testing.T) {
	s := serve(t)
	ctx := t.Context()
	failing := s.submitRun(t, "f", "", "0", "5")
	s.finishAll(t, "f", 2, "exit status 5")
	waiting := s.submitRun(t, "nobody", "", "0", "1", "2")
	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	_, page := s.do(t, "GET", "/ui/runs/"+waiting, nil)
	csrf := uitest.CSRFOf(page)
	if csrf == "" || !strings.Contains(page, `id="cancel-run"`) {
		t.Fatalf("the run's page has no CSRF token or cancel button:\n%s", page)
	}

	for _, act := range []string{"/ui/runs/" + waiting + "/cancel", "/ui/runs/" + failing + "/retry"} {
		for _, form := range []url.Values{{}, {"csrf": {"forged"}}} {
			if resp, _ := s.do(t, "POST", act, form); resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s with csrf %q: %d, want 403", act, form.Get("csrf"), resp.StatusCode)
			}
		}
	}
	if r, err := s.op.Run(ctx, waiting); err != nil || r.Counts[wire.StateQueued] != 3 {
		t.Fatalf("a refused cancel changed the run: %+v %v", r, err)
	}
	if r, err := s.op.Run(ctx, failing); err != nil || r.Counts[wire.StateFailed] != 1 || r.Counts[wire.StateQueued] != 0 {
		t.Fatalf("a refused retry changed the run: %+v %v", r, err)
	}

	resp, _ := s.do(t, "POST", "/ui/runs/"+waiting+"/cancel", url.Values{"csrf": {csrf}})
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/ui/runs/"+waiting+"?") {
		t.Fatalf("cancel with the token: %d → %q", resp.StatusCode, loc)
	}
	if r, err := s.op.Run(ctx, waiting); err != nil || r.Counts[wire.StateCancelled] != 3 || r.State != wire.RunDone {
		t.Fatalf("after the page's cancel: %+v %v", r, err)
	}
	if _, body := s.do(t, "GET", resp.Header.Get("Location"), nil); !strings.Contains(body, `<p class="flash" id="flash">Cancelled 3 jobs.</p>`) {
		t.Errorf("the run's page after a cancel does not say what it did")
	}

	resp, _ = s.do(t, "POST", "/ui/runs/"+failing+"/retry", url.Values{"csrf": {csrf}})
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/ui/runs/"+failing+"?") {
		t.Fatalf("retry with the token: %d → %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if r, err := s.op.Run(ctx, failing); err != nil || r.Counts[wire.StateFailed] != 0 || r.Counts[wire.StateQueued] != 1 {
		t.Fatalf("after the page's retry: %+v %v", r, err)
	}
	if _, body := s.do(t, "GET", resp.Header.Get("Location"), nil); !strings.Contains(body, "Retried 1 jobs.") {
		t.Errorf("the run's page after a retry does not say what it did")
	}

	// A flash is the view's own words: a query cannot put text in the page.
	if _, body := s.do(t, "GET", "/ui/runs/"+failing+"?did=%3Cb%3Eowned&n=1&left=0", nil); strings.Contains(body, "owned") {
		t.Error("the page shows text from its query")
	}
	if resp, _ := s.do(t, "POST", "/ui/runs/nope/cancel", url.Values{"csrf": {csrf}}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("cancel of an invalid run id: %d, want 404", resp.StatusCode)
	}
}

// TestRunPageListsAHundredFailedJobs: a run with 105 failed jobs lists the
// first 100 and says how many more there are.
func TestRunPageListsAHundredFailedJobs(t *testing.T) {
	s := serve(t)
	var xs []string
	for i := range 105 {
		xs = append(xs, strconv.Itoa(1+i%9))
	}
	id := s.submitRun(t, "q", "", xs...)
	s.finishAll(t, "q", len(xs), "exit status")
	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	body := s.html(t, "/ui/runs/"+id)
	if n := strings.Count(body, `<tr class="failed-job"`); n != 100 {
		t.Errorf("the page lists %d failed jobs, want 100", n)
	}
	if !strings.Contains(body, `data-index="99"`) || strings.Contains(body, `data-index="100"`) {
		t.Error("the page does not list the first 100 failed jobs by index")
	}
	if want := "and 5 more failed jobs"; !strings.Contains(body, want) {
		t.Errorf("the page does not say %q", want)
	}
}

// TestRunPageReadsBoundedResults: a run's page reads a bounded number of
// its results (here 2 pages of 2 jobs): a failed job past them is not
// listed, the page says which jobs it read, and the run's counts still
// say how many failed.
func TestRunPageReadsBoundedResults(t *testing.T) {
	ui.SetResultsPaging(t, 2, 2)
	s := serve(t)
	id := s.submitRun(t, "q", "", "0", "0", "0", "4", "0", "7")
	s.finishAll(t, "q", 6, "exit status")
	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	body := s.html(t, "/ui/runs/"+id)
	if n := strings.Count(body, `<tr class="failed-job"`); n != 1 || !strings.Contains(body, `data-index="3"`) {
		t.Errorf("the page lists %d failed jobs, want job 3 only (the first 4 read)", n)
	}
	for _, want := range []string{"and 1 more failed jobs", `<td class="failed">2</td>`, "the results of the first 4 of 6 jobs"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}

// TestRunTimelineReadsBoundedJobs: a run's timeline shows the jobs its
// page reads, at most the cap (here 2): the failed job, then the latest
// other one.
func TestRunTimelineReadsBoundedJobs(t *testing.T) {
	ui.SetDetailReads(t, 2)
	s := serve(t)
	id := s.submitRun(t, "q", "", "6", "0", "0", "0")
	s.finishAll(t, "q", 4, "exit status")
	var jobs []wire.RunResult
	if err := s.op.RunResults(t.Context(), id, client.RunResultsParams{}, func(line json.RawMessage) error {
		var j wire.RunResult
		jobs = append(jobs, j)
		return json.Unmarshal(line, &jobs[len(jobs)-1])
	}); err != nil || len(jobs) != 4 {
		t.Fatalf("results: %v %v", jobs, err)
	}
	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	body := s.html(t, "/ui/runs/"+id)
	if n := strings.Count(body, `<rect class="bar`); n != 2 {
		t.Errorf("the timeline shows %d bars, want 2", n)
	}
	for _, j := range []wire.RunResult{jobs[0], jobs[3]} {
		if !strings.Contains(body, `data-invocation="`+j.InvocationID+`" x=`) {
			t.Errorf("the timeline lacks job %d (%s)", j.Index, j.State)
		}
	}
}
