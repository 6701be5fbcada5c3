package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// runnerTestHelperEnv switches the test binary into a body: the runner
// re-executes it with this variable set (STYLE: test subprocesses by
// re-running the test binary).
const runnerTestHelperEnv = "LAKESHORE_RUNNER_TEST_HELPER"

// runnerTestWait bounds every wait. It is generous on purpose: the tests
// assert what happened, never how fast.
const runnerTestWait = 10 * time.Second

const runnerTestKillAfter = 200 * time.Millisecond

// TestRunnerHelperProcess is not a test: it is the body the env test runs.
// Without the switch it returns at once.
func TestRunnerHelperProcess(t *testing.T) {
	switch os.Getenv(runnerTestHelperEnv) {
	case "":
		return
	case "env":
		env := os.Environ()
		b, err := json.Marshal(env)
		if err == nil {
			err = os.WriteFile(os.Getenv("NYMPH_RESULT_FILE"), b, 0o600)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	default:
		os.Exit(2)
	}
}

func runnerTestBaseEnv() []string {
	return []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/nonexistent", "LANG=C.UTF-8"}
}

func runnerTestNew(t *testing.T, mods ...func(*RunnerConfig)) *Runner {
	t.Helper()
	cfg := RunnerConfig{
		Workdir:   t.TempDir(),
		KillAfter: runnerTestKillAfter,
		BaseEnv:   runnerTestBaseEnv(),
		WorkerID:  "wrk_test",
		Logger:    slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, m := range mods {
		m(&cfg)
	}
	return NewRunner(cfg)
}

func runnerTestSh(script string) []string { return []string{"/bin/sh", "-c", script} }

// runnerTestStart starts inv and makes sure the run is over before the test
// (and its temporary directory) goes away.
func runnerTestStart(t *testing.T, r *Runner, inv wire.RunInvocation) *Run {
	t.Helper()
	if inv.Attempt == 0 {
		inv.Attempt = 1
	}
	run := r.Start(inv)
	t.Cleanup(func() {
		run.Kill()
		select {
		case <-run.Done():
		case <-time.After(runnerTestWait):
			t.Errorf("run %s did not end after Kill", inv.InvocationID)
		}
	})
	return run
}

func runnerTestOutcome(t *testing.T, run *Run) Outcome {
	t.Helper()
	select {
	case <-run.Done():
	case <-time.After(runnerTestWait):
		t.Fatalf("run %s not done after %s", run.InvocationID(), runnerTestWait)
	}
	select {
	case <-run.Started():
	default:
		t.Fatalf("Done closed before Started")
	}
	return run.Outcome()
}

func runnerTestDir(r *Runner, inv wire.RunInvocation) string {
	attempt := inv.Attempt
	if attempt == 0 {
		attempt = 1
	}
	return filepath.Join(r.cfg.Workdir, inv.InvocationID, fmt.Sprint(attempt))
}

// runnerTestWaitFile waits for a body to write path (a line ending in a
// newline) and reports its content without the newline.
func runnerTestWaitFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(runnerTestWait)
	for {
		b, err := os.ReadFile(path)
		if err == nil && bytes.HasSuffix(b, []byte("\n")) {
			return strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not written within %s (err %v)", path, runnerTestWait, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func runnerTestPid(t *testing.T, path string) int {
	t.Helper()
	var pid int
	if _, err := fmt.Sscan(runnerTestWaitFile(t, path), &pid); err != nil || pid <= 1 {
		t.Fatalf("pid file %s: %v (pid %d)", path, err, pid)
	}
	return pid
}

// runnerTestProcessGone reports whether pid has exited. A zombie counts as
// gone: it runs nothing, and init in a container may never reap it.
func runnerTestProcessGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, fs.ErrNotExist)
	}
	i := bytes.LastIndexByte(b, ')')
	fields := strings.Fields(string(b[i+1:]))
	return len(fields) > 0 && (fields[0] == "Z" || fields[0] == "X")
}

func runnerTestAssertGone(t *testing.T, what string, pid int) {
	t.Helper()
	deadline := time.Now().Add(runnerTestWait)
	for !runnerTestProcessGone(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("%s (pid %d) still running %s after the run ended", what, pid, runnerTestWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func runnerTestExitCode(t *testing.T, o Outcome, want int) {
	t.Helper()
	if o.ExitCode == nil {
		t.Fatalf("ExitCode = nil, want %d (outcome %+v)", want, o)
	}
	if *o.ExitCode != want {
		t.Fatalf("ExitCode = %d, want %d (outcome %+v)", *o.ExitCode, want, o)
	}
}

func runnerTestError(t *testing.T, o Outcome, wantType, wantInMessage string) {
	t.Helper()
	if o.Error == nil {
		t.Fatalf("Error = nil, want type %q (outcome %+v)", wantType, o)
	}
	if o.Error.Type != wantType || !strings.Contains(o.Error.Message, wantInMessage) {
		t.Fatalf("Error = %+v, want type %q with message containing %q", *o.Error, wantType, wantInMessage)
	}
}

// runnerTestClock steps one second on every reading, so a duration measured
// with one reading at each end is exactly one second.
type runnerTestClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *runnerTestClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Second)
	return c.now
}

func TestRunSucceedsWithTailsAndResult(t *testing.T) {
	t.Parallel()
	clk := &runnerTestClock{now: time.Unix(1700000000, 0)}
	r := runnerTestNew(t, func(c *RunnerConfig) { c.Now = clk.Now })
	inv := wire.RunInvocation{InvocationID: "inv_ok", Attempt: 2, Argv: runnerTestSh(
		`echo out; echo err >&2; printf '{"ok": true,  "n": [1, 2], "html": "<b>"}\n' > "$NYMPH_RESULT_FILE"`)}
	run := runnerTestStart(t, r, inv)
	if run.InvocationID() != "inv_ok" || run.Attempt() != 2 {
		t.Fatalf("InvocationID, Attempt = %q, %d", run.InvocationID(), run.Attempt())
	}
	select {
	case <-run.Started():
	case <-time.After(runnerTestWait):
		t.Fatal("Started not closed")
	}
	o := runnerTestOutcome(t, run)
	if o.State != wire.StateSucceeded || o.Abandoned || o.Error != nil {
		t.Fatalf("outcome = %+v, want succeeded without error", o)
	}
	runnerTestExitCode(t, o, 0)
	if o.StdoutTail != "out\n" || o.StderrTail != "err\n" {
		t.Errorf("tails = %q, %q", o.StdoutTail, o.StderrTail)
	}
	// Compact and HTML-escaped: the form json.Marshal sends in the ack.
	if want := `{"ok":true,"n":[1,2],"html":"\u003cb\u003e"}`; string(o.ResultBlob) != want {
		t.Errorf("ResultBlob = %s, want %s", o.ResultBlob, want)
	}
	if o.Duration != time.Second {
		t.Errorf("Duration = %s, want 1s from the injected clock", o.Duration)
	}
	ack, err := json.Marshal(o.Ack("wrk_test", "inv_ok", 2))
	if err != nil || !bytes.Contains(ack, o.ResultBlob) {
		t.Errorf("ack %s does not carry the result blob unchanged (err %v)", ack, err)
	}

	dir := runnerTestDir(r, inv)
	for _, d := range []string{dir, filepath.Dir(dir)} {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v err %v, want 0700", d, fi.Mode().Perm(), err)
		}
	}
	for name, want := range map[string]string{StdoutFileName: "out\n", StderrFileName: "err\n"} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(b) != want {
			t.Errorf("%s = %q (err %v), want %q", name, b, err, want)
		}
	}
	// A stop after the end changes nothing.
	run.Cancel()
	run.Kill()
	if o2 := run.Outcome(); o2.State != wire.StateSucceeded || o2.Abandoned {
		t.Errorf("outcome after late Cancel/Kill = %+v", o2)
	}
}

func TestRunEndings(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		argv       []string
		wantType   string
		wantMsg    string
		wantCode   *int
		wantStderr string
	}{
		"exit status": {
			argv: runnerTestSh("echo bye >&2; exit 3"), wantType: ErrorTypeExitCode,
			wantMsg: "exited with status 3", wantCode: runnerTestInt(3), wantStderr: "bye\n",
		},
		"signal": {
			argv: runnerTestSh("kill -KILL $$"), wantType: ErrorTypeSignal,
			wantMsg: "killed by SIGKILL", wantCode: runnerTestInt(128 + 9),
		},
		"not found": {
			argv: []string{"runner-test-no-such-binary"}, wantType: ErrorTypeStartFailed, wantMsg: "not found in PATH",
		},
		"not executable": {
			argv: []string{"/dev/null"}, wantType: ErrorTypeStartFailed, wantMsg: "start the body",
		},
		"empty argv": {
			argv: nil, wantType: ErrorTypeStartFailed, wantMsg: "argv is empty",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := runnerTestNew(t)
			o := runnerTestOutcome(t, runnerTestStart(t, r, wire.RunInvocation{InvocationID: "inv_end", Argv: tc.argv}))
			if o.State != wire.StateFailed || o.Abandoned {
				t.Fatalf("outcome = %+v, want failed", o)
			}
			runnerTestError(t, o, tc.wantType, tc.wantMsg)
			if tc.wantCode == nil {
				if o.ExitCode != nil {
					t.Errorf("ExitCode = %d, want none", *o.ExitCode)
				}
			} else {
				runnerTestExitCode(t, o, *tc.wantCode)
			}
			if o.StderrTail != tc.wantStderr {
				t.Errorf("StderrTail = %q, want %q", o.StderrTail, tc.wantStderr)
			}
		})
	}
}

func TestRunSetupRunsInOrderBeforeTheBody(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	inv := wire.RunInvocation{InvocationID: "inv_setup", Argv: runnerTestSh("cat order; echo body"),
		RunConfig: wire.RunConfig{RunSetup: []string{
			"echo one >> order",
			`test "$NYMPH_INVOCATION_ID" = inv_setup && echo two >> order`,
			"echo setup-output",
		}}}
	o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
	if o.State != wire.StateSucceeded {
		t.Fatalf("outcome = %+v", o)
	}
	// Setup output goes to the same logs as the body's.
	if want := "setup-output\none\ntwo\nbody\n"; o.StdoutTail != want {
		t.Errorf("StdoutTail = %q, want %q", o.StdoutTail, want)
	}
}

func TestRunSetupFailureStopsTheRun(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	inv := wire.RunInvocation{InvocationID: "inv_setup_fail", Argv: runnerTestSh("touch body-ran"),
		RunConfig: wire.RunConfig{RunSetup: []string{"true", "echo broken >&2; exit 4", "touch third-ran"}}}
	run := runnerTestStart(t, r, inv)
	o := runnerTestOutcome(t, run)
	if o.State != wire.StateFailed {
		t.Fatalf("outcome = %+v, want failed", o)
	}
	runnerTestError(t, o, ErrorTypeRunSetupFailed, "run_setup[1] exited with status 4")
	runnerTestExitCode(t, o, 4)
	if o.StderrTail != "broken\n" {
		t.Errorf("StderrTail = %q", o.StderrTail)
	}
	dir := runnerTestDir(r, inv)
	for _, f := range []string{"body-ran", "third-ran"} {
		if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s exists (err %v): a failed setup must stop the run", f, err)
		}
	}
}

// TestRunEnvIsExactlyTheCleanEnvironment runs the test binary itself as the
// body and compares its whole environment.
func TestRunEnvIsExactlyTheCleanEnvironment(t *testing.T) {
	// Not parallel: Setenv.
	t.Setenv("NYMPH_ENROLL_TOKEN", "runner-test-secret")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "runner-test-secret")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r := runnerTestNew(t, func(c *RunnerConfig) { c.BaseEnv = append(c.BaseEnv, "SHARED=base", "malformed") })
	inv := wire.RunInvocation{
		InvocationID: "inv_env", Attempt: 3,
		Argv: []string{exe, "-test.run=^TestRunnerHelperProcess$"},
		Env:  map[string]string{"BOTH": "inv", runnerTestHelperEnv: "env", "NYMPH_WORKER_ID": "spoofed"},
		RunConfig: wire.RunConfig{
			Env: map[string]string{"SHARED": "rc", "RC_ONLY": "1", "BOTH": "rc"},
			RunSetup: []string{
				`test -z "${NYMPH_ENROLL_TOKEN+set}" || { echo setup saw the token >&2; exit 9; }`,
				`test "$BOTH" = inv && test "$NYMPH_ATTEMPT" = 3`,
			},
		},
	}
	o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
	if o.State != wire.StateSucceeded {
		t.Fatalf("outcome = %+v", o)
	}
	var got []string
	if err := json.Unmarshal(o.ResultBlob, &got); err != nil {
		t.Fatalf("result blob %s: %v", o.ResultBlob, err)
	}
	dir := runnerTestDir(r, inv)
	want := []string{
		"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/nonexistent", "LANG=C.UTF-8",
		"SHARED=rc", "RC_ONLY=1", "BOTH=inv", runnerTestHelperEnv + "=env",
		"NYMPH_INVOCATION_ID=inv_env", "NYMPH_ATTEMPT=3", "NYMPH_WORKER_ID=wrk_test",
		"NYMPH_WORKDIR=" + dir, "NYMPH_RESULT_FILE=" + filepath.Join(dir, "result.json"),
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("body env:\n got %q\nwant %q", got, want)
	}
	for _, kv := range got {
		if strings.Contains(kv, "runner-test-secret") {
			t.Errorf("the body saw a secret of the daemon's environment: %q", kv)
		}
	}

	// Exec gets BaseEnv alone.
	code, tail, _, err := r.Exec(context.Background(), runnerTestSh(`echo "token=${NYMPH_ENROLL_TOKEN-unset} aws=${AWS_SECRET_ACCESS_KEY-unset} shared=$SHARED"`), t.TempDir())
	if err != nil || code != 0 || tail != "token=unset aws=unset shared=base\n" {
		t.Errorf("Exec env: code %d tail %q err %v", code, tail, err)
	}
}

func TestRunnerDefaultBaseEnv(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		env  map[string]string
		want []string
	}{
		"keeps only the clean keys": {
			env: map[string]string{
				"PATH": "/opt/bin:/usr/bin", "HOME": "/home/n", "LANG": "C.UTF-8", "LC_ALL": "C",
				"TMPDIR": "/scratch", "USER": "n", "LOGNAME": "n",
				"NYMPH_ENROLL_TOKEN": "secret", "NYMPH_QUEUE": "q", "AWS_SECRET_ACCESS_KEY": "secret", "SHELL": "/bin/zsh",
			},
			want: []string{"PATH=/opt/bin:/usr/bin", "HOME=/home/n", "LANG=C.UTF-8", "LC_ALL=C", "TMPDIR=/scratch", "USER=n", "LOGNAME=n"},
		},
		"default PATH when unset": {
			env:  map[string]string{"NYMPH_ENROLL_TOKEN": "secret"},
			want: []string{"PATH=" + fallbackPath},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := DefaultBaseEnv(func(k string) string { return tc.env[k] })
			if !slices.Equal(got, tc.want) {
				t.Errorf("DefaultBaseEnv = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRunTimeoutSendsSIGTERM(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	// The trap proves SIGTERM arrived (not SIGKILL) and runs the body's own
	// shutdown, whose exit status the outcome keeps.
	inv := wire.RunInvocation{InvocationID: "inv_timeout", TimeoutS: 1,
		Argv: runnerTestSh(`trap 'echo got TERM; exit 7' TERM; sleep 30 & wait`)}
	o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
	if o.State != wire.StateFailed || o.Abandoned {
		t.Fatalf("outcome = %+v, want failed", o)
	}
	runnerTestError(t, o, ErrorTypeTimeout, "timed out after 1s (timeout_s 1)")
	runnerTestExitCode(t, o, 7)
	if o.StdoutTail != "got TERM\n" {
		t.Errorf("StdoutTail = %q, want the TERM trap's output", o.StdoutTail)
	}
}

func TestRunTimeoutCoversRunSetup(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	inv := wire.RunInvocation{InvocationID: "inv_timeout_setup", TimeoutS: 1, Argv: runnerTestSh("touch body-ran"),
		RunConfig: wire.RunConfig{RunSetup: []string{"sleep 30"}}}
	o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
	runnerTestError(t, o, ErrorTypeTimeout, "during run_setup[0]")
	if _, err := os.Stat(filepath.Join(runnerTestDir(r, inv), "body-ran")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the body ran after its setup timed out (err %v)", err)
	}
}

// TestRunIgnoringSIGTERMIsKilled covers the escalation: a body and its
// child that ignore SIGTERM get SIGKILL once KillAfter has passed.
func TestRunIgnoringSIGTERMIsKilled(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	inv := wire.RunInvocation{InvocationID: "inv_stubborn",
		Argv: runnerTestSh(`trap '' TERM; sleep 60 & echo $! > child; echo $$ > pid; wait`)}
	run := runnerTestStart(t, r, inv)
	dir := runnerTestDir(r, inv)
	pid := runnerTestPid(t, filepath.Join(dir, "pid"))
	child := runnerTestPid(t, filepath.Join(dir, "child"))
	cancelled := time.Now()
	run.Cancel()
	o := runnerTestOutcome(t, run)
	if waited := time.Since(cancelled); waited < runnerTestKillAfter {
		t.Errorf("ended %s after Cancel, before KillAfter (%s) had passed", waited, runnerTestKillAfter)
	}
	if o.State != wire.StateCancelled {
		t.Fatalf("outcome = %+v, want cancelled", o)
	}
	runnerTestError(t, o, ErrorTypeCancelled, "killed by SIGKILL")
	runnerTestExitCode(t, o, 128+9)
	runnerTestAssertGone(t, "body", pid)
	runnerTestAssertGone(t, "child", child)
}

// TestRunZeroKillAfterKillsAtOnce: KillAfter 0 (nymph --kill-after 0s) is
// SIGKILL right after SIGTERM, not a default grace: a body that ignores
// SIGTERM ends at once (it used to get 10 s).
func TestRunZeroKillAfterKillsAtOnce(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t, func(c *RunnerConfig) { c.KillAfter = 0 })
	inv := wire.RunInvocation{InvocationID: "inv_no_kill_after",
		Argv: runnerTestSh(`trap '' TERM; sleep 60 & echo $! > child; echo $$ > pid; wait`)}
	run := runnerTestStart(t, r, inv)
	dir := runnerTestDir(r, inv)
	pid := runnerTestPid(t, filepath.Join(dir, "pid")) // written after the trap is set
	child := runnerTestPid(t, filepath.Join(dir, "child"))
	killed := time.Now()
	run.Kill()
	o := runnerTestOutcome(t, run)
	if waited := time.Since(killed); waited > 5*time.Second {
		t.Errorf("ended %s after Kill with KillAfter 0; want at once", waited)
	}
	if !o.Abandoned {
		t.Fatalf("outcome = %+v, want abandoned", o)
	}
	runnerTestError(t, o, ErrorTypeAbandoned, "killed by SIGKILL")
	runnerTestAssertGone(t, "body", pid)
	runnerTestAssertGone(t, "child", child)
}

// TestRunBackgroundGrandchildIsKilled: a body that exits leaving a
// background process holding its output must still finish, and the
// leftover must die with the run.
func TestRunBackgroundGrandchildIsKilled(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	inv := wire.RunInvocation{InvocationID: "inv_grandchild", Argv: runnerTestSh(`sleep 100 & echo $! > child; echo done`)}
	o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
	if o.State != wire.StateSucceeded || o.StdoutTail != "done\n" {
		t.Fatalf("outcome = %+v", o)
	}
	runnerTestAssertGone(t, "background grandchild", runnerTestPid(t, filepath.Join(runnerTestDir(r, inv), "child")))
}

func TestRunCancelWinsOverTheExitStatus(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	inv := wire.RunInvocation{InvocationID: "inv_cancel",
		Argv: runnerTestSh(`trap 'exit 3' TERM; sleep 60 & echo $! > child; echo ready > ready; wait`)}
	run := runnerTestStart(t, r, inv)
	dir := runnerTestDir(r, inv)
	runnerTestWaitFile(t, filepath.Join(dir, "ready"))
	child := runnerTestPid(t, filepath.Join(dir, "child"))
	run.Cancel()
	run.Kill() // the first stop wins
	o := runnerTestOutcome(t, run)
	if o.State != wire.StateCancelled || o.Abandoned {
		t.Fatalf("outcome = %+v, want cancelled", o)
	}
	runnerTestError(t, o, ErrorTypeCancelled, "exited with status 3")
	runnerTestExitCode(t, o, 3)
	runnerTestAssertGone(t, "child", child)
}

func TestRunCancelDuringSetup(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	inv := wire.RunInvocation{InvocationID: "inv_cancel_setup", Argv: runnerTestSh("touch body-ran"),
		RunConfig: wire.RunConfig{RunSetup: []string{"echo go > setup-started; sleep 60"}}}
	run := runnerTestStart(t, r, inv)
	dir := runnerTestDir(r, inv)
	runnerTestWaitFile(t, filepath.Join(dir, "setup-started"))
	run.Cancel()
	o := runnerTestOutcome(t, run)
	if o.State != wire.StateCancelled {
		t.Fatalf("outcome = %+v, want cancelled", o)
	}
	runnerTestError(t, o, ErrorTypeCancelled, "during run_setup[0]")
	if _, err := os.Stat(filepath.Join(dir, "body-ran")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the body ran after a cancel during setup (err %v)", err)
	}
}

func TestRunCancelRightAway(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	run := runnerTestStart(t, r, wire.RunInvocation{InvocationID: "inv_cancel_now", Argv: []string{"sleep", "60"}})
	run.Cancel()
	if o := runnerTestOutcome(t, run); o.State != wire.StateCancelled || o.Error == nil || o.Error.Type != ErrorTypeCancelled {
		t.Fatalf("outcome = %+v, want cancelled", o)
	}
}

func TestRunKillAbandons(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	inv := wire.RunInvocation{InvocationID: "inv_kill", Argv: runnerTestSh(`echo $$ > pid; sleep 60 & wait`)}
	run := runnerTestStart(t, r, inv)
	pid := runnerTestPid(t, filepath.Join(runnerTestDir(r, inv), "pid"))
	run.Kill()
	run.Cancel() // too late: Kill came first
	o := runnerTestOutcome(t, run)
	if !o.Abandoned || o.State == wire.StateSucceeded || o.State == wire.StateCancelled {
		t.Fatalf("outcome = %+v, want abandoned", o)
	}
	runnerTestError(t, o, ErrorTypeAbandoned, "shutting down")
	runnerTestAssertGone(t, "body", pid)
}

func TestRunTailsKeepTheLast4KiB(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	inv := wire.RunInvocation{InvocationID: "inv_tails", Argv: runnerTestSh(
		`i=0; while [ $i -lt 1000 ]; do printf '%09d\n' $i; printf 'e%08d\n' $i >&2; i=$((i+1)); done`)}
	o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
	if o.State != wire.StateSucceeded {
		t.Fatalf("outcome = %+v", o)
	}
	var out, errOut strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&out, "%09d\n", i)
		fmt.Fprintf(&errOut, "e%08d\n", i)
	}
	wantOut, wantErr := out.String(), errOut.String()
	if o.StdoutTail != wantOut[len(wantOut)-4096:] {
		t.Errorf("StdoutTail is %d bytes and not the last 4096 of stdout; starts %q", len(o.StdoutTail), o.StdoutTail[:20])
	}
	if o.StderrTail != wantErr[len(wantErr)-4096:] {
		t.Errorf("StderrTail is %d bytes and not the last 4096 of stderr", len(o.StderrTail))
	}
	if b, err := os.ReadFile(filepath.Join(runnerTestDir(r, inv), StdoutFileName)); err != nil || string(b) != wantOut {
		t.Errorf("stdout.log is %d bytes (err %v), want the whole %d", len(b), err, len(wantOut))
	}
}

func TestRunTailDropsASplitRune(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	// "€" is three bytes; with 4094 more after it the 4 KiB cut splits it.
	inv := wire.RunInvocation{InvocationID: "inv_rune", Argv: runnerTestSh(`printf '\342\202\254'; head -c 4094 /dev/zero | tr '\0' a`)}
	o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
	if want := strings.Repeat("a", 4094); o.StdoutTail != want {
		t.Errorf("StdoutTail = %d bytes starting %q, want 4094 a's", len(o.StdoutTail), o.StdoutTail[:min(8, len(o.StdoutTail))])
	}
}

func TestRunnerTailText(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		in    string
		cut   bool
		limit int
		want  string
	}{
		"ascii":                         {in: "abc", limit: 10, want: "abc"},
		"split rune after a cut":        {in: "\x82\xacabc", cut: true, limit: 10, want: "abc"},
		"leading junk without a cut":    {in: "\x82\xacabc", limit: 10, want: "\uFFFDabc"},
		"invalid byte inside":           {in: "a\xffb", limit: 10, want: "a\uFFFDb"},
		"replacement grows past limit":  {in: "\xffab", limit: 4, want: "ab"},
		"multibyte runes at the limit":  {in: "é€", limit: 5, want: "é€"},
		"four continuation bytes stays": {in: "\x80\x80\x80\x80a", cut: true, limit: 10, want: "\uFFFDa"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := tailText([]byte(tc.in), tc.cut, tc.limit)
			if got != tc.want {
				t.Errorf("tailText(%q, %v, %d) = %q, want %q", tc.in, tc.cut, tc.limit, got, tc.want)
			}
		})
	}
}

func TestRunResultFile(t *testing.T) {
	t.Parallel()
	big := `head -c 140000 /dev/zero | tr '\0' a`
	cases := map[string]struct {
		script    string
		stale     bool
		wantState string
		wantType  string
		wantMsg   string
		wantBlob  string
	}{
		"too large": {
			script:    `{ printf '"'; ` + big + `; printf '"'; } > "$NYMPH_RESULT_FILE"`,
			wantState: wire.StateFailed, wantType: ErrorTypeBadResult, wantMsg: "the limit is 131072",
		},
		"invalid JSON turns success into failure": {
			script:    `echo '{"unterminated": ' > "$NYMPH_RESULT_FILE"`,
			wantState: wire.StateFailed, wantType: ErrorTypeBadResult, wantMsg: "not valid JSON",
		},
		"empty file is not JSON": {
			script:    `: > "$NYMPH_RESULT_FILE"`,
			wantState: wire.StateFailed, wantType: ErrorTypeBadResult, wantMsg: "not valid JSON",
		},
		"invalid UTF-8": {
			script:    `printf '"\377"' > "$NYMPH_RESULT_FILE"`,
			wantState: wire.StateFailed, wantType: ErrorTypeBadResult, wantMsg: "not valid UTF-8",
		},
		"not a regular file": {
			script:    `ln -s /dev/zero "$NYMPH_RESULT_FILE"`,
			wantState: wire.StateFailed, wantType: ErrorTypeBadResult, wantMsg: "not a regular file",
		},
		"invalid JSON keeps an earlier failure": {
			script:    `echo nope > "$NYMPH_RESULT_FILE"; exit 3`,
			wantState: wire.StateFailed, wantType: ErrorTypeExitCode, wantMsg: "exited with status 3",
		},
		"failed run keeps a valid result": {
			script:    `echo '[1]' > "$NYMPH_RESULT_FILE"; exit 3`,
			wantState: wire.StateFailed, wantType: ErrorTypeExitCode, wantMsg: "exited with status 3", wantBlob: "[1]",
		},
		"a stale file from an earlier process is not this run's": {
			script: "true", stale: true, wantState: wire.StateSucceeded,
		},
		"no file, no blob": {
			script: "true", wantState: wire.StateSucceeded,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := runnerTestNew(t)
			inv := wire.RunInvocation{InvocationID: "inv_result", Attempt: 1, Argv: runnerTestSh(tc.script)}
			if tc.stale {
				dir := runnerTestDir(r, inv)
				if err := os.MkdirAll(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, ResultFileName), []byte(`{"stale":true}`), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
			if o.State != tc.wantState {
				t.Fatalf("outcome = %+v, want state %s", o, tc.wantState)
			}
			if tc.wantType != "" {
				runnerTestError(t, o, tc.wantType, tc.wantMsg)
			} else if o.Error != nil {
				t.Errorf("Error = %+v, want none", *o.Error)
			}
			if string(o.ResultBlob) != tc.wantBlob {
				t.Errorf("ResultBlob = %q, want %q", o.ResultBlob, tc.wantBlob)
			}
		})
	}
}

func TestRunBadWorkdir(t *testing.T) {
	t.Parallel()
	cases := map[string]wire.RunInvocation{
		"absolute workdir":            {InvocationID: "inv_wd", RunConfig: wire.RunConfig{Workdir: "/tmp"}},
		"parent workdir":              {InvocationID: "inv_wd", RunConfig: wire.RunConfig{Workdir: "../up"}},
		"workdir escaping on the way": {InvocationID: "inv_wd", RunConfig: wire.RunConfig{Workdir: "a/../../../x"}},
		"invocation id with a slash":  {InvocationID: "../evil"},
		"invocation id dot-dot":       {InvocationID: ".."},
		"empty invocation id":         {InvocationID: ""},
	}
	for name, inv := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := runnerTestNew(t)
			inv.Argv = runnerTestSh("touch ran")
			o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
			if o.State != wire.StateFailed || o.ExitCode != nil {
				t.Fatalf("outcome = %+v, want failed with no exit code", o)
			}
			runnerTestError(t, o, ErrorTypeBadWorkdir, "")
			if entries, _ := os.ReadDir(r.cfg.Workdir); len(entries) != 0 {
				t.Errorf("the runner created %v under its workdir for a rejected run", entries)
			}
		})
	}
}

func TestRunInWorkdirSubdirectory(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	inv := wire.RunInvocation{InvocationID: "inv_sub", Argv: runnerTestSh(`pwd -P; echo "$NYMPH_WORKDIR"; touch here`),
		RunConfig: wire.RunConfig{Workdir: "sub/dir", RunSetup: []string{"touch setup-here"}}}
	o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
	if o.State != wire.StateSucceeded {
		t.Fatalf("outcome = %+v", o)
	}
	dir := runnerTestDir(r, inv)
	real, err := filepath.EvalSymlinks(filepath.Join(dir, "sub", "dir"))
	if err != nil {
		t.Fatal(err)
	}
	if want := real + "\n" + dir + "\n"; o.StdoutTail != want {
		t.Errorf("StdoutTail = %q, want %q", o.StdoutTail, want)
	}
	for _, f := range []string{"here", "setup-here"} {
		if _, err := os.Stat(filepath.Join(dir, "sub", "dir", f)); err != nil {
			t.Errorf("%s not in the workdir subdirectory: %v", f, err)
		}
	}
}

// TestRunLooksUpArgvInTheBodysPATH: argv[0] is found in the body's PATH,
// not the daemon's.
func TestRunLooksUpArgvInTheBodysPATH(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "runner-test-hello"), []byte("#!/bin/sh\necho hello \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := runnerTestNew(t, func(c *RunnerConfig) { c.BaseEnv = []string{"PATH=relative:" + bin + ":/usr/bin:/bin"} })
	o := runnerTestOutcome(t, runnerTestStart(t, r, wire.RunInvocation{InvocationID: "inv_path", Argv: []string{"runner-test-hello", "world"}}))
	if o.State != wire.StateSucceeded || o.StdoutTail != "hello world\n" {
		t.Fatalf("outcome = %+v", o)
	}

	// sh is in the daemon's PATH, but not in this body's.
	r = runnerTestNew(t, func(c *RunnerConfig) { c.BaseEnv = []string{"PATH=" + bin} })
	o = runnerTestOutcome(t, runnerTestStart(t, r, wire.RunInvocation{InvocationID: "inv_path", Argv: []string{"sh", "-c", "true"}}))
	runnerTestError(t, o, ErrorTypeStartFailed, "not found in PATH")
}

func TestExecSetupCommand(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	for i := range 600 {
		fmt.Fprintf(&out, "%09d\n", i)
		fmt.Fprintf(&out, "e%08d\n", i)
	}
	long := out.String()
	cases := map[string]struct {
		argv     []string
		wantCode int
		wantTail string
		wantErr  bool
	}{
		"interleaved output": {argv: runnerTestSh("echo a; echo b >&2; echo c"), wantTail: "a\nb\nc\n"},
		"non-zero exit is not an error": {
			argv: runnerTestSh("echo oops; exit 5"), wantCode: 5, wantTail: "oops\n",
		},
		"signal": {argv: runnerTestSh("kill -TERM $$"), wantCode: 128 + 15},
		"tail is the last 4 KiB": {
			argv:     runnerTestSh(`i=0; while [ $i -lt 600 ]; do printf '%09d\n' $i; printf 'e%08d\n' $i >&2; i=$((i+1)); done`),
			wantTail: long[len(long)-4096:],
		},
		"not found":   {argv: []string{"runner-test-no-such-binary"}, wantCode: -1, wantErr: true},
		"empty argv":  {argv: nil, wantCode: -1, wantErr: true},
		"missing dir": {argv: []string{"/bin/true"}, wantCode: -1, wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			clk := &runnerTestClock{now: time.Unix(1700000000, 0)}
			r := runnerTestNew(t, func(c *RunnerConfig) { c.Now = clk.Now })
			dir := t.TempDir()
			if name == "missing dir" {
				dir = filepath.Join(dir, "absent")
			}
			code, tail, dur, err := r.Exec(context.Background(), tc.argv, dir)
			if (err != nil) != tc.wantErr || code != tc.wantCode || tail != tc.wantTail {
				t.Errorf("Exec = %d, %q, %v; want %d, %q, error %v", code, tail, err, tc.wantCode, tc.wantTail, tc.wantErr)
			}
			if dur != time.Second {
				t.Errorf("duration = %s, want 1s from the injected clock", dur)
			}
		})
	}
}

func TestExecCancelTerminatesTheGroup(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		script   string
		wantCode int
		wantTail string
		killed   bool
	}{
		"SIGTERM ends it": {
			script:   `trap 'echo bye; exit 4' TERM; sleep 60 & echo $! > child; echo $$ > pid; wait`,
			wantCode: 4, wantTail: "bye\n",
		},
		"SIGTERM ignored, SIGKILL after KillAfter": {
			script:   `trap '' TERM; sleep 60 & echo $! > child; echo $$ > pid; wait`,
			wantCode: 128 + 9, killed: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := runnerTestNew(t)
			dir := t.TempDir()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			type result struct {
				code int
				tail string
				err  error
			}
			done := make(chan result, 1)
			go func() {
				code, tail, _, err := r.Exec(ctx, runnerTestSh(tc.script), dir)
				done <- result{code, tail, err}
			}()
			pid := runnerTestPid(t, filepath.Join(dir, "pid"))
			child := runnerTestPid(t, filepath.Join(dir, "child"))
			cancelled := time.Now()
			cancel()
			var res result
			select {
			case res = <-done:
			case <-time.After(runnerTestWait):
				t.Fatal("Exec did not return after its context was cancelled")
			}
			if tc.killed && time.Since(cancelled) < runnerTestKillAfter {
				t.Errorf("SIGKILL came before KillAfter had passed")
			}
			if res.code != tc.wantCode || res.tail != tc.wantTail || !errors.Is(res.err, context.Canceled) {
				t.Errorf("Exec = %d, %q, %v; want %d, %q, context.Canceled", res.code, res.tail, res.err, tc.wantCode, tc.wantTail)
			}
			runnerTestAssertGone(t, "command", pid)
			runnerTestAssertGone(t, "child", child)
		})
	}
}

// TestExecBackgroundGrandchildHoldingThePipe: the grandchild keeps the
// output pipe open; Exec must still return, and the grandchild must die.
func TestExecBackgroundGrandchildHoldingThePipe(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	dir := t.TempDir()
	code, tail, _, err := r.Exec(context.Background(), runnerTestSh(`sleep 100 & echo $! > child; echo hi`), dir)
	if code != 0 || tail != "hi\n" || err != nil {
		t.Fatalf("Exec = %d, %q, %v", code, tail, err)
	}
	runnerTestAssertGone(t, "background grandchild", runnerTestPid(t, filepath.Join(dir, "child")))
}

func TestExecWithADoneContextDoesNotStart(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	code, _, _, err := r.Exec(ctx, runnerTestSh("touch ran"), dir)
	if code != -1 || !errors.Is(err, context.Canceled) {
		t.Errorf("Exec = %d, %v; want -1, context.Canceled", code, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the command ran (err %v)", err)
	}
}

func runnerTestInt(n int) *int { return &n }
