package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// drainNoticeBound is how soon after SIGTERM to nymph a body must have
// heard the drain. It is generous for a shared machine: the figure each run
// measured is logged (docs/lifecycle.md quotes them).
const drainNoticeBound = 2 * time.Second

// lifecycleBody is a body under test: the checkpoint example, or a shell
// body that hears the drain by its drain_signal.
type lifecycleBody struct {
	name string
	argv []string
	env  map[string]string
	rc   wire.RunConfig
}

// lifecycleBodies are the example in Go and in Python, and a shell body
// that uses run_config.drain_signal and requeue_exit_codes alone.
func lifecycleBodies(tb testing.TB) []lifecycleBody {
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			tb.Fatal(err)
		}
		return a
	}
	shBody := `if [ "$NYMPH_ATTEMPT" -gt 1 ]; then echo "attempt $NYMPH_ATTEMPT: resumed"; exit 0; fi
trap 'date -u +%Y-%m-%dT%H:%M:%S.%NZ > "$CHECKPOINT_DIR/usr1"; exit 75' USR1
echo "attempt $NYMPH_ATTEMPT: phase ready"
while :; do sleep 0.05; done`
	return []lifecycleBody{
		{name: "go", argv: []string{bin(tb, "checkpoint")}},
		{name: "python", argv: []string{"python3", abs("../examples/lifecycle/checkpoint.py")},
			env: map[string]string{"PYTHONPATH": abs("../python"), "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}},
		{name: "shell", argv: []string{"/bin/sh", "-c", shBody},
			rc: wire.RunConfig{DrainSignal: "SIGUSR1", RequeueExitCodes: []int{75}}},
	}
}

// handBack is what one drain of a lifecycle body showed.
type handBack struct {
	inv       wire.Invocation // as submitted
	notice    time.Duration   // from SIGTERM to nymph to the body hearing the drain
	exited    time.Duration   // from SIGTERM to nymph's exit
	savedStep int             // the step the checkpoint saved (0: the shell body keeps none)
}

// drainBody submits body c on queue, runs it on a nymph with a 60 s
// grace until it works, SIGTERMs that nymph and waits for it to exit 0
// (the hand-back ends the drain early), and reads what the body saved
// in ckDir.
func drainBody(tb testing.TB, d *devServer, c lifecycleBody, queue, ckDir string) handBack {
	tb.Helper()
	env := map[string]string{"CHECKPOINT_DIR": ckDir, "STEPS": "400", "STEP_MS": "25"}
	for k, v := range c.env {
		env[k] = v
	}
	inv, _, err := d.Operator().Submit(context.Background(), wire.SubmitRequest{Queue: queue, Argv: c.argv, Env: env, RunConfig: c.rc, MaxAttempts: 3})
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	a := startNymphIn(tb, d, queue+"-a", dir, "--queue", queue, "--grace", "60s")
	stdout := filepath.Join(dir, "work", inv.InvocationID, "1", "stdout.log")
	want := "phase ready"
	if c.name != "shell" {
		want = "step 10\n" // a few steps in, so the checkpoint has something to save
	}
	waittest.Until(tb, time.Minute, "attempt 1 reads phase ready and works", func() bool {
		b, _ := os.ReadFile(stdout)
		return strings.Contains(string(b), "phase ready") && strings.Contains(string(b), want)
	})

	sigterm := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		tb.Fatal(err)
	}
	if code := a.wait(tb, 50*time.Second); code != 0 {
		tb.Fatalf("nymph exited %d after the hand-back, want 0", code)
	}
	hb := handBack{inv: inv, exited: time.Since(sigterm)}
	var seen time.Time
	if c.name == "shell" {
		b, err := os.ReadFile(filepath.Join(ckDir, "usr1"))
		if err != nil {
			tb.Fatalf("the drain signal did not reach the body: %v", err)
		}
		if seen, err = time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b))); err != nil {
			tb.Fatal(err)
		}
	} else {
		var ck struct {
			Step        int    `json:"step"`
			Attempt     int    `json:"attempt"`
			DrainSeenAt string `json:"drain_seen_at"`
		}
		b, err := os.ReadFile(filepath.Join(ckDir, "checkpoint.json"))
		if err != nil || json.Unmarshal(b, &ck) != nil {
			tb.Fatalf("no checkpoint after the drain: %v %q", err, b)
		}
		if ck.Step < 10 || ck.Attempt != 1 {
			tb.Fatalf("checkpoint %+v: want attempt 1 past step 10", ck)
		}
		hb.savedStep = ck.Step
		if seen, err = time.Parse(time.RFC3339Nano, ck.DrainSeenAt); err != nil {
			tb.Fatalf("drain_seen_at %q: %v", ck.DrainSeenAt, err)
		}
	}
	hb.notice = seen.Sub(sigterm)
	return hb
}

// TestBodiesSeeTheLifecycle: the runnable example of docs/lifecycle.md, in
// Go and in Python, under real nymph processes. Each body reads phase
// ready; SIGTERM to its nymph drains it, and the body hears it inside the
// grace window, saves a checkpoint where the next attempt reaches it and
// asks to be handed back; nymph exits long before the grace is over; the
// invocation is queued again (attempt 1 ended requeued, nothing counted),
// and its next attempt, on another nymph, resumes from the checkpoint and
// succeeds; done_count moves once. A shell body does the same with
// run_config.drain_signal and requeue_exit_codes alone.
func TestBodiesSeeTheLifecycle(t *testing.T) {
	d := startDev(t, backends[0])
	op := d.Operator()
	for _, c := range lifecycleBodies(t) {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			queue := "lc-" + c.name
			hb := drainBody(t, d, c, queue, t.TempDir())
			// The grace is 60 s: an exit well inside it is the body's
			// hand-back ending the drain early.
			t.Logf("%s: the body heard the drain %s after SIGTERM to nymph; nymph exited after %s (grace 60s)",
				c.name, hb.notice.Round(100*time.Microsecond), hb.exited.Round(time.Millisecond))
			if hb.notice < 0 || hb.notice > drainNoticeBound {
				t.Errorf("the body heard the drain %s after SIGTERM; want within %s", hb.notice, drainNoticeBound)
			}
			if hb.exited > 30*time.Second {
				t.Errorf("nymph exited %s after SIGTERM: the hand-back did not end the drain early", hb.exited)
			}
			id := hb.inv.InvocationID

			back, err := op.GetInvocation(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if back.State != wire.StateQueued || len(back.Attempts) != 1 || back.Attempts[0].Outcome != string(domain.EndRequeued) || back.Attempts[0].Recorded {
				t.Fatalf("after the hand-back: %s, attempts %+v; want queued, attempt 1 ended requeued", back.State, back.Attempts)
			}
			if stats, err := op.QueueStats(ctx, queue); err != nil || stats.DoneCount != 0 {
				t.Fatalf("done_count after the hand-back: %+v %v; want 0", stats, err)
			}

			startNymph(t, d, queue+"-b", "--queue", queue)
			final := waitTerminal(t, op, id, 2*time.Minute)
			if final.State != wire.StateSucceeded || final.Attempt != 2 {
				t.Fatalf("the next attempt: %s attempt %d (%+v); want succeeded on attempt 2", final.State, final.Attempt, final.Error)
			}
			if c.name != "shell" {
				var res struct {
					ResumedFrom int `json:"resumed_from"`
				}
				if err := json.Unmarshal(final.ResultBlob, &res); err != nil || res.ResumedFrom != hb.savedStep {
					t.Fatalf("result %s: want resumed_from %d", final.ResultBlob, hb.savedStep)
				}
			} else if !strings.Contains(final.StdoutTail, "resumed") {
				t.Fatalf("attempt 2's output: %q", final.StdoutTail)
			}
			if final.Attempts[0].Outcome != string(domain.EndRequeued) || !final.Attempts[1].Recorded || final.Attempts[0].WorkerID == final.Attempts[1].WorkerID {
				t.Fatalf("history: %+v; want attempt 1 requeued on one worker, attempt 2 recorded on another", final.Attempts)
			}
			stats, err := op.QueueStats(ctx, queue)
			if err != nil || stats.DoneCount != 1 || stats.Counts[wire.StateSucceeded] != 1 {
				t.Fatalf("queue stats at the end: %+v %v; want done_count 1, one success", stats, err)
			}
		})
	}
}

// BenchmarkDrainNotice measures, with real nymph processes, how soon after
// SIGTERM to nymph each body hears the drain (target: within 100 ms), and
// how soon nymph exits once the body handed itself back (grace 60 s).
//
//	go test -run '^$' -bench DrainNotice -benchtime 3x ./tests/
func BenchmarkDrainNotice(b *testing.B) {
	d := startDev(b, backends[0])
	for _, c := range lifecycleBodies(b) {
		b.Run(c.name, func(b *testing.B) {
			var notice, exited time.Duration
			for i := range b.N {
				hb := drainBody(b, d, c, fmt.Sprintf("bench-%s-%d", c.name, i), b.TempDir())
				notice += hb.notice
				exited += hb.exited
			}
			b.ReportMetric(float64(notice.Microseconds())/1000/float64(b.N), "ms-to-notice")
			b.ReportMetric(float64(exited.Milliseconds())/float64(b.N), "ms-to-exit")
		})
	}
}

// httpStatus GETs url from the test process and reports the status.
func httpStatus(t *testing.T, url string) int {
	t.Helper()
	return httpDo(t, http.MethodGet, url, "")
}

// httpDo sends method to url from the test process, with body (none when
// empty), and reports the status.
func httpDo(t *testing.T, method, url, body string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// peekAs runs the peek helper (testdata/peek) with args as uid (and
// gid) and reports its output.
func peekAs(t *testing.T, uid uint32, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin(t, "peek"), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err
}

// TestLifecycleViewIsTheRunsOwn: a run's view answers its own processes
// only. Another invocation's body on the same nymph, which read the URL out
// of the first body's environment (/proc/<pid>/environ: the same uid), is
// refused; so are a process of another uid and a --run-as body of another
// nymph; the first body itself reads its view.
func TestLifecycleViewIsTheRunsOwn(t *testing.T) {
	t.Parallel()
	d := startDev(t, backends[0])
	op := d.Operator()
	ctx := context.Background()
	shared := searchableTempDir(t) // a --run-as body reads the files it is told of
	peek := bin(t, "peek")
	// X: the run whose view the others try to read. It reads its own,
	// then sleeps until cancelled.
	x, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "iso", Argv: []string{"/bin/sh", "-c",
		`"$PEEK" "$NYMPH_LIFECYCLE_URL" > "$D/x.own"; echo $$ > "$D/x.pid"; while :; do sleep 0.1; done`},
		Env: map[string]string{"D": shared, "PEEK": peek}})
	if err != nil {
		t.Fatal(err)
	}
	startNymph(t, d, "iso", "--queue", "iso", "--capacity", "2")
	pidFile := filepath.Join(shared, "x.pid")
	waittest.Until(t, time.Minute, "body X running", func() bool { _, err := os.Stat(pidFile); return err == nil })
	b, _ := os.ReadFile(pidFile)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if own, _ := os.ReadFile(filepath.Join(shared, "x.own")); strings.TrimSpace(string(own)) != "200" {
		t.Fatalf("body X reading its own view: %q, want 200", own)
	}
	environ, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	var url string
	for _, kv := range strings.Split(string(environ), "\x00") {
		if v, ok := strings.CutPrefix(kv, "NYMPH_LIFECYCLE_URL="); ok {
			url = v
		}
	}
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("body X has no loopback NYMPH_LIFECYCLE_URL")
	}
	if err := os.WriteFile(filepath.Join(shared, "x.url"), []byte(url), 0o644); err != nil {
		t.Fatal(err)
	}

	// Y: another invocation on the same nymph, with the same uid.
	y, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "iso", Argv: []string{"/bin/sh", "-c",
		`"$PEEK" "$(cat "$D/x.url")"; "$PEEK" "$(cat "$D/x.url")/requeue" POST`},
		Env: map[string]string{"D": shared, "PEEK": peek}})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitTerminal(t, op, y.InvocationID, time.Minute); got.State != wire.StateSucceeded || strings.Join(strings.Fields(got.StdoutTail), " ") != "403 403" {
		t.Fatalf("another run reading X's view and asking to requeue it: %s %q; want 403 and 403", got.State, got.StdoutTail)
	}

	// The test process itself: not a process of the run.
	if code := httpStatus(t, url); code != 403 {
		t.Errorf("a process outside the run reading X's view: %d, want 403", code)
	}
	if os.Geteuid() == 0 {
		// Another uid, and a --run-as body of another nymph.
		if out, err := peekAs(t, 65534, url); err != nil || out != "403" {
			t.Errorf("uid 65534 reading X's view: %q %v, want 403", out, err)
		}
		z, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "iso-run-as", Argv: []string{"/bin/sh", "-c",
			`id -u; "$PEEK" "$(cat "$D/x.url")"`}, Env: map[string]string{"D": shared, "PEEK": peek}})
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		startNymphIn(t, d, "iso-run-as", dir, "--queue", "iso-run-as", "--run-as", "nobody")
		got := waitTerminal(t, op, z.InvocationID, time.Minute)
		if f := strings.Fields(got.StdoutTail); got.State != wire.StateSucceeded || len(f) != 2 || f[0] != "65534" || f[1] != "403" {
			t.Errorf("a --run-as body of another nymph reading X's view: %s %q; want uid 65534, 403", got.State, got.StdoutTail)
		}
	} else {
		t.Log("not root: the other-uid cases need root (CI runs as root)")
	}
	if inv, err := op.GetInvocation(ctx, x.InvocationID); err != nil || inv.State != wire.StateRunning || inv.Attempt != 1 {
		t.Fatalf("X after the others' tries: %+v %v; want still running attempt 1", inv, err)
	}
	if _, err := op.CancelInvocation(ctx, x.InvocationID); err != nil {
		t.Fatal(err)
	}
	if got := waitTerminal(t, op, x.InvocationID, time.Minute); got.State != wire.StateCancelled {
		t.Fatalf("X after the operator's cancel: %s", got.State)
	}
}
