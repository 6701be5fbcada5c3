package tests

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestAgentMachineIDConflict: two nymphs with one --machine-id (a cloned
// image) do not replace each other forever: the one replaced while it
// runs stops with exit 5 and says why; the other carries on; the control
// plane records the conflict on the replaced worker; the replaced nymph
// logs its exit for reason conflict and says no bye; no work is lost, and
// the worker list holds two rows, not dozens.
func TestAgentMachineIDConflict(t *testing.T) {
	t.Parallel()
	d := startDev(t, backends[0], "--stale-after", "3s")
	op := d.Operator()
	first := startNymph(t, d, "clone-a", "--machine-id", "cloned-machine", "--capacity", "2")
	waittest.Until(t, 30*time.Second, "the first nymph active", func() bool {
		ws, err := op.ListWorkers(context.Background(), 10, "")
		return err == nil && len(ws.Workers) == 1 && ws.Workers[0].State == "active"
	})
	var ids []string
	for range 4 {
		ids = append(ids, submitSh(t, op, "sleep 2", 0).InvocationID)
	}
	waittest.Until(t, 30*time.Second, "the first nymph running work", func() bool {
		inv, err := op.GetInvocation(context.Background(), ids[0])
		return err == nil && inv.State == wire.StateRunning
	})
	startNymph(t, d, "clone-b", "--machine-id", "cloned-machine", "--capacity", "2")

	select {
	case <-first.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the replaced nymph did not stop")
	}
	var exit *exec.ExitError
	if !errors.As(first.err, &exit) || exit.ExitCode() != agent.ExitMachineConflict {
		t.Fatalf("the replaced nymph ended with %v, want exit %d", first.err, agent.ExitMachineConflict)
	}
	if !strings.Contains(first.logs.String(), "machine id conflict") {
		t.Errorf("the replaced nymph did not say why it stopped:\n%s", first.logs.String())
	}
	// Its last line says why it stopped, and it says no bye: the hello
	// that replaced it retired its worker, so a bye could only name a
	// reason that is not why it stops.
	if exits := first.logLines(t, "exit"); len(exits) != 1 || exits[0]["reason"] != "conflict" {
		t.Errorf("the replaced nymph's exit lines %v, want one with reason conflict", exits)
	}
	for _, line := range strings.Split(d.logText(), "\n") {
		if strings.Contains(line, `"msg":"bye"`) {
			t.Errorf("the control plane heard a bye from the replaced nymph: %s", line)
		}
	}

	for _, id := range ids {
		if got := waitTerminal(t, op, id, time.Minute); got.State != wire.StateSucceeded {
			t.Errorf("%s ended %s (%+v); want succeeded: no work lost", id, got.State, got.Error)
		}
	}
	ws, err := op.ListWorkers(context.Background(), 100, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(ws.Workers) != 2 {
		t.Fatalf("%d worker rows, want 2 (the two processes, no replacement loop)", len(ws.Workers))
	}
	var live, replaced int
	for _, w := range ws.Workers {
		switch {
		case w.State == "active":
			live++
		case w.State == "gone" && strings.Contains(w.StateWhy, "another process uses machine id"):
			replaced++
		default:
			t.Errorf("worker %s: %s %q", w.WorkerID, w.State, w.StateWhy)
		}
	}
	if live != 1 || replaced != 1 {
		t.Fatalf("%d live and %d replaced workers with the conflict on record, want 1 and 1", live, replaced)
	}
}
