package tests

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// runCLI runs bin/lakeshore against d as the operator and returns its stdout.
func runCLI(t *testing.T, d *devServer, args ...string) string {
	t.Helper()
	cmd := exec.Command(lakeshoreBin(t), args...)
	cmd.Env = append(cmd.Environ(), "LAKESHORE_URL="+d.URL, "LAKESHORE_TOKEN="+d.OperatorToken)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("lakeshore %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// hostSetupFailed reports whether w's last setup result is cmd's failure.
func hostSetupFailed(w wire.Worker, cmd string) bool {
	r := w.LastSetupResult
	return r != nil && r.CommandID == "" && r.Command == cmd && r.Status == wire.SetupFailed
}

// TestAgentHostSetupFailure: `nymph --host-setup 'exit 3' --keep-alive 3s`
// reports the failure to the control plane while it sits in setup (claiming
// nothing), the operator views say why, and nobody repairing it, it leaves
// by keep-alive: bye{idle}, exit 4.
func TestAgentHostSetupFailure(t *testing.T) {
	t.Parallel()
	forEachPlane(t, func(t *testing.T, b backend) {
		d := startDev(t, b, "--stale-after", "3s") // polls every 0.5 s
		op := d.Operator()
		ctx := context.Background()
		inv := submitSh(t, op, `echo never`, 0, "exit 3")
		n := startNymph(t, d, "broken", "--host-setup", "exit 3", "--keep-alive", "3s")

		var w wire.Worker
		waittest.Until(t, 20*time.Second, "the host setup's failure on the control plane", func() bool {
			w, _ = workerNamed(ctx, op, "broken")
			return hostSetupFailed(w, "exit 3")
		})
		// Reported on the poll after the failure, well before the 3 s
		// keep-alive ran out: the worker still sits in setup.
		if w.State != "setting_up" || w.Phase != wire.PhaseSetup || w.LastSetupResult.ExitCode != 3 {
			t.Errorf("worker when its failure showed: %s in phase %s, last setup %+v; want setting_up in setup, exit 3",
				w.State, w.Phase, w.LastSetupResult)
		}
		if out := runCLI(t, d, "ls", "workers"); !strings.Contains(out, "setup failed: `exit 3` exit 3") {
			t.Errorf("ls workers does not say why:\n%s", out)
		}
		if out := runCLI(t, d, "get", w.WorkerID); !strings.Contains(out, "setup failed: `exit 3` exit 3") {
			t.Errorf("get worker does not say why:\n%s", out)
		}

		if code := n.wait(t, 30*time.Second); code != 4 {
			t.Errorf("exit code %d, want 4 (host setup failed and was not repaired)", code)
		}
		w, _ = workerNamed(ctx, op, "broken")
		if w.State != "gone" || w.RetiredWhy != "bye: idle" || !hostSetupFailed(w, "exit 3") {
			t.Errorf("after keep-alive: %+v", w)
		}
		if got, err := op.GetInvocation(ctx, inv.InvocationID); err != nil || got.State != wire.StateQueued || got.Attempt != 0 {
			t.Errorf("work for the broken host: %+v %v; want never claimed", got, err)
		}
	})
}

// TestAgentHostSetupRepaired: a host setup that fails until a file exists;
// the operator sends `touch` as a setup command; the host setup reruns,
// succeeds, and the worker becomes ready and runs the work waiting for it.
func TestAgentHostSetupRepaired(t *testing.T) {
	forEachPlane(t, func(t *testing.T, b backend) {
		d := startDev(t, b, "--stale-after", "3s")
		op := d.Operator()
		ctx := context.Background()
		fixed := filepath.Join(t.TempDir(), "fixed")
		setup := "test -f '" + fixed + "'"
		inv := submitSh(t, op, `echo repaired`, 0, setup)
		n := startNymph(t, d, "repairable", "--host-setup", setup, "--keep-alive", "60s")

		var w wire.Worker
		waittest.Until(t, 20*time.Second, "the host setup's failure on the control plane", func() bool {
			w, _ = workerNamed(ctx, op, "repairable")
			return hostSetupFailed(w, setup)
		})
		if _, err := op.AddSetup(ctx, w.WorkerID, []string{"touch", fixed}); err != nil {
			t.Fatal(err)
		}
		got := waitTerminal(t, op, inv.InvocationID, 30*time.Second)
		if got.State != wire.StateSucceeded || !strings.Contains(got.StdoutTail, "repaired") || got.WorkerID != w.WorkerID {
			t.Fatalf("work after the repair: %+v", got)
		}
		w, _ = workerNamed(ctx, op, "repairable")
		if r := w.LastSetupResult; r == nil || r.Command != setup || r.Status != wire.SetupSucceeded || w.Phase != wire.PhaseReady {
			t.Errorf("worker after the repair: phase %s, last setup %+v; want ready after the host setup's successful rerun", w.Phase, r)
		}
		if res, err := op.SetupResults(ctx, w.WorkerID); err != nil || len(res.SetupResults) != 1 || res.SetupResults[0].Status != wire.SetupSucceeded {
			t.Errorf("setup commands: %+v %v; want the repair, succeeded", res, err)
		}

		if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := n.wait(t, 30*time.Second); code != 0 {
			t.Errorf("SIGTERM exit code %d, want 0", code)
		}
	})
}
