package api_test

import (
	"testing"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestLateRequeuedAckOfAnEarlierAttemptOfTheSameWorker drives the real
// router over the embedded store: worker a's attempt 1 is taken back (its
// poll no longer lists it), a claims the invocation again as attempt 2,
// and then a's spooled requeued ack for attempt 1 arrives. The ack is a
// no-op: attempt 2 stays running on a and out of the queue, so worker b
// is handed nothing — the work never runs twice at once.
func TestLateRequeuedAckOfAnEarlierAttemptOfTheSameWorker(t *testing.T) {
	h := newHarness(t)
	a := h.hello("ma", "boot")
	inv := h.submit("train")
	id := inv.InvocationID
	if got := runIDs(h.poll(a, wire.PollRequest{Phase: wire.PhaseReady})); len(got) != 1 || got[0] != id {
		t.Fatalf("a claimed %v, want %s", got, id)
	}
	// a's next poll lists nothing in flight: attempt 1 is taken back.
	h.poll(a, wire.PollRequest{Phase: wire.PhaseSetup, Invocations: []string{},
		UpdatedCapabilities: &wire.Capabilities{CurrentInvocations: intp(0)}})
	if got := h.invocation(id); got.State != wire.StateQueued || got.Attempt != 1 {
		t.Fatalf("after a's poll without it: %s attempt %d, want queued after attempt 1", got.State, got.Attempt)
	}
	var second []wire.Command
	for _, c := range ofType(h.poll(a, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{}}), wire.CommandRun) {
		if c.Invocation != nil && c.Invocation.InvocationID == id {
			second = append(second, c)
		}
	}
	if len(second) != 1 || second[0].Invocation.Attempt != 2 {
		t.Fatalf("a's claim again: %+v, want attempt 2 of %s", second, id)
	}

	resp := h.ack(a, wire.AckRequest{InvocationID: id, Attempt: 1, State: wire.AckRequeued, ExitCode: intp(75)})
	if resp.Recorded || resp.State != wire.StateRunning {
		t.Errorf("a's late requeued ack of attempt 1 answered %+v, want recorded false, still running", resp)
	}
	got := h.invocation(id)
	if got.State != wire.StateRunning || got.Attempt != 2 || got.WorkerID != a.id {
		t.Errorf("after the late ack: %s attempt %d on %s, want attempt 2 still running on a (%s)", got.State, got.Attempt, got.WorkerID, a.id)
	}
	if n := len(got.Attempts); n != 2 || got.Attempts[1].Outcome != "" {
		t.Errorf("history after the late ack: %+v, want attempt 2 still running", got.Attempts)
	}
	b := h.hello("mb", "boot")
	if ran := runIDs(h.poll(b, wire.PollRequest{Phase: wire.PhaseReady})); len(ran) != 0 {
		t.Errorf("b was handed %v while a still runs attempt 2: the work would run twice at once", ran)
	}
}
