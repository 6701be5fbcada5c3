package tests

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestTokenRotation: the enrollment and operator tokens change while the
// fleet runs (docs/operations.md, "Rotating tokens"). One store outlives
// three control planes on one address: the first knows only the old
// tokens; the second takes the new ones and still accepts the old (both
// operator tokens work, a daemon says hello with either); a daemon
// restarts with the new enrollment token; the third knows only the new
// ones and refuses the old. Work submitted all along finishes, each once.
func TestTokenRotation(t *testing.T) {
	t.Parallel()
	shared, addr := sharedStore(t), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	const (
		oldEnroll, newEnroll     = "enroll-token-old-0123456789abcdef", "enroll-token-new-0123456789abcdef"
		oldOperator, newOperator = "operator-token-old-0123456789abcd", "operator-token-new-0123456789abcd"
	)
	dev := func(enroll, operator string) *devServer {
		return startDev(t, shared, "--addr", addr, "--stale-after", "10s", "--enroll-token", enroll, "--operator-token", operator)
	}
	ctx := context.Background()
	var ids []string
	submit := func(d *devServer, operator string, n int) {
		t.Helper()
		for i := range n {
			inv, _, err := client.New(d.URL, operator).Submit(ctx, wire.SubmitRequest{Queue: "q",
				Argv: []string{"/bin/sh", "-c", fmt.Sprintf("sleep 1; echo %d", len(ids)+i)}})
			if err != nil {
				t.Fatalf("submit with the %s operator token: %v", map[string]string{oldOperator: "old", newOperator: "new"}[operator], err)
			}
			ids = append(ids, inv.InvocationID)
		}
	}
	active := func(d *devServer, label string) {
		t.Helper()
		waittest.Until(t, time.Minute, label+" active", func() bool {
			w, ok := workerNamed(ctx, d.Operator(), label)
			return ok && w.State == "active"
		})
	}

	// The old tokens only.
	d1 := dev(oldEnroll, oldOperator)
	dirA := t.TempDir()
	a := startNymphIn(t, d1, "rot-a", dirA, "--capacity", "2")
	active(d1, "rot-a")
	submit(d1, oldOperator, 6)
	d1.stop(t)

	// The overlap: new tokens current, the old still accepted.
	d2 := dev(newEnroll+","+oldEnroll, newOperator+","+oldOperator)
	if d2.EnrollToken != newEnroll || d2.OperatorToken != newOperator {
		t.Fatalf("lakeshore dev printed %q and %q, want the current (new) tokens", d2.EnrollToken, d2.OperatorToken)
	}
	for _, tok := range []string{oldOperator, newOperator} {
		if _, err := client.New(d2.URL, tok).ListWorkers(ctx, 10, ""); err != nil {
			t.Fatalf("during the overlap an operator token was refused: %v", err)
		}
	}
	submit(d2, oldOperator, 3)
	submit(d2, newOperator, 3)
	oldTokenDev := *d2
	oldTokenDev.EnrollToken = oldEnroll
	startNymph(t, &oldTokenDev, "rot-old-enroll")
	startNymph(t, d2, "rot-new-enroll")
	active(d2, "rot-old-enroll")
	active(d2, "rot-new-enroll")
	// rot-a moves to the new token: it drains (its work finishes or goes
	// back), and says hello again with the new one.
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := a.wait(t, time.Minute); code != 0 {
		t.Fatalf("rot-a exited %d on its drain", code)
	}
	startNymphIn(t, d2, "rot-a", dirA, "--capacity", "2")
	waittest.Until(t, time.Minute, "rot-a active again, with the new token", func() bool {
		w, ok := workerNamed(ctx, d2.Operator(), "rot-a")
		return ok && w.State == "active" && w.CreatedAt.After(time.Now().Add(-time.Minute))
	})
	d2.stop(t)

	// The old tokens removed.
	d3 := dev(newEnroll, newOperator)
	if _, err := client.New(d3.URL, oldOperator).ListWorkers(ctx, 10, ""); !errors.Is(err, wire.ErrUnauthorized) {
		t.Fatalf("the old operator token after the rotation: %v, want 401", err)
	}
	if _, err := client.New(d3.URL, oldEnroll).Hello(ctx, wire.HelloRequest{MachineID: "late", BootID: "b", Lanes: []string{"q"}}); !errors.Is(err, wire.ErrUnauthorized) {
		t.Fatalf("hello with the old enrollment token after the rotation: %v, want 401", err)
	}
	submit(d3, newOperator, 6)
	for _, id := range ids {
		if inv := waitTerminal(t, d3.Operator(), id, 2*time.Minute); inv.State != wire.StateSucceeded {
			t.Fatalf("%s: %s (%+v), want succeeded", id, inv.State, inv.Error)
		}
	}
	stats, err := d3.Operator().QueueStats(ctx, "q")
	if err != nil || stats.DoneCount != len(ids) || stats.Counts[wire.StateSucceeded] != len(ids) {
		t.Fatalf("after the rotation: %+v %v; want done_count %d, all succeeded", stats, err, len(ids))
	}
}
