package api_test

import (
	"fmt"
	"testing"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestRequeuedAckNeedsADrain drives the real router over the embedded
// store: a's requeued ack saying phase ready is a 409 conflict that
// changes no table, and so is nothing a caller without a's secret sends
// saying draining (b's token: 403; a forged secret: 401) — none of them
// drains a. a's own ack saying draining hands the attempt back and leaves
// a stored draining: its next poll is told to drain and claims nothing.
func TestRequeuedAckNeedsADrain(t *testing.T) {
	h := newHarness(t)
	a := h.hello("ma", "boot")
	b := h.hello("mb", "boot")
	id := h.submit("train").InvocationID
	if got := runIDs(h.poll(a, wire.PollRequest{Phase: wire.PhaseReady})); len(got) != 1 || got[0] != id {
		t.Fatalf("a claimed %v, want %s", got, id)
	}
	body := func(phase string) string {
		return fmt.Sprintf(`{"worker_id":%q,"invocation_id":%q,"attempt":1,"state":"requeued","exit_code":75,"phase":%q}`, a.id, id, phase)
	}
	h.unchanged(t, func() {
		h.do("POST", "/v1/daemon/ack", a.token, body(wire.PhaseReady)).wantError(t, 409, wire.CodeConflict)
		h.do("POST", "/v1/daemon/ack", b.token, body(wire.PhaseDraining)).wantError(t, 403, wire.CodeForbidden)
		forged := a.token[:len(a.token)-4] + "zzzz"
		if forged == a.token {
			forged = a.token[:len(a.token)-4] + "yyyy"
		}
		h.do("POST", "/v1/daemon/ack", forged, body(wire.PhaseDraining)).wantError(t, 401, wire.CodeUnauthorized)
		h.do("POST", "/v1/daemon/ack", a.token, body("sleeping")).wantError(t, 400, wire.CodeInvalid)
	})
	if got := h.invocation(id); got.State != wire.StateRunning || got.WorkerID != a.id {
		t.Fatalf("after the refusals: %s on %s, want running on a", got.State, got.WorkerID)
	}

	var resp wire.AckResponse
	h.do("POST", "/v1/daemon/ack", a.token, body(wire.PhaseDraining)).want(t, 200, &resp)
	if !resp.Recorded || resp.State != wire.StateQueued {
		t.Fatalf("a's requeued ack saying draining answered %+v, want recorded, queued", resp)
	}
	if w := h.worker(a.id); w.StoredState != "draining" {
		t.Errorf("a reads stored state %q after its hand-back, want draining", w.StoredState)
	}
	cmds := h.poll(a, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{}})
	if ran := runIDs(cmds); len(ran) != 0 || len(ofType(cmds, wire.CommandDrain)) != 1 {
		t.Errorf("a's next poll answered %+v, want a drain command and no run", cmds)
	}
	if ran := runIDs(h.poll(b, wire.PollRequest{Phase: wire.PhaseReady})); len(ran) != 1 || ran[0] != id {
		t.Errorf("b claimed %v, want the handed-back %s", ran, id)
	}
}
