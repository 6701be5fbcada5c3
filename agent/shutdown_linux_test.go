package agent

import (
	"context"
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
	"unsafe"

	"github.com/dreamlake/lakeshore/agent/internal/health"
	"github.com/dreamlake/lakeshore/shared/api"
	"github.com/dreamlake/lakeshore/shared/api/apitest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The shutdown paths: outcomes known at termination are acked, never
// handed back; a body whose cleanup cannot be confirmed fails the shutdown;
// a panicking loop or a failed start is a runtime failure.

// waitExitedNoReap blocks until child pid of this process has exited,
// leaving it a zombie for its own Wait to reap (waitid WNOWAIT).
func waitExitedNoReap(pid int) error {
	const pPID = 1 // idtype_t P_PID
	var info [128]byte
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info[0])),
			syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch e {
		case 0:
			return nil
		case syscall.EINTR:
			continue
		default:
			return e
		}
	}
}

// waitZombie waits until pid, not this process's child, is a zombie.
func waitZombie(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(runnerTestWait)
	for {
		if state, _, err := procStat(pid); err == nil && state == 'Z' {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d not a zombie within %s", pid, runnerTestWait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitExec waits until process pid runs the program named comm (an exec
// has happened).
func waitExec(t *testing.T, pid int, comm string) {
	t.Helper()
	deadline := time.Now().Add(runnerTestWait)
	for {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(b)) == comm {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d does not run %s within %s", pid, comm, runnerTestWait)
		}
		time.Sleep(5 * time.Millisecond)
	}
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
	zombie := runnerTestPid(t, filepath.Join(dir, "zombie"))
	child := runnerTestPid(t, filepath.Join(dir, "child"))
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
	deadline := time.Now().Add(runnerTestWait)
	for got = liveGroupMembers(pgid); len(got) > 0; got = liveGroupMembers(pgid) {
		if time.Now().After(deadline) {
			t.Fatalf("live members of group %d after SIGKILL: %v", pgid, got)
		}
		time.Sleep(5 * time.Millisecond)
	}
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
	r := runnerTestNew(t, func(c *RunnerConfig) {
		c.hooks.beforeWait = func(pid int) {
			if err := waitExitedNoReap(pid); err != nil {
				t.Errorf("waitid: %v", err)
			}
			exited <- pid
			<-release
		}
		c.hooks.stopHandled = func(_ int, terminated bool) { handled <- terminated }
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
	logs := newLogRecorder()
	r := runnerTestNew(t, func(c *RunnerConfig) {
		c.Logger = logs.logger()
		c.liveMembers = func(pgid int) []int { return []int{pgid} } // never confirmed gone
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
	errs := logs.find(func(r logRecord) bool {
		return r.Level == slog.LevelError && strings.Contains(r.Msg, "cleanup not confirmed")
	})
	if len(errs) != 1 || errs[0].Attrs["invocation_id"] != "inv_unconfirmed" || errs[0].Attrs["pgid"] != int64(pgid) {
		t.Fatalf("error records %v; want one naming the invocation and the group", errs)
	}
}

// shutdownPlane is a control plane whose log the test reads (bye's
// inflight_abandoned).
func shutdownPlane(t *testing.T) (*apitest.Plane, *logRecorder) {
	t.Helper()
	logs := newLogRecorder()
	return apitest.New(t, func(c *api.Config) { c.Logger = logs.logger() }), logs
}

// byeOf reports the control plane's record of the worker's bye.
func byeOf(t *testing.T, logs *logRecorder, workerID string) logRecord {
	t.Helper()
	byes := logs.find(func(r logRecord) bool { return r.Msg == "bye" && r.Attrs["worker_id"] == workerID })
	if len(byes) != 1 {
		t.Fatalf("bye records of %s: %v; want one", workerID, byes)
	}
	return byes[0]
}

// TestAgentAcksAnOutcomeKnownAtTermination: the body exits on its own, and
// the drain's grace expires before the runner has reaped it: the outcome is
// known, so it is acked (the invocation reads succeeded) and bye counts
// nothing abandoned.
func TestAgentAcksAnOutcomeKnownAtTermination(t *testing.T) {
	p, srvLogs := shutdownPlane(t)
	op := operator(p)
	inv, _, err := op.Submit(context.Background(), wire.SubmitRequest{Queue: "q", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	logs := newLogRecorder()
	a := newFakeTimeAgent(t, p, "known-at-terminate", func(c *Config) {
		c.Grace = 100 * time.Millisecond
		c.PollInterval = 100 * time.Millisecond
		c.Logger = logs.logger()
	})
	released := make(chan struct{})
	release := sync.OnceFunc(func() { close(released) })
	t.Cleanup(release)
	a.testRunnerConfig = func(rc *RunnerConfig) {
		rc.hooks.beforeWait = func(pid int) {
			// The body has exited when the drain starts, and stays
			// unreaped until the grace has expired and terminate's stop
			// has been dealt with.
			if err := waitExitedNoReap(pid); err != nil {
				t.Errorf("waitid: %v", err)
			}
			a.Stop()
			<-released
		}
		rc.hooks.stopHandled = func(int, bool) { release() }
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run ended by the test's deadline")
	}
	if got, err := op.GetInvocation(context.Background(), inv.InvocationID); err != nil || got.State != wire.StateSucceeded {
		t.Fatalf("invocation %+v %v; want succeeded: its outcome was known before bye", got, err)
	}
	w := workerOf(t, p, "known-at-terminate")
	if bye := byeOf(t, srvLogs, w.WorkerID); bye.Attrs["inflight_abandoned"] != int64(0) || bye.Attrs["reason"] != wire.ByeSignal {
		t.Fatalf("bye %v; want reason signal, inflight_abandoned 0", bye)
	}
	if ab := logs.find(func(r logRecord) bool { return strings.HasPrefix(r.Msg, "abandoned") }); len(ab) != 0 {
		t.Fatalf("logged as abandoned: %v", ab)
	}
	if s := a.Health().Snapshot(); s.LiveReason != health.ReasonStopped {
		t.Errorf("live reason after a clean shutdown %q; want %q", s.LiveReason, health.ReasonStopped)
	}
}

// TestAgentShutdownNotConfirmed: a body killed at shutdown whose process
// group cannot be confirmed gone after SIGKILL (the liveness check is
// injected: a process that survives SIGKILL cannot be made on demand)
// fails the shutdown (failed:shutdown), is logged as an error with its
// ids, and is handed back, counted in bye's inflight_abandoned.
func TestAgentShutdownNotConfirmed(t *testing.T) {
	p, srvLogs := shutdownPlane(t)
	op := operator(p)
	inv, _, err := op.Submit(context.Background(), wire.SubmitRequest{Queue: "q", Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	logs := newLogRecorder()
	a := newFakeTimeAgent(t, p, "unconfirmed", func(c *Config) {
		c.Grace = 100 * time.Millisecond
		c.KillAfter = 200 * time.Millisecond
		c.PollInterval = 100 * time.Millisecond
		c.Logger = logs.logger()
	})
	var bodyPid int
	a.testRunnerConfig = func(rc *RunnerConfig) {
		rc.liveMembers = func(pgid int) []int { return []int{pgid} }
		rc.hooks.beforeWait = func(pid int) { bodyPid = pid; a.Stop() } // the signal comes once the body runs
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run ended by the test's deadline")
	}
	if s := a.Health().Snapshot(); s.Live || s.LiveReason != health.FailedShutdown {
		t.Errorf("live = %v %q after an unconfirmed cleanup; want false %q", s.Live, s.LiveReason, health.FailedShutdown)
	}
	errs := logs.find(func(r logRecord) bool {
		return r.Level == slog.LevelError && strings.HasPrefix(r.Msg, "cleanup not confirmed") && r.Attrs["invocation_id"] == inv.InvocationID
	})
	if len(errs) != 1 {
		t.Fatalf("error records of the unconfirmed cleanup: %v; want one", errs)
	}
	e := errs[0]
	if e.Attrs["attempt"] != int64(1) || e.Attrs["pid"] != int64(bodyPid) || e.Attrs["pgid"] != int64(bodyPid) ||
		!strings.Contains(e.Msg, "inflight_abandoned") {
		t.Errorf("error record %v; want attempt 1, pid and pgid %d, and that it is counted in inflight_abandoned", e, bodyPid)
	}
	w := workerOf(t, p, "unconfirmed")
	if bye := byeOf(t, srvLogs, w.WorkerID); bye.Attrs["inflight_abandoned"] != int64(1) {
		t.Fatalf("bye %v; want inflight_abandoned 1", bye)
	}
	if got, err := op.GetInvocation(context.Background(), inv.InvocationID); err != nil || got.State != wire.StateQueued {
		t.Fatalf("invocation %+v %v; want it handed back (queued)", got, err)
	}
}

// newFinishAgent is an agent set up as Run leaves it for the loop (acker,
// runner), with a state the test drives; its session's token is refused,
// so bye fails harmlessly and the test reads the counts from the log.
func newFinishAgent(t *testing.T, p *apitest.Plane, logs *logRecorder, mod func(*Config)) (*Agent, *state) {
	t.Helper()
	a := newFakeTimeAgent(t, p, "finish", func(c *Config) {
		c.KillAfter = 200 * time.Millisecond
		c.Logger = logs.logger()
		if mod != nil {
			mod(c)
		}
	})
	spool, err := OpenSpool(a.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	a.ackDone = map[string]func(bool){}
	a.acker = NewAcker(spool, AckerOptions{Logger: a.log, HTTP: a.cfg.HTTP, OnAnswered: a.ackAnswered})
	a.runner = NewRunner(RunnerConfig{Workdir: a.cfg.Workdir, KillAfter: a.cfg.KillAfter, BaseEnv: DefaultBaseEnv(os.Getenv), Logger: a.log})
	sess := session{workerID: "wrk_finish", token: "refused", interval: time.Second,
		api: client.New(p.URL, "refused", client.WithHTTPClient(noKeepAlive()))}
	st := &state{runs: map[string]*running{}, setupSeen: map[string]bool{}, sess: sess,
		phase: wire.PhaseDraining, byeReason: wire.ByeSignal}
	return a, st
}

// exitRecord reports the agent's exit record.
func exitRecord(t *testing.T, logs *logRecorder) logRecord {
	t.Helper()
	recs := logs.find(func(r logRecord) bool { return r.Msg == "exit" })
	if len(recs) != 1 {
		t.Fatalf("exit records %v; want one", recs)
	}
	return recs[0]
}
