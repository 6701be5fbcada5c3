package tests

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestAgentDrainCommand: an operator drain reaches the daemon on its next
// poll; it finishes its work, says bye{drain} and exits 0. The body waits
// for the test's word, so it is still running when the daemon drains.
func TestAgentDrainCommand(t *testing.T) {
	d := startDev(t, backends[0], "--stale-after", "3s")
	op := d.Operator()
	ctx := context.Background()
	n := startNymph(t, d, "drained")
	g := newExitGate(t)
	inv := submitSh(t, op, g.started()+g.await()+`; echo done`, 0)
	g.waitStarted(t)
	var w wire.Worker
	waittest.Until(t, 20*time.Second, "claimed", func() bool {
		got, _ := op.GetInvocation(ctx, inv.InvocationID)
		w, _ = workerNamed(ctx, op, "drained")
		return got.State == wire.StateRunning
	})
	if _, err := op.DrainWorker(ctx, w.WorkerID); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 20*time.Second, "draining", func() bool {
		w, _ := workerNamed(ctx, op, "drained")
		return w.State == "draining"
	})
	g.release(t)
	if code := n.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if got, _ := op.GetInvocation(ctx, inv.InvocationID); got.State != wire.StateSucceeded {
		t.Fatalf("in-flight work during drain: %s, want succeeded (it finishes inside the grace)", got.State)
	}
	if w, _ := workerNamed(ctx, op, "drained"); w.State != "gone" || w.RetiredWhy != "bye: drain" {
		t.Fatalf("after drain: %+v", w)
	}
}

// TestAgentHelloRefused: a wrong enrollment token is a refusal, not an
// outage: no retries, exit 3 (which the unit does not restart).
func TestAgentHelloRefused(t *testing.T) {
	d := startDev(t, backends[0])
	d.EnrollToken = "not-the-token"
	n := startNymph(t, d, "refused")
	if code := n.wait(t, 20*time.Second); code != agent.ExitHelloRefused {
		t.Fatalf("exit code %d, want %d", code, agent.ExitHelloRefused)
	}
	logs := n.logs.String()
	if !strings.Contains(logs, "hello failed") || strings.Contains(logs, "retrying") {
		t.Fatalf("log does not say hello failed at once, without retries:\n%s", logs)
	}
}

// TestAgentControlPlaneDownExits1: a control plane that never answers (a
// closed loopback port) is an outage: hello retries with backoff, every
// attempt (agent.DefaultHelloAttempts; there is no flag for it), then exit
// 1, which the unit restarts. The start lasts at least
// agent.HelloBackoffTotal, which the unit's start limit relies on to keep
// restarting through an outage (tests/infra_test.go). About 35 s.
func TestAgentControlPlaneDownExits1(t *testing.T) {
	t.Parallel()
	d := &devServer{URL: "http://" + closedPort(t), EnrollToken: "x"} // nothing answers
	// Build bin/nymph before the clock starts.
	bin(t, "nymph")
	started := time.Now()
	n := startNymph(t, d, "unreachable")
	code := n.wait(t, 2*time.Minute)
	took := time.Since(started)
	if code != agent.ExitFailure {
		t.Fatalf("exit code %d, want %d", code, agent.ExitFailure)
	}
	logs := n.logs.String()
	if got, want := strings.Count(logs, "hello failed; retrying"), agent.DefaultHelloAttempts-1; got != want {
		t.Errorf("%d retries logged, want %d", got, want)
	}
	if !strings.Contains(logs, `"msg":"hello failed"`) {
		t.Errorf("log does not say hello failed")
	}
	if took < agent.HelloBackoffTotal() {
		t.Errorf("gave up after %s, sooner than agent.HelloBackoffTotal %s", took, agent.HelloBackoffTotal())
	}
	t.Logf("exit %d after %s", code, took.Round(100*time.Millisecond))
}

// TestAgentSecondSignalSkipsGrace: the first SIGTERM drains with a long
// grace; the second ends it, killing the body (which ignores SIGTERM) after
// --kill-after and handing it back.
func TestAgentSecondSignalSkipsGrace(t *testing.T) {
	d := startDev(t, backends[0], "--stale-after", "60s")
	op := d.Operator()
	ctx := context.Background()
	n := startNymph(t, d, "impatient", "--grace", "10m", "--kill-after", "500ms")
	inv, _ := signalWithStubbornBody(t, op, n)
	waittest.Until(t, 10*time.Second, "draining", func() bool {
		w, _ := workerNamed(ctx, op, "impatient")
		return w.State == "draining"
	})
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	if code := n.wait(t, 60*time.Second); code != 0 { // far below the 10 m grace
		t.Fatalf("exit code %d", code)
	}
	if got, _ := op.GetInvocation(ctx, inv.InvocationID); got.State != wire.StateQueued {
		t.Fatalf("killed body's invocation: %s, want queued again", got.State)
	}
}

// TestAgentAckSurvivesRestart: a body finishes while the control plane is
// down; its ack is spooled. The daemon is then killed. A new daemon on the
// same state dir sends the spooled ack before its hello, so the outcome
// counts (attempt 1) instead of the work being run again.
func TestAgentAckSurvivesRestart(t *testing.T) {
	port := freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	prefix := storetest.Prefix(t)
	motoBackend := backend{"moto", func(t testing.TB) ([]string, []string) {
		args, env := backends[1].setup(t)
		return append(args, "--table-prefix", prefix, "--addr", addr), env
	}}
	d := startDev(t, motoBackend, "--stale-after", "60s")
	op := d.Operator()
	ctx := context.Background()
	dir := t.TempDir()
	first := startNymphIn(t, d, "restarted", dir)
	g := newExitGate(t)
	inv := submitSh(t, op, g.started()+g.await()+`; echo '{"from": "first"}' > "$NYMPH_RESULT_FILE"`, 0)
	g.waitStarted(t)
	waittest.Until(t, 20*time.Second, "claimed", func() bool {
		got, _ := op.GetInvocation(ctx, inv.InvocationID)
		return got.State == wire.StateRunning
	})
	d.stop(t) // the control plane goes away while the body runs
	g.release(t)
	waittest.Until(t, 20*time.Second, "ack spooled", func() bool {
		return strings.Contains(first.logs.String(), `"msg":"finished"`)
	})
	_ = first.cmd.Process.Signal(syscall.SIGKILL)
	first.wait(t, 10*time.Second)

	d2 := startDev(t, motoBackend, "--stale-after", "60s", "--enroll-token", d.EnrollToken, "--operator-token", d.OperatorToken)
	startNymphIn(t, d2, "restarted", dir)
	got := waitTerminal(t, d2.Operator(), inv.InvocationID, 30*time.Second)
	if got.State != wire.StateSucceeded || got.Attempt != 1 || string(got.ResultBlob) != `{"from":"first"}` {
		t.Fatalf("after restart: %+v; want the first process's outcome, attempt 1", got)
	}
}

// closedPort holds a loopback port whose every connection is closed at
// once: a control plane that is down. Holding it (rather than closing a
// free port) keeps a dev server of a test running alongside from taking it.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	return l.Addr().String()
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestAgentRunsSetupCommands: an operator's setup command moves the daemon
// to phase setup (no claims), runs, is reported with its output, and the
// daemon returns to ready and takes work. The command waits for the test's
// word, so work submitted meanwhile meets a worker in setup.
func TestAgentRunsSetupCommands(t *testing.T) {
	d := startDev(t, backends[0], "--stale-after", "3s")
	op := d.Operator()
	ctx := context.Background()
	startNymph(t, d, "setup-cmd")
	var w wire.Worker
	waittest.Until(t, 20*time.Second, "ready", func() bool {
		w, _ = workerNamed(ctx, op, "setup-cmd")
		return w.Phase == wire.PhaseReady
	})
	g := newExitGate(t)
	cmd, err := op.AddSetup(ctx, w.WorkerID, []string{"/bin/sh", "-c", g.started() + g.await() + "; echo installed; exit 0"})
	if err != nil {
		t.Fatal(err)
	}
	g.waitStarted(t)
	inv := submitSh(t, op, `echo after-setup`, 0)
	began := time.Now()
	// A heartbeat in phase setup after the submit: the worker could have
	// claimed the work then, and did not.
	waittest.Until(t, 20*time.Second, "a poll in phase setup", func() bool {
		w, _ := workerNamed(ctx, op, "setup-cmd")
		return w.Phase == wire.PhaseSetup && w.LastSeenAt != nil && w.LastSeenAt.After(began)
	})
	if got, _ := op.GetInvocation(ctx, inv.InvocationID); got.State != wire.StateQueued {
		t.Fatalf("work claimed while its worker ran a setup command: %+v", got)
	}
	held := time.Since(began)
	g.release(t)
	waittest.Until(t, 20*time.Second, "setup result reported", func() bool {
		r, err := op.SetupResults(ctx, w.WorkerID)
		return err == nil && len(r.SetupResults) == 1 && r.SetupResults[0].Status == wire.SetupSucceeded
	})
	r, _ := op.SetupResults(ctx, w.WorkerID)
	if got := r.SetupResults[0]; got.CommandID != cmd.CommandID || !strings.Contains(got.OutputTail, "installed") || got.DurationMS < held.Milliseconds() {
		t.Fatalf("setup result: %+v (it ran for over %s)", got, held)
	}
	got := waitTerminal(t, op, inv.InvocationID, 20*time.Second)
	if got.State != wire.StateSucceeded || got.StartedAt == nil || r.SetupResults[0].FinishedAt == nil || got.StartedAt.Before(*r.SetupResults[0].FinishedAt) {
		t.Fatalf("work started before its worker's setup finished: %+v", got)
	}
}

// TestAgentSurvivesControlPlaneRestart: an embedded `lakeshore dev` that
// restarts forgets every worker; the daemon's next poll is refused (401) and
// it says hello again as a new worker and takes work.
func TestAgentSurvivesControlPlaneRestart(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	d := startDev(t, backends[0], "--stale-after", "3s", "--addr", addr)
	startNymph(t, d, "phoenix")
	waittest.Until(t, 20*time.Second, "ready", func() bool {
		w, ok := workerNamed(context.Background(), d.Operator(), "phoenix")
		return ok && w.Phase == wire.PhaseReady
	})
	d.stop(t)
	d2 := startDev(t, backends[0], "--stale-after", "3s", "--addr", addr, "--enroll-token", d.EnrollToken, "--operator-token", d.OperatorToken)
	inv := submitSh(t, d2.Operator(), `echo back`, 0)
	if got := waitTerminal(t, d2.Operator(), inv.InvocationID, 30*time.Second); got.State != wire.StateSucceeded {
		t.Fatalf("after the control plane restarted: %+v", got)
	}
}

// TestAgentGraceExpiry: one SIGTERM, a body that ignores SIGTERM and
// outlives --grace: at grace expiry the daemon terminates it (SIGTERM to its
// group, --kill-after, SIGKILL), says bye with it abandoned, exits 0, and
// the invocation is queued again.
func TestAgentGraceExpiry(t *testing.T) {
	d := startDev(t, backends[0], "--stale-after", "60s")
	op := d.Operator()
	ctx := context.Background()
	n := startNymph(t, d, "stubborn", "--grace", "1s", "--kill-after", "500ms")
	inv, _ := signalWithStubbornBody(t, op, n)
	if code := n.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if !strings.Contains(n.logs.String(), "grace expired") || !strings.Contains(n.logs.String(), `"inflight_abandoned":1`) {
		t.Fatalf("log does not show the grace expiring with one body abandoned:\n%s", n.logs.String())
	}
	if got, _ := op.GetInvocation(ctx, inv.InvocationID); got.State != wire.StateQueued {
		t.Fatalf("abandoned invocation: %s, want queued again", got.State)
	}
}

// signalWithStubbornBody submits a body that ignores SIGTERM, waits until n
// runs it with its trap set, and sends n one SIGTERM. It reports the
// invocation as it ran and when the signal went.
func signalWithStubbornBody(t *testing.T, op *client.Client, n *nymphProc) (wire.Invocation, time.Time) {
	t.Helper()
	ctx := context.Background()
	g := newExitGate(t)
	inv := submitSh(t, op, `trap '' TERM; `+g.started()+`sleep 120`, 0)
	g.waitStarted(t) // the trap is set
	waittest.Until(t, 20*time.Second, "claimed", func() bool {
		got, err := op.GetInvocation(ctx, inv.InvocationID)
		if err == nil {
			inv = got
		}
		return inv.State == wire.StateRunning
	})
	sent := time.Now()
	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	return inv, sent
}

// exitGate is a pair of files that order a body (or a setup command) and
// the test without sleeping: the body creates one once it is set up (its
// trap installed); it waits for the test to create the other.
type exitGate struct{ dir string }

func newExitGate(t *testing.T) exitGate { return exitGate{dir: t.TempDir()} }

func exitShQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// started is the shell to run once the body is set up; it ends in "; ".
func (g exitGate) started() string {
	return ": > " + exitShQuote(filepath.Join(g.dir, "started")) + "; "
}

// await is the shell that waits for release, for at most two minutes.
func (g exitGate) await() string {
	return "i=0; while [ ! -e " + exitShQuote(filepath.Join(g.dir, "go")) + " ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done"
}

func (g exitGate) waitStarted(t *testing.T) {
	t.Helper()
	waittest.Until(t, 30*time.Second, "the body started (its gate file)", func() bool {
		_, err := os.Stat(filepath.Join(g.dir, "started"))
		return err == nil
	})
}

func (g exitGate) release(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(g.dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestAgentZeroGraceHandsBackAtOnce: --grace 0s is no grace and
// --kill-after 0s is SIGKILL right after SIGTERM (neither is a default in
// disguise): on SIGTERM a body that ignores SIGTERM is killed at once and
// handed back by bye. Measured from the signal until the invocation no
// longer runs on that worker, well under the 30 s and 10 s defaults.
func TestAgentZeroGraceHandsBackAtOnce(t *testing.T) {
	d := startDev(t, backends[0], "--stale-after", "60s")
	op := d.Operator()
	ctx := context.Background()
	n := startNymph(t, d, "hasty", "--grace", "0s", "--kill-after", "0s")
	held, sent := signalWithStubbornBody(t, op, n)
	deadline := sent.Add(20 * time.Second)
	for {
		got, err := op.GetInvocation(ctx, held.InvocationID)
		if err == nil && !(got.State == wire.StateRunning && got.WorkerID == held.WorkerID && got.Attempt == held.Attempt) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still running on its worker %s after SIGTERM (%+v, err %v)", time.Since(sent), got, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(sent)
	t.Logf("handed back %s after SIGTERM", took.Round(time.Millisecond))
	if took >= 2*time.Second {
		t.Errorf("handed back %s after SIGTERM with --grace 0s --kill-after 0s; want within 2 s", took)
	}
	if code := n.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if !strings.Contains(n.logs.String(), `"inflight_abandoned":1`) {
		t.Errorf("log does not show the body abandoned:\n%s", n.logs.String())
	}
	if got, _ := op.GetInvocation(ctx, held.InvocationID); got.State != wire.StateQueued {
		t.Errorf("abandoned invocation: %s, want queued again", got.State)
	}
}

// TestAgentSignalDuringHello: a daemon whose control plane does not answer
// stops promptly on SIGTERM instead of finishing hello's retries.
func TestAgentSignalDuringHello(t *testing.T) {
	d := &devServer{URL: "http://" + closedPort(t), EnrollToken: "x"} // nothing answers
	n := startNymph(t, d, "unheard")
	waittest.Until(t, 10*time.Second, "hello retrying", func() bool {
		return strings.Contains(n.logs.String(), "hello failed; retrying")
	})
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	if code := n.wait(t, 10*time.Second); code != 0 { // 8 retries would take ~40 s
		t.Fatalf("exit code %d", code)
	}
}
