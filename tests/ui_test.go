package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// chromium finds Debian's chromium (.ci/run installs it): the browser
// tests skip without it, except in CI (CI=true), where that fails.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium on PATH: CI runs the browser tests (apt-get install -y chromium)")
	}
	t.Skip("no chromium on PATH (apt-get install -y chromium)")
	return ""
}

// browser is one headless chromium tab, closed when t ends.
func browser(t *testing.T, exe string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1280, 1000), chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	ctx, cancelTime := context.WithTimeout(ctx, 4*time.Minute)
	t.Cleanup(func() { cancelTime(); cancelTab(); cancelAlloc() })
	return ctx
}

// evalEventually evaluates js in the page every 200 ms until it is true,
// for up to limit.
func evalEventually(t *testing.T, ctx context.Context, limit time.Duration, what, js string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			html, _ := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("main")))
			t.Fatalf("not within %s: %s (last error %v); the page's main:\n%s", limit, what, err, html)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// hostileLabel is a worker label that holds markup, a terminal escape and a
// bidi override (U+202E).
const hostileLabel = "<script>document.title='pwned'</script><b>ui-c</b>\x1b[31m\u202egnp.exe"

// TestWebViewInABrowser drives the web view in a real headless chromium
// over lakeshore dev and three real nymphs: log in; three active workers,
// one with a label of markup shown as text; invocations submitted with
// the CLI appear running, then succeeded, without a reload; a SIGKILLed
// worker turns stale and its attempts go on another lane (a hand-off line
// on the timeline); an invocation's page shows its output as it grows, and
// a cancel from there ends it cancelled;
// a POST without the CSRF token is refused. Screenshots of the fleet page
// and the timeline go to bin/ (ui-fleet.png, ui-timeline.png).
func TestWebViewInABrowser(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	// A stale window of 6 s: short enough that the killed worker reads
	// stale soon, long enough that a live worker on a loaded machine does
	// not (its attempts would be handed to another worker and superseded
	// when it acks, leaving the killed one nothing to hand back).
	d := startDev(t, backends[0], "--stale-after", "6s")
	op := d.Operator()
	a := startNymph(t, d, "ui-a", "--capacity", "2")
	startNymph(t, d, "ui-b", "--capacity", "2")
	startNymph(t, d, "ui-c", "--capacity", "2", "--label", hostileLabel)
	ctx := browser(t, exe)

	// Log in: a wrong token is refused, the operator token gets in.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(d.URL+"/ui/"),
		chromedp.SendKeys(chromedp.ID("token"), "not-the-token"),
		chromedp.Submit(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("login-error")),
	); err != nil {
		t.Fatalf("a wrong login: %v", err)
	}
	msg, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("login-error")))
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.ID("token"), d.OperatorToken),
		chromedp.Submit(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("workers")),
	); err != nil {
		t.Fatalf("log in: %v", err)
	}
	if !strings.Contains(msg, "not the operator token") {
		t.Errorf("a wrong token's answer: %q", msg)
	}
	if loc, err := chromedp.Run(ctx, chromedp.Location()); err != nil || strings.Contains(loc, d.OperatorToken) {
		t.Fatalf("the token is in the URL (%v)", err)
	}
	// A marker that a reload would lose: what follows happens without one.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__noReload = 1; true`)); err != nil {
		t.Fatal(err)
	}
	evalEventually(t, ctx, time.Minute, "three active workers",
		`document.querySelectorAll('#workers tr.worker[data-state="active"]').length === 3`)
	labelText, err := chromedp.Run(ctx, chromedp.Evaluate[string](
		`[...document.querySelectorAll('#workers td.label')].map(e => e.textContent).find(s => s.includes('script')) || ''`))
	if err != nil {
		t.Fatal(err)
	}
	// Markup reads as text; the terminal escape and the bidi override read
	// as visible escapes, so neither drives a terminal nor reorders the line.
	if want := `<script>document.title='pwned'</script><b>ui-c</b>\x1b[31m\u202egnp.exe`; labelText != want {
		t.Errorf("the hostile label reads %q, want the text %q (markup as text, the escapes shown)", labelText, want)
	}
	scripts, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('main script, main b').length`))
	if err != nil {
		t.Fatal(err)
	}
	title, err := chromedp.Run(ctx, chromedp.Title())
	if err != nil {
		t.Fatal(err)
	}
	if scripts != 0 || title == "pwned" {
		t.Errorf("a worker's label became markup: %d elements, title %q", scripts, title)
	}

	// Submitted with the CLI: running, then succeeded, without a reload.
	var ids []string
	for i := range 4 {
		out, err := exec.Command(lakeshoreBin(t), "submit", "--url", d.URL, "--token", d.OperatorToken, "--queue", "q", "--",
			"/bin/sh", "-c", fmt.Sprintf("sleep 2; echo short-%d", i)).Output()
		if err != nil {
			t.Fatalf("lakeshore submit: %v", err)
		}
		ids = append(ids, strings.TrimSpace(string(out)))
	}
	evalEventually(t, ctx, time.Minute, "a submitted invocation shows running",
		fmt.Sprintf(`!!document.querySelector('#recent tr.invocation[data-invocation=%q][data-state="running"]')`, ids[0]))
	evalEventually(t, ctx, 2*time.Minute, "the submitted invocations show succeeded",
		fmt.Sprintf(`%q.split(',').every(id => document.querySelector('#recent tr.invocation[data-invocation="'+id+'"][data-state="succeeded"]'))`, strings.Join(ids, ",")))
	evalEventually(t, ctx, 10*time.Second, "no reload happened", `window.__noReload === 1`)

	// A worker dies mid-run: stale on the page, its attempts on another lane.
	var long []string
	for range 6 {
		inv, _, err := op.Submit(context.Background(), wire.SubmitRequest{Queue: "q", Argv: []string{"/bin/sh", "-c", "sleep 4; echo long"}})
		if err != nil {
			t.Fatal(err)
		}
		long = append(long, inv.InvocationID)
	}
	aID := ""
	waittest.Until(t, time.Minute, "ui-a runs an invocation", func() bool {
		w, ok := workerNamed(context.Background(), op, "ui-a")
		aID = w.WorkerID
		return ok && w.CurrentInvocations > 0
	})
	_ = syscall.Kill(a.cmd.Process.Pid, syscall.SIGKILL)
	evalEventually(t, ctx, time.Minute, "the killed worker reads stale",
		fmt.Sprintf(`!!document.querySelector('#workers tr.worker[data-worker=%q][data-state="stale"]')`, aID))
	evalEventually(t, ctx, 2*time.Minute, "the killed worker's attempts go on another lane (a hand-off line)",
		`document.querySelectorAll('#timeline line.handoff').length > 0`)
	for _, id := range long {
		if inv := waitTerminal(t, op, id, 2*time.Minute); inv.State != wire.StateSucceeded {
			t.Fatalf("%s after the kill: %s (%+v); want succeeded", id, inv.State, inv.Error)
		}
	}
	evalEventually(t, ctx, 10*time.Second, "the timeline shows the handed-back attempts",
		`document.querySelectorAll('#timeline rect.bar.handed-back').length > 0 && document.querySelectorAll('#timeline rect.bar.succeeded').length >= 10`)
	// The axis fits what happened (the first bar starts in the plot's
	// first quarter, not minutes after its left edge), and each bar's
	// title says when it started and ended, in UTC.
	evalEventually(t, ctx, 10*time.Second, "the timeline's axis fits its activity and its bars' titles hold UTC times",
		`(() => { const svg = document.querySelector('#timeline svg'), label = 170, plot = svg.viewBox.baseVal.width - label - 10;
		  const bars = [...document.querySelectorAll('#timeline rect.bar')];
		  const first = Math.min(...bars.map(b => b.x.baseVal.value));
		  return bars.length > 0 && first < label + plot / 4 &&
		    bars.every(b => /\d\d:\d\d:\d\dZ/.test(b.querySelector('title').textContent)); })()`)
	shot(t, ctx, "ui-timeline.png", "#timeline svg")
	shot(t, ctx, "ui-fleet.png", "")

	// An invocation's page: its output as it runs, without a reload; then
	// cancel it from there.
	victim, _, err := op.Submit(context.Background(), wire.SubmitRequest{Queue: "q", Argv: []string{"/bin/sh", "-c",
		"echo tick-1; sleep 3; echo tick-2; sleep 120"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(d.URL+"/ui/invocations/"+victim.InvocationID), chromedp.WaitVisible(chromedp.ID("stdout"))); err != nil {
		t.Fatalf("open the invocation page: %v", err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__noReload = 2; true`)); err != nil {
		t.Fatal(err)
	}
	evalEventually(t, ctx, time.Minute, "the page shows the first line of output",
		`document.getElementById('stdout').textContent.includes('tick-1')`)
	evalEventually(t, ctx, time.Minute, "then the second, without a reload",
		`document.getElementById('stdout').textContent.includes('tick-2') && window.__noReload === 2`)
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("cancel"))); err != nil {
		t.Fatalf("click cancel: %v", err)
	}
	if got := waitTerminal(t, op, victim.InvocationID, time.Minute); got.State != wire.StateCancelled {
		t.Fatalf("after the page's cancel: %s", got.State)
	}
	evalEventually(t, ctx, 30*time.Second, "the page shows it cancelled", `document.getElementById('inv-state').textContent === 'cancelled'`)

	// A POST without the CSRF token (the session cookie alone) is refused.
	other, _, err := op.Submit(context.Background(), wire.SubmitRequest{Queue: "nobody-serves-this", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	status, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf(
		`fetch('/ui/invocations/%s/cancel', {method: 'POST', credentials: 'same-origin'}).then(r => r.status)`, other.InvocationID),
		chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	if status != 403 {
		t.Errorf("a POST without the CSRF token answered %d, want 403", status)
	}
	if got, err := op.GetInvocation(context.Background(), other.InvocationID); err != nil || got.State != wire.StateQueued {
		t.Errorf("after the refused POST: %s %v; want still queued", got.State, err)
	}
}

// shot saves a screenshot of the element sel (the whole page for "") as
// bin/name, a test artifact.
func shot(t *testing.T, ctx context.Context, name, sel string) {
	t.Helper()
	act := chromedp.FullScreenshot(100) // 100: PNG
	if sel != "" {
		act = chromedp.Screenshot(chromedp.CSS(sel))
	}
	png, err := chromedp.Run(ctx, act)
	if err != nil {
		t.Errorf("screenshot %s: %v", name, err)
		return
	}
	dir := filepath.Join("..", "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Errorf("save %s: %v", name, err)
		return
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Errorf("save %s: %v", name, err)
	}
	t.Logf("screenshot: bin/%s (%d bytes)", name, len(png))
}
