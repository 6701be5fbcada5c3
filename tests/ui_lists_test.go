package tests

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestWebViewInvocationList drives the fleet page's invocation list in a
// real headless chromium over lakeshore dev with 2,000 invocations stored
// (one run of 2,000 jobs on a queue nobody serves) and two finished by a
// real nymph: the rows show the command, how long it ran and the exit
// code; the state filter, chosen in the form, lists queued work 50 a page,
// older then newer back to the same page, and the 2 s refresh keeps the
// filter and the page; the failed filter finds the one that exited 3.
func TestWebViewInvocationList(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	d := startDev(t, backends[0])
	op := d.Operator()
	bg := context.Background()
	started := time.Now()
	if _, _, err := op.SubmitRun(bg, wire.RunRequest{Queue: "bulk", Argv: []string{"/bin/echo", "job-{i}"},
		Matrix: map[string][]string{"i": seq(2000)}}); err != nil {
		t.Fatalf("submit a run of 2,000: %v", err)
	}
	t.Logf("2,000 invocations stored in %s (one run)", time.Since(started).Round(time.Millisecond))
	startNymph(t, d, "lists-a")
	failed, _, err := op.Submit(bg, wire.SubmitRequest{Queue: "q", MaxAttempts: 1, Argv: []string{"/bin/sh", "-c", "sleep 0.3; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	ok, _, err := op.Submit(bg, wire.SubmitRequest{Queue: "q", Argv: []string{"/bin/echo", "fine"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{failed.InvocationID, ok.InvocationID} {
		waittest.Until(t, time.Minute, id+" finished", func() bool {
			inv, err := op.GetInvocation(bg, id)
			return err == nil && wire.Terminal(inv.State)
		})
	}

	ctx := browser(t, exe)
	loadStart := time.Now()
	uiLogin(t, ctx, d)
	t.Logf("login and the fleet page with 2,002 invocations: %s", time.Since(loadStart).Round(time.Millisecond))
	row := `document.querySelector('#recent tr.invocation[data-invocation="` + failed.InvocationID + `"]')`
	evalEventually(t, ctx, 10*time.Second, "the failed row shows its command, run time and exit code",
		row+` && `+row+`.querySelector('td.command').textContent === '/bin/sh -c sleep 0.3; exit 3' && `+
			row+`.querySelector('td.exit').textContent === '3' && /^\d+\.\d s$/.test(`+row+`.querySelector('td.ran').textContent)`)

	// Queued, from the form: 50 a page, all queued.
	if err := chromedp.Do(ctx,
		chromedp.SetValue(chromedp.ID("filter-state"), "queued"),
		chromedp.Submit(chromedp.ID("recent-filter")),
		chromedp.WaitVisible(chromedp.ID("page-older")),
	); err != nil {
		t.Fatalf("filter by state: %v", err)
	}
	rows := `[...document.querySelectorAll('#recent tr.invocation')]`
	page := func() []string {
		t.Helper()
		ids, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](rows+`.map(r => r.dataset.invocation + ' ' + r.dataset.state)`))
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	first := page()
	if len(first) != 50 || strings.Count(strings.Join(first, "\n"), " queued") != 50 {
		t.Fatalf("the first page of queued: %d rows: %v", len(first), first)
	}
	if loc, _ := chromedp.Run(ctx, chromedp.Location()); !strings.Contains(loc, "state=queued") {
		t.Errorf("the filter is not in the URL: %s", loc)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("page-older")), chromedp.WaitVisible(chromedp.ID("page-newer"))); err != nil {
		t.Fatalf("older: %v", err)
	}
	second := page()
	if len(second) != 50 || second[0] == first[0] || second[0] > first[49] || strings.Count(strings.Join(second, "\n"), " queued") != 50 {
		t.Fatalf("the second page: %v, want the 50 queued past %s", second, first[49])
	}
	// The refresh reads the same page again.
	mark, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.getAttribute('data-refreshed') || ''`))
	if err != nil {
		t.Fatal(err)
	}
	evalEventually(t, ctx, 15*time.Second, "a refresh", `(document.body.getAttribute('data-refreshed') || '') !== '`+mark+`'`)
	if again := page(); strings.Join(again, ",") != strings.Join(second, ",") {
		t.Errorf("after a refresh the page reads %v, want the same second page", again)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("page-newer")), chromedp.WaitVisible(chromedp.ID("page-older"))); err != nil {
		t.Fatalf("newer: %v", err)
	}
	if back := page(); strings.Join(back, ",") != strings.Join(first, ",") {
		t.Errorf("newer from the second page: %v, want the first", back)
	}

	// Failed: the one that exited 3.
	if err := chromedp.Do(ctx,
		chromedp.SetValue(chromedp.ID("filter-state"), "failed"),
		chromedp.Submit(chromedp.ID("recent-filter")),
	); err != nil {
		t.Fatalf("filter by failed: %v", err)
	}
	evalEventually(t, ctx, 10*time.Second, "only the failed one",
		rows+`.length === 1 && `+row+` !== null && !document.getElementById('page-older')`)
}

// seq is "0" … "n-1".
func seq(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = strconv.Itoa(i)
	}
	return out
}
