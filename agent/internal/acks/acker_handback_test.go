package acks

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestAckerRefusedHandBack: a requeued ack from a worker the control plane
// does not see draining (stored active, the ack saying ready) is refused
// with a 409 by the real control plane. The acker tries it once, drops it
// from the spool and logs a warning that says the hand-back was refused,
// with its state and phase; the attempt stays running. The same ack saying
// draining is then accepted: the invocation is queued again.
func TestAckerRefusedHandBack(t *testing.T) {
	plane := apitest.New(t)
	w := ackerTestClaim(t, plane, "machine-1", 1)
	k, s, rec, log := ackerTestNew(t, t.TempDir())

	a := w.ack(0, plane.URL)
	a.Ack.State, a.Ack.Phase = wire.AckRequeued, wire.PhaseReady
	a.Ack.Error = &wire.ErrorInfo{Type: wire.AckRequeued, Message: "asked on its lifecycle endpoint"}
	ackerTestRefused(t, k, s, rec, log, plane, a, wire.ErrConflict, func(l map[string]any) bool {
		msg, _ := l["msg"].(string)
		return strings.HasPrefix(msg, "hand-back refused") && l["status"] == float64(409) &&
			l["state"] == wire.AckRequeued && l["phase"] == wire.PhaseReady
	})

	a.Ack.Phase = wire.PhaseDraining
	if err := k.Submit(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	ackerTestFlush(t, k)
	if answers, _ := rec.got(); len(answers) != 2 || answers[1].err != nil || !answers[1].resp.Recorded {
		t.Fatalf("answers %+v, want the draining hand-back recorded", answers)
	}
	if inv := ackerTestInvocation(t, plane, a.Ack.InvocationID); inv.State != wire.StateQueued {
		t.Errorf("invocation reads %s after the draining hand-back, want queued", inv.State)
	}
}

// TestAckerResendsAnOldRequeuedAck: a requeued ack an older nymph spooled
// has no phase (its file carries no phase field); resent at start, the
// control plane accepts it as it always did, and the invocation is queued
// again.
func TestAckerResendsAnOldRequeuedAck(t *testing.T) {
	plane := apitest.New(t)
	w := ackerTestClaim(t, plane, "machine-1", 1)
	dir := t.TempDir()
	a := w.ack(0, plane.URL)
	a.Ack.State, a.Ack.Phase = wire.AckRequeued, ""
	a.Ack.Error = &wire.ErrorInfo{Type: wire.AckRequeued, Message: "exited with status 75"}
	if err := spoolTestOpen(t, dir).Put(a); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(spoolTestOpen(t, dir).Dir(), spoolFileName(a.Ack.InvocationID, a.Ack.Attempt))
	if b, err := os.ReadFile(file); err != nil || strings.Contains(string(b), `"phase"`) {
		t.Fatalf("spooled file %s (%v); want one without a phase, as an older nymph wrote it", b, err)
	}
	k, s, rec, _ := ackerTestNew(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := k.Resend(ctx); err != nil {
		t.Fatal(err)
	}
	if answers, _ := rec.got(); len(answers) != 1 || answers[0].err != nil || !answers[0].resp.Recorded {
		t.Fatalf("answers %+v, want the old hand-back recorded", answers)
	}
	if n := ackerTestSpoolLen(t, s); n != 0 {
		t.Errorf("spool holds %d acks", n)
	}
	if inv := ackerTestInvocation(t, plane, a.Ack.InvocationID); inv.State != wire.StateQueued {
		t.Errorf("invocation reads %s after the old hand-back, want queued", inv.State)
	}
}
