package process

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/process/proctest"
	"github.com/dreamlake/lakeshore/shared/syncbuf"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// waitZombie waits until pid, not this process's child, is a zombie.
func waitZombie(t *testing.T, pid int) {
	t.Helper()
	waittest.Until(t, runnerTestWait, fmt.Sprintf("pid %d a zombie", pid), func() bool {
		state, _, err := procStat(pid)
		return err == nil && state == 'Z'
	})
}

// waitExec waits until process pid runs the program named comm (an exec
// has happened).
func waitExec(t *testing.T, pid int, comm string) {
	t.Helper()
	waittest.Until(t, runnerTestWait, fmt.Sprintf("pid %d runs %s", pid, comm), func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		return err == nil && strings.TrimSpace(string(b)) == comm
	})
}

// TestRunnerLiveGroupMembers: the check that confirms a group dead counts
// every member that runs, and no zombie: one whose parent never reaps it
// (or, reparented, an init that does not) runs nothing.
func TestRunnerLiveGroupMembers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// The would-be zombie (cat) waits on a fifo until the shell has exec'd
	// sleep 60, which never reaps it. Had it exited before the exec, the
	// shell could have reaped it first (it did, now and then, under load),
	// and there would be no zombie to see.
	gate := filepath.Join(dir, "gate")
	if err := syscall.Mkfifo(gate, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", `cat gate > /dev/null & echo $! > zombie; sleep 60 & echo $! > child; exec sleep 60`)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	zombie := proctest.Pid(t, filepath.Join(dir, "zombie"))
	child := proctest.Pid(t, filepath.Join(dir, "child"))
	waitExec(t, pgid, "sleep")
	f, err := os.OpenFile(gate, os.O_WRONLY, 0) // cat sees EOF once this closes, and exits
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	waitZombie(t, zombie)

	got := liveGroupMembers(pgid)
	slices.Sort(got)
	want := []int{pgid, child}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("live members of group %d = %v; want the leader and the child %v, not the zombie %d", pgid, got, want, zombie)
	}
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// The child dies asynchronously; the zombie may stay for good.
	waittest.UntilState(t, runnerTestWait, fmt.Sprintf("no live member of group %d after SIGKILL", pgid), func() (bool, string) {
		got := liveGroupMembers(pgid)
		return len(got) == 0, fmt.Sprintf("live members %v", got)
	})
}

// TestRunStopAfterTheBodyExitedKeepsItsOutcome: a stop (here Kill, the
// daemon's shutdown) that arrives after the body exited on its own, but
// before the runner reaped it, must not turn a known outcome into an
// abandoned one. The hooks hold the reaping until the stop is dealt with.
func TestRunStopAfterTheBodyExitedKeepsItsOutcome(t *testing.T) {
	t.Parallel()
	exited := make(chan int, 1)
	handled := make(chan bool, 1)
	release := make(chan struct{})
	r := runnerTestNew(t, func(c *Config) {
		c.Hooks.BeforeWait = func(pid int) {
			if err := proctest.WaitExitedNoReap(pid); err != nil {
				t.Errorf("waitid: %v", err)
			}
			exited <- pid
			<-release
		}
		c.Hooks.StopHandled = func(_ int, terminated bool) { handled <- terminated }
	})
	inv := wire.RunInvocation{InvocationID: "inv_exited_first", Argv: runnerTestSh(`echo finished; exit 3`)}
	run := runnerTestStart(t, r, inv)
	letGo := sync.OnceFunc(func() { close(release) })
	t.Cleanup(letGo) // before runnerTestStart's, which waits for the end
	select {
	case <-exited:
	case <-time.After(runnerTestWait):
		t.Fatal("the body did not exit")
	}
	run.Kill()
	select {
	case terminated := <-handled:
		if terminated {
			t.Errorf("the runner signalled the group of a body that had already exited")
		}
	case <-time.After(runnerTestWait):
		t.Fatal("the stop was not dealt with")
	}
	letGo()
	o := runnerTestOutcome(t, run)
	if o.Abandoned || o.State != wire.StateFailed || o.StdoutTail != "finished\n" {
		t.Fatalf("outcome = %+v; want the body's own: failed, exit 3, not abandoned", o)
	}
	runnerTestError(t, o, ErrorTypeExitCode, "exited with status 3")
	runnerTestExitCode(t, o, 3)
	if pgid, pids := run.Unconfirmed(); pgid != 0 {
		t.Errorf("Unconfirmed = %d %v; want the group confirmed gone", pgid, pids)
	}
}

// TestRunUnconfirmedCleanup: when the group cannot be confirmed gone after
// its SIGKILL, the run still ends (bounded by killConfirmWait), says so in
// Unconfirmed, and logs it as an error.
func TestRunUnconfirmedCleanup(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	r := runnerTestNew(t, func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		c.LiveMembers = func(pgid int) []int { return []int{pgid} } // never confirmed gone
	})
	run := runnerTestStart(t, r, wire.RunInvocation{InvocationID: "inv_unconfirmed", Argv: []string{"true"}})
	o := runnerTestOutcome(t, run)
	if o.State != wire.StateSucceeded || o.Abandoned {
		t.Fatalf("outcome = %+v; want succeeded: the body's own end is known", o)
	}
	pgid, pids := run.Unconfirmed()
	if pgid == 0 || pgid != run.Pid() || !slices.Equal(pids, []int{pgid}) {
		t.Fatalf("Unconfirmed = %d %v; want the body's group %d", pgid, pids, run.Pid())
	}
	var errs []map[string]any
	for _, rec := range logs.records("cleanup not confirmed") {
		if rec["level"] == "ERROR" {
			errs = append(errs, rec)
		}
	}
	if len(errs) != 1 || errs[0]["invocation_id"] != "inv_unconfirmed" || errs[0]["pgid"] != float64(pgid) {
		t.Fatalf("error records %v; want one naming the invocation and the group", errs)
	}
}

// lockedBuffer is a log sink the runner's goroutines may write at once.
type lockedBuffer struct{ syncbuf.Buffer }

// records reports the JSON log's records whose msg contains msg.
func (b *lockedBuffer) records(msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(b.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && strings.Contains(fmt.Sprint(rec["msg"]), msg) {
			out = append(out, rec)
		}
	}
	return out
}
