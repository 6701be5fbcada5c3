package tests

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestWebViewOutput drives the invocation page's output in a real headless
// chromium over lakeshore dev and real nymphs, on one control plane: the
// output box follows a running body's newest line across refreshes, and
// keeps the reader's place once they scroll up; a body past the page's
// tail says how much earlier output it leaves out and links the whole
// stream, which downloads byte for byte; a coloured line reads in its
// colour with no escape left as text; attempt 1 of a SIGKILLed worker's
// invocation opens from its row while attempt 2 runs elsewhere.
func TestWebViewOutput(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	// A stale window of 6 s, as TestWebViewInABrowser's: the killed worker
	// reads stale soon, a live one on a loaded machine does not.
	d := startDev(t, backends[0], "--stale-after", "6s")
	op := d.Operator()
	a := startNymph(t, d, "out-a", "--capacity", "2")
	ctx := browser(t, exe)
	uiLogin(t, ctx, d)
	submit := func(t *testing.T, script string) string {
		t.Helper()
		inv, _, err := op.Submit(context.Background(), wire.SubmitRequest{Queue: "q", Argv: []string{"/bin/sh", "-c", script}})
		if err != nil {
			t.Fatal(err)
		}
		return inv.InvocationID
	}
	open := func(t *testing.T, path string) {
		t.Helper()
		if err := chromedp.Do(ctx, chromedp.Navigate(d.URL+path), chromedp.WaitVisible(chromedp.ID("stdout"))); err != nil {
			t.Fatalf("open %s: %v", path, err)
		}
	}
	eval := func(t *testing.T, js string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](js, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return v
	}

	t.Run("follows the newest line", func(t *testing.T) {
		id := submit(t, `i=0; while [ $i -lt 900 ]; do i=$((i+1)); echo "tick $i"; sleep 0.1; done`)
		t.Cleanup(func() { _, _ = op.CancelInvocation(context.Background(), id) })
		open(t, "/ui/invocations/"+id)
		const box = `document.getElementById('stdout')`
		const last = `(+(` + box + `.textContent.trim().split('\n').pop().split(' ')[1]) || 0)`
		const atEnd = `(` + box + `.scrollHeight - ` + box + `.clientHeight - ` + box + `.scrollTop <= 4)`
		evalEventually(t, ctx, time.Minute, "the output overflows its box",
			box+`.scrollHeight > `+box+`.clientHeight + 100`)
		// A refresh that brings newer lines leaves the box at its end.
		for range 2 {
			mark := eval(t, `window.__seen = `+last+`; String(window.__seen)`)
			evalEventually(t, ctx, 30*time.Second, "newer lines than tick "+mark+" shown, the box at its end",
				last+` > window.__seen && `+atEnd)
		}
		// Scrolled up, the reader keeps their place across refreshes that
		// bring newer lines.
		top := eval(t, box+`.scrollTop = 30; window.__seen = `+last+`; String(`+box+`.scrollTop)`)
		for range 2 {
			evalEventually(t, ctx, 30*time.Second, "newer lines shown", last+` > window.__seen`)
			if got := eval(t, `window.__seen = `+last+`; String(`+box+`.scrollTop)`); got != top {
				t.Fatalf("scrolled to %s, the box is at %s after a refresh", top, got)
			}
		}
		// Back at the end, it follows again.
		eval(t, box+`.scrollTop = `+box+`.scrollHeight; window.__seen = `+last+`; ''`)
		evalEventually(t, ctx, 30*time.Second, "newer lines shown, the box at its end again", last+` > window.__seen && `+atEnd)
	})

	t.Run("says what it leaves out and downloads the whole", func(t *testing.T) {
		script := `seq 1 25000 | sed 's/^/row /'; printf '\033[31mRED LINE\033[0m plain\n'`
		want, err := exec.Command("/bin/sh", "-c", script).Output()
		if err != nil {
			t.Fatal(err)
		}
		id := submit(t, script)
		if inv := waitTerminal(t, op, id, time.Minute); inv.State != wire.StateSucceeded {
			t.Fatalf("the body: %s", inv.State)
		}
		open(t, "/ui/invocations/"+id)
		// nymph ships the last of it just after its ack.
		waittest.Until(t, 30*time.Second, "the whole output downloads from the stdout link", func() bool {
			return eval(t, `(async () => { const a = document.getElementById('stdout-download'); if (!a) return '';
				return String((await (await fetch(a.href, {credentials: 'same-origin'})).text()).length); })()`) == fmt.Sprint(len(want))
		})
		got := eval(t, `(async () => (await fetch(document.getElementById('stdout-download').href, {credentials: 'same-origin'})).text())()`)
		if got != string(want) {
			t.Fatalf("the download: %d bytes, starting %q, ending %q; want the %d bytes the body printed", len(got),
				got[:min(len(got), 20)], got[max(0, len(got)-30):], len(want))
		}
		// The page may have loaded before the last chunks: a refresh brings them.
		evalEventually(t, ctx, 30*time.Second, "the box shows the last line",
			`document.getElementById('stdout').textContent.endsWith('RED LINE plain\n')`)
		note := eval(t, `(document.getElementById('stdout-omitted') || {}).textContent || ''`)
		m := regexp.MustCompile(`^([0-9.]+) KiB of earlier output not shown$`).FindStringSubmatch(note)
		shown := eval(t, `document.getElementById('stdout').textContent`)
		var kib float64
		if m != nil {
			_, _ = fmt.Sscan(m[1], &kib)
		}
		// The note counts what precedes the box: the stream less what it
		// shows (less the escapes the box shows as colour).
		before := float64(len(want)-len(shown)-len("\x1b[31m\x1b[0m")) / 1024
		if m == nil || kib < before-0.1 || kib > before+0.1 {
			t.Errorf("the note on what is left out reads %q; want about %.1f KiB", note, before)
		}
		if !regexp.MustCompile(`^row \d+\n`).MatchString(shown) || !strings.HasSuffix(shown, "RED LINE plain\n") {
			t.Errorf("the box starts %q and ends %q: want whole lines to the last", shown[:min(len(shown), 20)], shown[max(0, len(shown)-20):])
		}
		if strings.Contains(shown, "[31m") || strings.Contains(shown, `\x1b`) {
			t.Errorf("an escape shows as text in the box")
		}
		rgb := eval(t, `(() => { const s = [...document.querySelectorAll('#stdout span')].find(e => e.textContent === 'RED LINE');
			return s ? getComputedStyle(s).color : 'no span'; })()`)
		var r, g, b int
		if _, err := fmt.Sscanf(rgb, "rgb(%d, %d, %d)", &r, &g, &b); err != nil || r < 150 || g > 90 || b > 90 {
			t.Errorf("the red line's colour is %q, want a red", rgb)
		}
		shot(t, ctx, "ui-invocation-output.png", "")
	})

	t.Run("attempt 1 of a lost worker opens from its row", func(t *testing.T) {
		dir := t.TempDir()
		id := submit(t, fmt.Sprintf(`if [ -e %[1]s ]; then echo second-attempt; else touch %[1]s; echo first-attempt; fi; sleep 30`,
			filepath.Join(dir, "ran")))
		waittest.Until(t, time.Minute, "attempt 1 shipped its line", func() bool {
			page, err := op.Logs(context.Background(), id, 1, 0)
			return err == nil && len(page.Chunks) > 0 && strings.Contains(string(page.Chunks[0].Data), "first-attempt")
		})
		startNymph(t, d, "out-b", "--capacity", "2")
		_ = syscall.Kill(a.cmd.Process.Pid, syscall.SIGKILL)
		waittest.Until(t, 2*time.Minute, "attempt 2 runs on out-b", func() bool {
			page, err := op.Logs(context.Background(), id, 2, 0)
			return err == nil && len(page.Chunks) > 0
		})
		t.Cleanup(func() { _, _ = op.CancelInvocation(context.Background(), id) })
		open(t, "/ui/invocations/"+id)
		evalEventually(t, ctx, 30*time.Second, "the page shows attempt 2's output",
			`document.getElementById('output-attempt').textContent === '2' && document.getElementById('stdout').textContent.includes('second-attempt')`)
		if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`tr.attempt[data-attempt="1"] a.attempt-output`)),
			chromedp.WaitVisible(chromedp.ID("output-latest"))); err != nil {
			t.Fatalf("open attempt 1's output from its row: %v", err)
		}
		const first = `document.getElementById('output-attempt').textContent === '1' && document.getElementById('stdout').textContent.trim() === 'first-attempt'`
		evalEventually(t, ctx, 10*time.Second, "the page shows attempt 1's output", first)
		mark := eval(t, `document.body.getAttribute('data-refreshed') || ''`)
		evalEventually(t, ctx, 30*time.Second, "still attempt 1's after a refresh",
			fmt.Sprintf(`(document.body.getAttribute('data-refreshed') || '') !== %q && %s`, mark, first))
	})
}
