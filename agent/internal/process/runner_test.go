package process

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

	"github.com/dreamlake/lakeshore/agent/internal/process/proctest"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// runnerTestHelperEnv switches the test binary into a body: the runner
// re-executes it with this variable set (STYLE: test subprocesses by
// re-running the test binary).
const runnerTestHelperEnv = "LAKESHORE_RUNNER_TEST_HELPER"

// runnerTestWait bounds every wait (proctest.Wait).
const runnerTestWait = proctest.Wait

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
	case "daemon":
		runnerTestDaemon() // never returns
	default:
		os.Exit(2)
	}
}

func runnerTestBaseEnv() []string {
	return []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/nonexistent", "LANG=C.UTF-8"}
}

func runnerTestNew(t *testing.T, mods ...func(*Config)) *Runner {
	t.Helper()
	cfg := Config{
		Workdir:   t.TempDir(),
		KillAfter: runnerTestKillAfter,
		BaseEnv:   runnerTestBaseEnv(),
		Logger:    slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, m := range mods {
		m(&cfg)
	}
	return New(cfg)
}

func runnerTestSh(script string) []string { return []string{"/bin/sh", "-c", script} }

// runnerTestStart starts inv and makes sure the run is over before the test
// (and its temporary directory) goes away.
func runnerTestStart(t *testing.T, r *Runner, inv wire.RunInvocation) *Run {
	t.Helper()
	if inv.Attempt == 0 {
		inv.Attempt = 1
	}
	run := r.Start(inv, "wrk_test")
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
	r := runnerTestNew(t, func(c *Config) { c.Clock = clock.Of(clk.Now) })
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
	ack, err := json.Marshal(o.Ack("wrk_test", "inv_ok", 2, wire.PhaseReady))
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
	r := runnerTestNew(t, func(c *Config) { c.BaseEnv = append(c.BaseEnv, "SHARED=base", "malformed") })
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

// TestSignalBeforeAGroupReachesTheNext: a Signal (a drain notice) that
// comes while the run has no process group running yet — its first step
// being started — is sent to the group the run starts next, not lost.
// Here that is a run_setup command, which SIGUSR1 ends (it traps nothing),
// so the run fails at its setup; a lost signal would let it succeed.
func TestSignalBeforeAGroupReachesTheNext(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	inv := wire.RunInvocation{InvocationID: "inv_signal_early", Argv: runnerTestSh("true"),
		RunConfig: wire.RunConfig{RunSetup: []string{"sleep 2"}}}
	run := runnerTestStart(t, r, inv)
	run.Signal(syscall.SIGUSR1) // most likely before the setup's group exists; either way it must reach it
	o := runnerTestOutcome(t, run)
	if o.State != wire.StateFailed {
		t.Fatalf("outcome = %+v; want the setup ended by the signal", o)
	}
	runnerTestError(t, o, ErrorTypeRunSetupFailed, "run_setup[0]")
}
