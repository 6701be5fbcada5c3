package tests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// gatedBody runs until the file $GATE exists (at most 60 s), then exits 0:
// a body longer than stale_after whose end the test decides.
const gatedBody = `i=0; while [ ! -e "$GATE" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done`

// TestStaleWorkerReturns: a worker that comes back after its work was
// handed out again changes nothing. Nymph A (capacity 8) runs 8
// invocations; A is frozen (SIGSTOP) past stale_after; its work is handed
// to nymph B and runs there as attempt 2; A wakes (SIGCONT), polls, and is
// told its attempts were superseded. A kills its bodies and acks them cancelled; those acks must
// change nothing: every invocation ends succeeded by B's attempt 2,
// done_count 8, none cancelled. Runs in process and through the Lambda
// bootstraps.
func TestStaleWorkerReturns(t *testing.T) {
	t.Parallel()
	for _, b := range []backend{backends[0], lambdasBackend} {
		t.Run(b.name, func(t *testing.T) { staleWorkerReturns(t, b) })
	}
}

func staleWorkerReturns(t *testing.T, b backend) {
	const n = 8
	d := startDev(t, b, "--stale-after", "3s")
	op := d.Operator()
	ctx := context.Background()
	gate := filepath.Join(t.TempDir(), "gate")
	a := startNymph(t, d, "returns", "--capacity", fmt.Sprint(n))
	var ids []string
	for i := range n {
		inv, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"/bin/sh", "-c", gatedBody},
			Env: map[string]string{"GATE": gate}, IdempotencyKey: fmt.Sprintf("stale-return-%d", i)})
		if err != nil {
			t.Fatalf("submit: %v", err)
		}
		ids = append(ids, inv.InvocationID)
	}
	allOf := func(what string, cond func(wire.Invocation) bool) {
		t.Helper()
		waittest.Until(t, time.Minute, what, func() bool {
			for _, id := range ids {
				inv, err := op.GetInvocation(ctx, id)
				if err != nil || !cond(inv) {
					return false
				}
			}
			return true
		})
	}
	var wa wire.Worker
	waittest.Until(t, 30*time.Second, "A registered", func() bool {
		var ok bool
		wa, ok = workerNamed(ctx, op, "returns")
		return ok
	})
	allOf("all 8 running on A", func(inv wire.Invocation) bool {
		return inv.State == wire.StateRunning && inv.WorkerID == wa.WorkerID && inv.Attempt == 1
	})

	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	startNymph(t, d, "takes-over", "--capacity", fmt.Sprint(n))
	allOf("all 8 redelivered and running on B as attempt 2", func(inv wire.Invocation) bool {
		return inv.State == wire.StateRunning && inv.WorkerID != wa.WorkerID && inv.Attempt == 2
	})

	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// A is told, with the reason, to stop every superseded attempt, and its
	// bodies' cancelled acks are answered while B's attempts still run (B's
	// bodies wait for the gate).
	waittest.Until(t, 30*time.Second, "A told to stop its 8 superseded attempts", func() bool {
		return strings.Count(a.logs.String(), `"reason":"superseded"`) >= n
	})
	waittest.Until(t, 30*time.Second, "A's 8 cancelled acks answered", func() bool {
		return strings.Count(a.logs.String(), `"msg":"ack answered"`) >= n
	})
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	allOf("all 8 finished", func(inv wire.Invocation) bool { return wire.Terminal(inv.State) })
	for _, id := range ids {
		inv, err := op.GetInvocation(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if inv.State != wire.StateSucceeded {
			t.Errorf("%s ended %s (attempt %d, worker %s, error %+v); nobody cancelled it, want succeeded",
				id, inv.State, inv.Attempt, inv.WorkerID, inv.Error)
		}
	}
	st, err := op.QueueStats(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	if st.DoneCount != n || st.Counts[wire.StateSucceeded] != n || st.Counts[wire.StateCancelled] != 0 {
		t.Fatalf("queue: done_count %d, counts %v; want %d succeeded, none cancelled", st.DoneCount, st.Counts, n)
	}
}
