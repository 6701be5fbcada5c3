package api_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestWorkerReturnsFromStale is the worker that comes back: a runs two
// invocations, falls silent past stale_after, the sweep hands its work to
// b, and a polls again. a is told to stop both, with reason superseded; the
// cancelled acks of its killed bodies are no-ops; b's attempts run on and
// their outcomes count. Nothing ends cancelled: nobody cancelled anything.
func TestWorkerReturnsFromStale(t *testing.T) {
	c := newClock()
	h := newHarness(t, withClock(c), func(cfg *apitest.Config) { cfg.Control.StaleAfter = 3 * time.Second })
	a := h.hello("ma", "boot")
	invs := []wire.Invocation{h.submit("sleep", "7"), h.submit("sleep", "7")}
	ids := []string{invs[0].InvocationID, invs[1].InvocationID}
	slices.Sort(ids)
	cap2 := &wire.Capabilities{MaxConcurrency: intp(2)}
	got := runIDs(h.poll(a, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{}, UpdatedCapabilities: cap2}))
	slices.Sort(got)
	if !slices.Equal(got, ids) {
		t.Fatalf("a claimed %v, want %v", got, ids)
	}

	c.Advance(4 * time.Second) // a is frozen past stale_after
	sweeper := control.New(control.Config{Store: h.store, StaleAfter: 3 * time.Second, Clock: c.Clock(), Logger: slog.New(slog.DiscardHandler)})
	if _, err := sweeper.Sweep(context.Background()); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if w := h.worker(a.id); w.State != "stale" || w.CurrentInvocations != 0 || w.StateSince == nil ||
		!w.StateSince.Equal(*w.LastSeenAt) || w.StateWhy != "silent for 4s; stale after 3s" {
		t.Errorf("stale a reads %s %d/%d since %v: %q; want stale 0/2 (its work handed back) since it was last seen",
			w.State, w.CurrentInvocations, w.MaxConcurrency, w.StateSince, w.StateWhy)
	}
	b := h.hello("mb", "boot")
	got = runIDs(h.poll(b, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{}, UpdatedCapabilities: cap2}))
	slices.Sort(got)
	if !slices.Equal(got, ids) {
		t.Fatalf("b claimed %v, want the redelivered %v", got, ids)
	}

	// a wakes and polls with what it still runs.
	cmds := h.poll(a, wire.PollRequest{Phase: wire.PhaseReady, Invocations: ids,
		UpdatedCapabilities: &wire.Capabilities{CurrentInvocations: intp(2)}})
	cancels := ofType(cmds, wire.CommandCancel)
	if len(cancels) != 2 {
		t.Fatalf("returning worker's poll answered %+v, want two cancels", cmds)
	}
	for _, cmd := range cancels {
		if cmd.Reason != wire.CancelSuperseded {
			t.Errorf("cancel of %s says reason %q, want %q", cmd.InvocationID, cmd.Reason, wire.CancelSuperseded)
		}
		resp := h.ack(a, wire.AckRequest{InvocationID: cmd.InvocationID, Attempt: 1, State: wire.StateCancelled, ExitCode: intp(143)})
		if resp.Recorded || resp.State != wire.StateRunning {
			t.Errorf("a's cancelled ack of superseded attempt 1 of %s answered %+v, want recorded false, still running", cmd.InvocationID, resp)
		}
	}
	for _, id := range ids {
		if inv := h.invocation(id); inv.State != wire.StateRunning || inv.WorkerID != b.id || inv.Attempt != 2 {
			t.Errorf("%s after a's return: %s on %s attempt %d, want running on b, attempt 2", id, inv.State, inv.WorkerID, inv.Attempt)
		}
		if resp := h.ack(b, wire.AckRequest{InvocationID: id, Attempt: 2, State: wire.StateSucceeded, ExitCode: intp(0)}); !resp.Recorded {
			t.Errorf("b's outcome for %s not recorded: %+v", id, resp)
		}
	}
	if q := h.queue("default"); q.DoneCount != 2 || q.Counts[wire.StateSucceeded] != 2 || q.Counts[wire.StateCancelled] != 0 {
		t.Errorf("queue stats %+v, want 2 succeeded, done_count 2, none cancelled", q)
	}
	for _, id := range ids {
		hist := h.invocation(id).Attempts
		if len(hist) != 2 || hist[0].WorkerID != a.id || hist[0].Outcome != "stale" || hist[0].Recorded ||
			hist[1].WorkerID != b.id || hist[1].Outcome != wire.StateSucceeded || !hist[1].Recorded || hist[1].EndedAt == nil {
			t.Errorf("%s's history %+v; want a's attempt 1 stale, b's attempt 2 succeeded and recorded", id, hist)
		}
	}
}

// TestCancelReasonOperator: an operator's cancel reaches the worker running
// the invocation with reason operator, and its cancelled ack is recorded.
func TestCancelReasonOperator(t *testing.T) {
	h := newHarness(t)
	w := h.hello("m", "b")
	inv := h.submit("sleep", "100")
	if got := runIDs(h.poll(w, wire.PollRequest{Phase: wire.PhaseReady})); len(got) != 1 {
		t.Fatalf("claimed %v", got)
	}
	h.do("POST", "/v1/invocations/"+inv.InvocationID+"/cancel", operatorToken, nil).want(t, 202, nil)
	cmds := h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{inv.InvocationID},
		UpdatedCapabilities: &wire.Capabilities{CurrentInvocations: intp(1)}})
	cancels := ofType(cmds, wire.CommandCancel)
	if len(cancels) != 1 || cancels[0].Reason != wire.CancelOperator {
		t.Fatalf("poll after an operator cancel answered %+v, want one cancel with reason operator", cmds)
	}
	if resp := h.ack(w, wire.AckRequest{InvocationID: inv.InvocationID, Attempt: 1, State: wire.StateCancelled}); !resp.Recorded {
		t.Errorf("cancelled ack after an operator cancel answered %+v, want recorded", resp)
	}
}
