package tests

import (
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/store/storetest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestAgentDrainCommand: an operator drain reaches the daemon on its next
// poll; it finishes its work, says bye{drain} and exits 0.
func TestAgentDrainCommand(t *testing.T) {
	d := startDev(t, backends[0], "--stale-after", "3s")
	op := d.Operator()
	ctx := context.Background()
	n := startNymph(t, d, "drained")
	inv := submitSh(t, op, `sleep 1; echo done`, 0)
	var w wire.Worker
	eventually(t, 20*time.Second, "claimed", func() bool {
		got, _ := op.GetInvocation(ctx, inv.InvocationID)
		w, _ = workerNamed(ctx, op, "drained")
		return got.State == wire.StateRunning
	})
	if _, err := op.DrainWorker(ctx, w.WorkerID); err != nil {
		t.Fatal(err)
	}
	if code := n.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if got, _ := op.GetInvocation(ctx, inv.InvocationID); got.State != wire.StateSucceeded {
		t.Fatalf("in-flight work during drain: %s, want succeeded (it finishes inside the grace)", got.State)
	}
	if w, _ := workerNamed(ctx, op, "drained"); w.State != "gone" || w.ByeReason != "bye: drain" {
		t.Fatalf("after drain: %+v", w)
	}
}

// TestAgentHelloRefused: a wrong enrollment token is a refusal, not an
// outage: no retries, exit 1.
func TestAgentHelloRefused(t *testing.T) {
	d := startDev(t, backends[0])
	d.EnrollToken = "not-the-token"
	n := startNymph(t, d, "refused")
	if code := n.wait(t, 20*time.Second); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
	if !strings.Contains(n.logs.String(), "hello failed") {
		t.Fatalf("log does not say hello failed:\n%s", n.logs.String())
	}
}

// TestAgentSecondSignalSkipsGrace: the first SIGTERM drains with a long
// grace; the second ends it, killing the body (which ignores SIGTERM) after
// --kill-after and handing it back.
func TestAgentSecondSignalSkipsGrace(t *testing.T) {
	d := startDev(t, backends[0], "--stale-after", "60s")
	op := d.Operator()
	ctx := context.Background()
	n := startNymph(t, d, "impatient", "--grace", "10m", "--kill-after", "500ms")
	inv := signalWithStubbornBody(t, op, n)
	eventually(t, 10*time.Second, "draining", func() bool {
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
	motoBackend := backend{"moto", func(t *testing.T) ([]string, []string) {
		args, env := backends[1].setup(t)
		return append(args, "--table-prefix", prefix, "--addr", addr), env
	}}
	d := startDev(t, motoBackend, "--stale-after", "60s")
	op := d.Operator()
	ctx := context.Background()
	dir := t.TempDir()
	first := startNymphIn(t, d, "restarted", dir)
	inv := submitSh(t, op, `sleep 2; echo '{"from": "first"}' > "$NYMPH_RESULT_FILE"`, 0)
	eventually(t, 20*time.Second, "claimed", func() bool {
		got, _ := op.GetInvocation(ctx, inv.InvocationID)
		return got.State == wire.StateRunning
	})
	d.stop(t) // the control plane goes away while the body runs
	eventually(t, 20*time.Second, "ack spooled", func() bool {
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
// daemon returns to ready and takes work.
func TestAgentRunsSetupCommands(t *testing.T) {
	d := startDev(t, backends[0], "--stale-after", "3s")
	op := d.Operator()
	ctx := context.Background()
	startNymph(t, d, "setup-cmd")
	var w wire.Worker
	eventually(t, 20*time.Second, "ready", func() bool {
		w, _ = workerNamed(ctx, op, "setup-cmd")
		return w.Phase == wire.PhaseReady
	})
	cmd, err := op.AddSetup(ctx, w.WorkerID, []string{"/bin/sh", "-c", "sleep 1; echo installed; exit 0"})
	if err != nil {
		t.Fatal(err)
	}
	inv := submitSh(t, op, `echo after-setup`, 0)
	eventually(t, 20*time.Second, "setup result reported", func() bool {
		r, err := op.SetupResults(ctx, w.WorkerID)
		return err == nil && len(r.SetupResults) == 1 && r.SetupResults[0].Status == wire.SetupSucceeded
	})
	r, _ := op.SetupResults(ctx, w.WorkerID)
	if got := r.SetupResults[0]; got.CommandID != cmd.CommandID || !strings.Contains(got.OutputTail, "installed") || got.DurationMS < 900 {
		t.Fatalf("setup result: %+v", got)
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
	eventually(t, 20*time.Second, "ready", func() bool {
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
	inv := signalWithStubbornBody(t, op, n)
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
// runs it, and sends n one SIGTERM.
func signalWithStubbornBody(t *testing.T, op *client.Client, n *nymphProc) wire.Invocation {
	t.Helper()
	ctx := context.Background()
	inv := submitSh(t, op, `trap '' TERM; sleep 120`, 0)
	eventually(t, 20*time.Second, "claimed", func() bool {
		got, _ := op.GetInvocation(ctx, inv.InvocationID)
		return got.State == wire.StateRunning
	})
	time.Sleep(300 * time.Millisecond) // let the body set its trap
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	return inv
}

// TestAgentSignalDuringHello: a daemon whose control plane does not answer
// stops promptly on SIGTERM instead of finishing hello's retries.
func TestAgentSignalDuringHello(t *testing.T) {
	d := &devServer{URL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), EnrollToken: "x"} // nothing listens
	n := startNymph(t, d, "unheard")
	eventually(t, 10*time.Second, "hello retrying", func() bool {
		return strings.Contains(n.logs.String(), "hello failed; retrying")
	})
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	if code := n.wait(t, 10*time.Second); code != 0 { // 8 retries would take ~40 s
		t.Fatalf("exit code %d", code)
	}
}
