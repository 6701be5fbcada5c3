package process

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/process/proctest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

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
	pid := proctest.Pid(t, filepath.Join(dir, "pid"))
	child := proctest.Pid(t, filepath.Join(dir, "child"))
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
	proctest.AssertGone(t, "body", pid)
	proctest.AssertGone(t, "child", child)
}

// TestRunZeroKillAfterKillsAtOnce: KillAfter 0 (nymph --kill-after 0s) is
// SIGKILL right after SIGTERM, not a default grace: a body that ignores
// SIGTERM ends at once, with no 10 s grace.
func TestRunZeroKillAfterKillsAtOnce(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t, func(c *Config) { c.KillAfter = 0 })
	inv := wire.RunInvocation{InvocationID: "inv_no_kill_after",
		Argv: runnerTestSh(`trap '' TERM; sleep 60 & echo $! > child; echo $$ > pid; wait`)}
	run := runnerTestStart(t, r, inv)
	dir := runnerTestDir(r, inv)
	pid := proctest.Pid(t, filepath.Join(dir, "pid")) // written after the trap is set
	child := proctest.Pid(t, filepath.Join(dir, "child"))
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
	proctest.AssertGone(t, "body", pid)
	proctest.AssertGone(t, "child", child)
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
	proctest.AssertGone(t, "background grandchild", proctest.Pid(t, filepath.Join(runnerTestDir(r, inv), "child")))
}

func TestRunCancelWinsOverTheExitStatus(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	inv := wire.RunInvocation{InvocationID: "inv_cancel",
		Argv: runnerTestSh(`trap 'exit 3' TERM; sleep 60 & echo $! > child; echo ready > ready; wait`)}
	run := runnerTestStart(t, r, inv)
	dir := runnerTestDir(r, inv)
	proctest.WaitFile(t, filepath.Join(dir, "ready"))
	child := proctest.Pid(t, filepath.Join(dir, "child"))
	run.Cancel()
	run.Kill() // the first stop wins
	o := runnerTestOutcome(t, run)
	if o.State != wire.StateCancelled || o.Abandoned {
		t.Fatalf("outcome = %+v, want cancelled", o)
	}
	runnerTestError(t, o, ErrorTypeCancelled, "exited with status 3")
	runnerTestExitCode(t, o, 3)
	proctest.AssertGone(t, "child", child)
}

func TestRunCancelDuringSetup(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	inv := wire.RunInvocation{InvocationID: "inv_cancel_setup", Argv: runnerTestSh("touch body-ran"),
		RunConfig: wire.RunConfig{RunSetup: []string{"echo go > setup-started; sleep 60"}}}
	run := runnerTestStart(t, r, inv)
	dir := runnerTestDir(r, inv)
	proctest.WaitFile(t, filepath.Join(dir, "setup-started"))
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
	pid := proctest.Pid(t, filepath.Join(runnerTestDir(r, inv), "pid"))
	run.Kill()
	run.Cancel() // too late: Kill came first
	o := runnerTestOutcome(t, run)
	if !o.Abandoned || o.State == wire.StateSucceeded || o.State == wire.StateCancelled {
		t.Fatalf("outcome = %+v, want abandoned", o)
	}
	runnerTestError(t, o, ErrorTypeAbandoned, "shutting down")
	proctest.AssertGone(t, "body", pid)
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
