package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// uiLogin logs the browser tab ctx in to the web view of d with the
// operator token and waits for the fleet page.
func uiLogin(t *testing.T, ctx context.Context, d *devServer) {
	t.Helper()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(d.URL+"/ui/"),
		chromedp.SendKeys(chromedp.ID("token"), d.OperatorToken),
		chromedp.Submit(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("workers")),
	); err != nil {
		t.Fatalf("log in: %v", err)
	}
}

// hostileRunName is a run name that holds markup, a terminal escape and a
// bidi override (U+202E).
const hostileRunName = "<script>document.title='pwned'</script><b>nightly</b>\x1b[31m\u202egnp"

// TestWebViewRuns drives the runs pages in a real headless chromium over
// lakeshore dev and a real nymph: a run of 4 jobs (sh -c 'echo out-{x};
// exit {x}' for x = 0, 0, 0, 3 in effect) is listed on the runs page, and
// its page reaches done without a reload, lists the failed job with exit
// code 3 and links to its page, which shows its output (out-3); the run's
// hostile name reads as text; a run of a queue nobody serves is cancelled
// from its page (every job cancelled). A screenshot of the run's page goes
// to bin/ui-run.png.
func TestWebViewRuns(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	d := startDev(t, backends[0])
	op := d.Operator()
	startNymph(t, d, "runs-a", "--capacity", "4")
	ctx := browser(t, exe)
	uiLogin(t, ctx, d)

	run, _, err := op.SubmitRun(context.Background(), wire.RunRequest{Queue: "q", Name: hostileRunName, MaxAttempts: 1,
		Argv:   []string{"/bin/sh", "-c", "sleep 2; echo out-{x}; test {x} != 3 || exit 3"},
		Matrix: map[string][]string{"x": {"0", "1", "2", "3"}}})
	if err != nil {
		t.Fatalf("submit the run: %v", err)
	}
	// From the fleet page's nav to the runs page, which lists the run.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("nav-runs")), chromedp.WaitVisible(chromedp.ID("runs"))); err != nil {
		t.Fatalf("open the runs page: %v", err)
	}
	evalEventually(t, ctx, 10*time.Second, "the runs page lists the run",
		fmt.Sprintf(`!!document.querySelector('#runs tr.run[data-run=%q] a')`, run.RunID))
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(fmt.Sprintf(`#runs tr.run[data-run=%q] a`, run.RunID))),
		chromedp.WaitVisible(chromedp.ID("run-state"))); err != nil {
		t.Fatalf("open the run's page: %v", err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__noReload = 1; true`)); err != nil {
		t.Fatal(err)
	}
	evalEventually(t, ctx, time.Minute, "the run reaches done without a reload",
		`document.getElementById('run-state').textContent === 'done' && document.getElementById('run-done').textContent === '4/4' && window.__noReload === 1`)
	evalEventually(t, ctx, 10*time.Second, "the counts and the failed job with its exit code",
		`document.querySelector('#run-counts .succeeded').textContent === '3' && document.querySelector('#run-counts .failed').textContent === '1' &&
		 document.querySelectorAll('#run-failed tr.failed-job').length === 1 &&
		 document.querySelector('#run-failed tr.failed-job[data-index="3"] td.exit').textContent === '3' &&
		 document.querySelectorAll('#timeline rect.bar').length === 4`)
	name, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("run-name")))
	if err != nil {
		t.Fatal(err)
	}
	if want := `<script>document.title='pwned'</script><b>nightly</b>\x1b[31m\u202egnp`; name != want {
		t.Errorf("the run's name reads %q, want the text %q", name, want)
	}
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('main script, main b').length`)); err != nil || n != 0 {
		t.Errorf("the run's name became markup: %d elements (%v)", n, err)
	}
	shot(t, ctx, "ui-run.png", "")

	// Through to the failed job's page: its output.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#run-failed tr.failed-job a`)), chromedp.WaitVisible(chromedp.ID("stdout"))); err != nil {
		t.Fatalf("open the failed job's page: %v", err)
	}
	evalEventually(t, ctx, 30*time.Second, "the failed job's page shows its output and state",
		`document.getElementById('stdout').textContent.includes('out-3') && document.getElementById('inv-state').textContent === 'failed'`)

	// A run nobody serves, cancelled from its page.
	idle, _, err := op.SubmitRun(context.Background(), wire.RunRequest{Queue: "nobody-serves-this", Argv: []string{"true", "{x}"},
		Matrix: map[string][]string{"x": {"a", "b", "c"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(d.URL+"/ui/runs/"+idle.RunID), chromedp.WaitVisible(chromedp.ID("cancel-run")),
		chromedp.Click(chromedp.ID("cancel-run")), chromedp.WaitVisible(chromedp.ID("flash"))); err != nil {
		t.Fatalf("cancel the run from its page: %v", err)
	}
	evalEventually(t, ctx, 30*time.Second, "the run reads done, every job cancelled",
		`document.getElementById('run-state').textContent === 'done' && document.querySelector('#run-counts .cancelled').textContent === '3' &&
		 document.getElementById('flash').textContent.includes('Cancelled 3 jobs')`)
	if got, err := op.Run(context.Background(), idle.RunID); err != nil || got.Counts[wire.StateCancelled] != 3 || got.State != wire.RunDone {
		t.Errorf("after the page's cancel: %+v %v", got, err)
	}
	if html, _ := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("main"))); strings.Contains(html, "cancel-run") {
		t.Error("a done run's page still offers to cancel it")
	}
}
