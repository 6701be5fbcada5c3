package agent

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/acks"
	"github.com/dreamlake/lakeshore/agent/internal/health"
	"github.com/dreamlake/lakeshore/agent/internal/process"
	"github.com/dreamlake/lakeshore/agent/internal/process/proctest"
	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The shutdown paths: outcomes known at termination are acked, never
// handed back; a body whose cleanup cannot be confirmed fails the shutdown;
// a panicking loop or a failed start is a runtime failure.

// shutdownPlane is a control plane whose log the test reads (bye's
// inflight_abandoned).
func shutdownPlane(t *testing.T) (*apitest.Plane, *logRecorder) {
	t.Helper()
	logs := newLogRecorder()
	return apitest.New(t, func(c *apitest.Config) { c.Logger = logs.logger() }), logs
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
	a.testRunnerConfig = func(rc *process.Config) {
		rc.Hooks.BeforeWait = func(pid int) {
			// The body has exited when the drain starts, and stays
			// unreaped until the grace has expired and terminate's stop
			// has been dealt with.
			if err := proctest.WaitExitedNoReap(pid); err != nil {
				t.Errorf("waitid: %v", err)
			}
			a.Stop()
			<-released
		}
		rc.Hooks.StopHandled = func(int, bool) { release() }
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
	a.testRunnerConfig = func(rc *process.Config) {
		rc.LiveMembers = func(pgid int) []int { return []int{pgid} }
		rc.Hooks.BeforeWait = func(pid int) { bodyPid = pid; a.Stop() } // the signal comes once the body runs
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
	spool, err := acks.OpenSpool(a.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	a.ackDone = map[string]func(bool){}
	a.acker = acks.New(spool, acks.Options{Logger: a.log, HTTP: a.cfg.HTTP, OnAnswered: a.ackAnswered})
	a.runner = process.New(process.Config{Workdir: a.cfg.Workdir, KillAfter: a.cfg.KillAfter, BaseEnv: process.DefaultBaseEnv(os.Getenv), Logger: a.log})
	sess := session{workerID: "wrk_finish", token: "refused", interval: time.Second,
		api: client.New(p.URL, "refused", client.WithHTTPClient(noKeepAlive()))}
	st := &state{runs: map[string]*running{}, setupSeen: map[string]bool{}, sess: sess,
		phase: phaseDraining, byeReason: wire.ByeSignal}
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
