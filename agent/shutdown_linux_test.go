package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
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

// TestRunnerLiveGroupMembers: the check that confirms a group dead counts
// every member that runs, and no zombie: one whose parent never reaps it
// (or, reparented, an init that does not) runs nothing.
func TestRunnerLiveGroupMembers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// sleep 0 exits at once; its parent becomes the exec'd sleep 60, which
	// never reaps it.
	cmd := exec.Command("/bin/sh", "-c", `sleep 0 & echo $! > zombie; sleep 60 & echo $! > child; exec sleep 60`)
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
	if s := a.Health().Snapshot(); s.LiveReason != ReasonStopped {
		t.Errorf("live reason after a clean shutdown %q; want %q", s.LiveReason, ReasonStopped)
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
	if s := a.Health().Snapshot(); s.Live || s.LiveReason != FailedShutdown {
		t.Errorf("live = %v %q after an unconfirmed cleanup; want false %q", s.Live, s.LiveReason, FailedShutdown)
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
		phase: wire.PhaseDraining, draining: true, byeReason: wire.ByeSignal}
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

// TestFinishCountsRunsTheLoopSawAbandoned: a body killed by terminate whose
// end the loop handles (runFinished) before it gets to finish is still
// counted in bye's inflight_abandoned.
func TestFinishCountsRunsTheLoopSawAbandoned(t *testing.T) {
	p := apitest.New(t)
	logs := newLogRecorder()
	a, st := newFinishAgent(t, p, logs, nil)
	r := &running{run: a.runner.Start(wire.RunInvocation{InvocationID: "inv_killed", Attempt: 1, Argv: []string{"sleep", "60"}}), session: st.sess}
	st.runs["inv_killed"] = r
	select {
	case <-r.run.Started():
	case <-time.After(runnerTestWait):
		t.Fatal("the body did not start")
	}
	a.terminate(st)
	select {
	case <-r.run.Done():
	case <-time.After(runnerTestWait):
		t.Fatal("the body did not end after terminate")
	}
	if o := r.run.Outcome(); !o.Abandoned {
		t.Fatalf("outcome %+v; want abandoned", o)
	}
	a.runFinished(context.Background(), st, r) // the loop saw it end first
	if err := a.finish(st); err != nil {
		t.Fatalf("finish: %v", err)
	}
	if rec := exitRecord(t, logs); rec.Attrs["inflight_abandoned"] != int64(1) {
		t.Fatalf("exit %v; want inflight_abandoned 1", rec)
	}
}

// TestFinishDeadlineCoversEveryRun: runs that never end (their leader stuck
// where SIGKILL cannot reach it) are each given up at the one deadline:
// finish returns, counts them abandoned and fails the shutdown.
func TestFinishDeadlineCoversEveryRun(t *testing.T) {
	p := apitest.New(t)
	logs := newLogRecorder()
	a, st := newFinishAgent(t, p, logs, nil)
	a.finishSlack = 100 * time.Millisecond
	st.phase = wire.PhaseTerminating
	for _, id := range []string{"inv_stuck_1", "inv_stuck_2"} {
		stuck := &Run{inv: wire.RunInvocation{InvocationID: id, Attempt: 2}, log: a.log,
			started: make(chan struct{}), done: make(chan struct{}), stopc: make(chan struct{})}
		st.runs[id] = &running{run: stuck, session: st.sess}
	}
	done := make(chan error, 1)
	go func() { done <- a.finish(st) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("finish: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("finish still waiting 30 s after its deadline of kill-after + slack")
	}
	if rec := exitRecord(t, logs); rec.Attrs["inflight_abandoned"] != int64(2) {
		t.Fatalf("exit %v; want inflight_abandoned 2", rec)
	}
	if s := a.Health().Snapshot(); s.LiveReason != FailedShutdown {
		t.Errorf("live reason %q; want %q", s.LiveReason, FailedShutdown)
	}
	errs := logs.find(func(r logRecord) bool {
		return r.Level == slog.LevelError && strings.HasPrefix(r.Msg, "cleanup not confirmed") && r.Attrs["attempt"] == int64(2)
	})
	if len(errs) != 2 {
		t.Fatalf("error records %v; want one for each stuck run", errs)
	}
}

// TestAgentLoopPanicIsARuntimeFailure: a panic in the loop is recovered:
// health reads failed:runtime, the running body is killed, and Run
// returns ErrLoopPanicked (no bye: the worker is left to go stale, as a
// crashed one).
func TestAgentLoopPanicIsARuntimeFailure(t *testing.T) {
	p := apitest.New(t)
	op := operator(p)
	if _, _, err := op.Submit(context.Background(), wire.SubmitRequest{Queue: "q",
		Argv: []string{"/bin/sh", "-c", `echo $$ > "$NYMPH_WORKDIR/pid"; exec sleep 60`}}); err != nil {
		t.Fatal(err)
	}
	logs := newLogRecorder()
	a := newFakeTimeAgent(t, p, "panicky", func(c *Config) {
		c.KillAfter = 200 * time.Millisecond
		c.PollInterval = 100 * time.Millisecond
		c.Logger = logs.logger()
	})
	var bodyPid int
	a.testHookRunStarted = func(id string) { // on the loop's goroutine
		bodyPid = runnerTestPid(t, filepath.Join(a.cfg.Workdir, id, "1", "pid"))
		panic("boom")
	}
	err := a.Run(context.Background())
	if !errors.Is(err, ErrLoopPanicked) {
		t.Fatalf("Run = %v; want ErrLoopPanicked", err)
	}
	if ExitCode(err) != ExitFailure {
		t.Errorf("exit code %d; want %d", ExitCode(err), ExitFailure)
	}
	if s := a.Health().Snapshot(); s.Live || s.LiveReason != FailedRuntime || s.Ready {
		t.Errorf("health after a loop panic: ready %v live %v %q; want not live, %q", s.Ready, s.Live, s.LiveReason, FailedRuntime)
	}
	runnerTestAssertGone(t, "body of the panicked daemon", bodyPid)
	if recs := logs.find(func(r logRecord) bool {
		return r.Level == slog.LevelError && strings.Contains(r.Msg, "panicked") && r.Attrs["panic"] == "boom"
	}); len(recs) != 1 {
		t.Errorf("panic records %v; want one", recs)
	}
	if w := workerOf(t, p, "panicky"); w.State == "gone" {
		t.Errorf("worker %+v; a crashed daemon says no bye", w)
	}
}

// TestAgentStartupErrorIsARuntimeFailure: an error that ends Run before
// the loop (here an unusable state dir) reads failed:runtime.
func TestAgentStartupErrorIsARuntimeFailure(t *testing.T) {
	p := apitest.New(t)
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	a := newFakeTimeAgent(t, p, "bad-state-dir", func(c *Config) { c.StateDir = notDir })
	if err := a.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "state dir") {
		t.Fatalf("Run = %v; want the state dir's error", err)
	}
	if s := a.Health().Snapshot(); s.Live || s.LiveReason != FailedRuntime {
		t.Errorf("live = %v %q; want false %q", s.Live, s.LiveReason, FailedRuntime)
	}
}

// ackHolder is the daemon's HTTP transport in a test: it holds every ack
// unanswered until opened, and records the order in which acks are answered
// and bye is sent.
type ackHolder struct {
	base     http.RoundTripper
	held     chan struct{} // closed when the first ack is held
	heldOnce sync.Once
	release  chan struct{} // closed by open
	openOnce sync.Once
	mu       sync.Mutex
	events   []string
}

func newAckHolder() *ackHolder {
	return &ackHolder{base: &http.Transport{DisableKeepAlives: true}, held: make(chan struct{}), release: make(chan struct{})}
}

// open lets held acks (and later ones) through.
func (h *ackHolder) open() { h.openOnce.Do(func() { close(h.release) }) }

func (h *ackHolder) record(e string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, e)
}

func (h *ackHolder) log() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.events)
}

func (h *ackHolder) RoundTrip(r *http.Request) (*http.Response, error) {
	switch r.URL.Path {
	case "/v1/daemon/ack":
		h.record("ack held")
		h.heldOnce.Do(func() { close(h.held) })
		select {
		case <-h.release:
		case <-r.Context().Done():
			h.record("ack given up")
			return nil, fmt.Errorf("held ack: %w", r.Context().Err())
		}
		resp, err := h.base.RoundTrip(r)
		if err != nil {
			h.record("ack failed")
			return nil, fmt.Errorf("held ack: %w", err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			h.record("ack failed")
			return nil, fmt.Errorf("held ack: read the answer: %w", err)
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		var ar wire.AckResponse
		_ = json.Unmarshal(body, &ar)
		h.record(fmt.Sprintf("ack answered %d recorded=%v", resp.StatusCode, ar.Recorded))
		return resp, nil
	case "/v1/daemon/bye":
		h.record("bye")
		h.open() // a daemon that did not wait must still be able to end
	}
	return h.base.RoundTrip(r)
}

// TestAgentFlushesAHeldAckBeforeBye: the body has ended and its outcome is
// known, but its ack is held unanswered when the daemon is told to stop.
// The daemon flushes the ack before bye: the control plane answers it
// (recorded) before bye hands anything back, the invocation succeeds at
// attempt 1, and bye's inflight_abandoned is 0. The ack is let through only
// once the final flush has started (a hook), so a daemon that said bye
// without waiting would send it while the ack is still held.
func TestAgentFlushesAHeldAckBeforeBye(t *testing.T) {
	p, srvLogs := shutdownPlane(t)
	op := operator(p)
	ctx := context.Background()
	inv, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	logs := newLogRecorder()
	h := newAckHolder()
	t.Cleanup(h.open)
	a := newFakeTimeAgent(t, p, "held-ack", func(c *Config) {
		c.PollInterval = 100 * time.Millisecond
		c.HTTP = &http.Client{Transport: h, Timeout: requestTimeout}
		c.Logger = logs.logger()
	})
	a.testHookFlushing = h.open
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case <-h.held:
	case <-time.After(30 * time.Second):
		a.Stop()
		a.Stop()
		<-done
		t.Fatal("no ack within 30 s")
	}
	a.Stop() // the ack is still held
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of the stop")
	}
	events := h.log()
	answered := slices.IndexFunc(events, func(e string) bool { return strings.HasPrefix(e, "ack answered") })
	bye := slices.Index(events, "bye")
	if answered < 0 || bye < 0 || answered > bye || events[answered] != "ack answered 200 recorded=true" {
		t.Fatalf("transport events %q; want the held ack answered (200, recorded) before bye", events)
	}
	got, err := op.GetInvocation(ctx, inv.InvocationID)
	if err != nil || got.State != wire.StateSucceeded || got.Attempt != 1 {
		t.Fatalf("invocation %+v %v; want succeeded at attempt 1: its outcome was known before bye", got, err)
	}
	w := workerOf(t, p, "held-ack")
	if b := byeOf(t, srvLogs, w.WorkerID); b.Attrs["inflight_abandoned"] != int64(0) || b.Attrs["reason"] != wire.ByeSignal {
		t.Fatalf("bye %v; want reason signal, inflight_abandoned 0", b)
	}
	if left := logs.find(func(r logRecord) bool { return strings.HasPrefix(r.Msg, "acks still unanswered at bye") }); len(left) != 0 {
		t.Fatalf("logged %v", left)
	}
}
