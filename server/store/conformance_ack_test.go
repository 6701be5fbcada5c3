package store_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The conformance cases of acks: which outcome counts and who may record it,
// and the retry policy that queues a failure again, run on every backend.
func init() {
	conformanceCases = append(conformanceCases,
		conformanceCase{"ack/first outcome wins", testAckFirstWins},
		conformanceCase{"ack/other worker forbidden", testAckForbidden},
		conformanceCase{"ack/wrong token unauthorized", testAckUnauthorized},
		conformanceCase{"ack/late ack from attempt 1 after redelivery", testAckLateAfterRedelivery},
		conformanceCase{"ack/late ack while requeued", testAckLateWhileRequeued},
		conformanceCase{"ack/superseded attempt's cancelled is a no-op", testAckSupersededCancelled},
		conformanceCase{"ack/cancelled without an operator cancel is a no-op", testAckCancelledUnasked},
		conformanceCase{"retry/a failing body retried after its backoff", testRetry},
	)
}

func testAckFirstWins(t *testing.T, f *fixture) {
	inv := f.submit(submitReq())
	w := f.worker("m1", "")
	f.claimOne(w, inv)
	f.clock.Advance(time.Second)
	finished := f.clock.Now()

	req := ackReq(w, inv, 1, domain.StateSucceeded)
	req.ResultBlob = []byte(`{"rows":3}`)
	req.StdoutTail = "done\n"
	resp, err := f.ackAs(f.hash(w.ID), req)
	if err != nil || !resp.Recorded || resp.State != domain.StateSucceeded {
		t.Fatalf("first Ack = %+v, %v; want recorded succeeded", resp, err)
	}
	got := f.get(inv.ID)
	if got.State != domain.StateSucceeded || got.ExitCode == nil || *got.ExitCode != 0 || got.ResultBlob != `{"rows":3}` ||
		got.StdoutTail != "done\n" || !got.FinishedAt.Equal(finished) || got.WorkerID != w.ID {
		t.Fatalf("after ack: %+v", got)
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateSucceeded: 1}, 1)
	if h := f.held(w.ID); len(h) != 0 {
		t.Fatalf("Held after ack = %v", h)
	}

	// A second outcome is a no-op: state, exit code and done_count stand.
	resp = f.mustAck(w, inv, 1, domain.StateFailed, false)
	if resp.State != domain.StateSucceeded {
		t.Fatalf("second Ack state = %s, want succeeded", resp.State)
	}
	if got := f.get(inv.ID); got.State != domain.StateSucceeded || *got.ExitCode != 0 {
		t.Fatalf("second ack changed the invocation: %+v", got)
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateSucceeded: 1}, 1)
}

func testAckForbidden(t *testing.T, f *fixture) {
	inv := f.submit(submitReq())
	neverReq := submitReq("never claimed")
	neverReq.Queue = "other"
	never := f.submit(neverReq)
	a := f.worker("m-a", "")
	b := f.worker("m-b", "")
	f.claimOne(a, inv)

	_, err := f.ack(b, inv, 1, domain.StateSucceeded)
	wantCode(t, err, wire.ErrForbidden)
	_, err = f.ack(a, inv, 2, domain.StateSucceeded) // an attempt that never ran
	wantCode(t, err, wire.ErrForbidden)
	_, err = f.ack(a, never, 1, domain.StateSucceeded)
	wantCode(t, err, wire.ErrForbidden)
	_, err = f.ackAs(f.hash(a.ID), wire.AckRequest{WorkerID: a.ID, InvocationID: "inv_missing", Attempt: 1, State: wire.StateSucceeded})
	wantCode(t, err, wire.ErrNotFound)

	if got := f.get(inv.ID); got.State != domain.StateRunning || got.WorkerID != a.ID {
		t.Fatalf("a refused ack changed the invocation: %+v", got)
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateRunning: 1}, 0)
	f.wantStats("other", map[domain.InvocationState]int{domain.StateQueued: 1}, 0)
}

func testAckUnauthorized(t *testing.T, f *fixture) {
	inv := f.submit(submitReq())
	w := f.worker("m1", "")
	f.claimOne(w, inv)
	req := ackReq(w, inv, 1, domain.StateSucceeded)

	// The route's check of the row refuses a wrong token.
	_, err := f.ackAs("not-the-hash", req)
	wantCode(t, err, wire.ErrUnauthorized)
	// A worker that does not exist is unauthorized too, not "not found".
	ghost := req
	ghost.WorkerID = "wrk_01M8KJT9G0Q60N2201P8JY3JT0"
	_, err = f.svc.Ack(f.ctx, ghost.Outcome(), func(domain.Worker) error { return nil })
	wantCode(t, err, wire.ErrUnauthorized)
	if got := f.get(inv.ID); got.State != domain.StateRunning {
		t.Fatalf("an unauthorized ack changed the invocation: %+v", got)
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateRunning: 1}, 0)

	// A retried hello (same boot) issues a new token: the old one is revoked.
	old := f.hash(w.ID)
	if again := f.hello(helloReq("m1", "boot-1")); again.Worker.ID != w.ID {
		t.Fatalf("retried hello made worker %s, want %s", again.Worker.ID, w.ID)
	}
	_, err = f.ackAs(old, req)
	wantCode(t, err, wire.ErrUnauthorized)
	f.mustAck(w, inv, 1, domain.StateSucceeded, true)
	f.wantStats("q", map[domain.InvocationState]int{domain.StateSucceeded: 1}, 1)
}

func testAckLateAfterRedelivery(t *testing.T, f *fixture) {
	inv := f.submit(submitReq())
	a := f.worker("m-a", "")
	b := f.worker("m-b", "")
	f.claimOne(a, inv)
	// a is lost (here: it said bye); its attempt is redelivered to b.
	n, err := f.svc.Bye(f.ctx, wire.ByeRequest{WorkerID: a.ID, Reason: wire.ByeSignal}.Bye(), nil)
	if err != nil || n != 1 {
		t.Fatalf("Bye = %d, %v; want 1 requeued", n, err)
	}
	second := f.claimOne(b, inv)
	if second.Attempt != 2 || second.WorkerID != b.ID {
		t.Fatalf("redelivered claim = attempt %d by %s", second.Attempt, second.WorkerID)
	}

	// a's ack of attempt 1 arrives first: the work was done, so it counts.
	resp := f.mustAck(a, inv, 1, domain.StateSucceeded, true)
	if resp.State != domain.StateSucceeded {
		t.Fatalf("late ack state %s", resp.State)
	}
	got := f.get(inv.ID)
	if got.State != domain.StateSucceeded || got.WorkerID != a.ID || got.Attempt != 2 {
		t.Fatalf("after late ack: state %s worker %s attempt %d", got.State, got.WorkerID, got.Attempt)
	}
	// b no longer holds it (its next poll gets a cancel), and its own
	// outcome is a no-op.
	if h := f.held(b.ID); len(h) != 0 {
		t.Fatalf("Held(b) = %v after attempt 1 won", h)
	}
	f.mustAck(b, inv, 2, domain.StateSucceeded, false)
	f.wantStats("q", map[domain.InvocationState]int{domain.StateSucceeded: 1}, 1)

	// The history round-trips through the table: a's attempt ended bye,
	// then its late outcome was recorded; b's was superseded.
	hist := f.get(inv.ID).Attempts
	if len(hist) != 2 || hist[0].Outcome != string(domain.StateSucceeded) || !hist[0].Recorded || hist[0].EndedAt.IsZero() ||
		!strings.Contains(hist[0].Reason, "taken back (bye)") || hist[1].Outcome != string(domain.EndSuperseded) || hist[1].Recorded {
		t.Fatalf("history %+v; want attempt 1 succeeded late (taken back by bye) and recorded, attempt 2 superseded", hist)
	}
}

// testRetry: a failure the retry policy names queues the invocation again,
// counted nowhere; it cannot be claimed during its backoff; the sweep
// releases it after, and its next claim is the next attempt; the last
// attempt's failure is the outcome, counted once.
func testRetry(t *testing.T, f *fixture) {
	req := submitReq()
	req.MaxAttempts = 2
	req.Retry = &wire.RetryPolicy{ExitCodes: []int{1}, BackoffS: 30}
	inv := f.submit(req)
	w := f.worker("m-a", "")
	f.claimOne(w, inv)
	failed := ackReq(w, inv, 1, domain.StateFailed)
	failed.Error = &wire.ErrorInfo{Type: "exit_code", Message: "exited with status 1"}
	resp, err := f.ackAs(f.hash(w.ID), failed)
	if err != nil || !resp.Recorded || resp.State != domain.StateQueued {
		t.Fatalf("the retried failure answered %+v, %v; want recorded, queued", resp, err)
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateQueued: 1}, 0)
	f.claimNone(w, "q")
	if rel, err := f.s.ReleaseRetries(f.ctx); err != nil || len(rel) != 0 {
		t.Fatalf("released %d before the backoff passed (%v)", len(rel), err)
	}
	f.clock.Advance(31 * time.Second)
	if rel, err := f.s.ReleaseRetries(f.ctx); err != nil || len(rel) != 1 {
		t.Fatalf("released %d after the backoff (%v), want 1", len(rel), err)
	}
	second := f.claimOne(w, inv)
	if second.Attempt != 2 || !second.Attempts[0].Retried {
		t.Fatalf("claim after the release: attempt %d, history %+v", second.Attempt, second.Attempts)
	}
	failed.Attempt = 2
	if resp, err := f.ackAs(f.hash(w.ID), failed); err != nil || resp.State != domain.StateFailed {
		t.Fatalf("the last attempt's failure answered %+v, %v; want failed", resp, err)
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateFailed: 1}, 1)
	if got := f.get(inv.ID); !got.Attempts[1].Recorded || got.Retry == nil || got.Retry.BackoffS != 30 {
		t.Fatalf("after the last failure: %+v", got)
	}
}

func testAckLateWhileRequeued(t *testing.T, f *fixture) {
	inv := f.submit(submitReq())
	a := f.worker("m-a", "")
	f.claimOne(a, inv)
	if got, _, err := f.s.Requeue(f.ctx, inv.ID, a.ID, domain.Loss{Kind: domain.EndStale, Why: "stale"}); err != nil || got.State != domain.StateQueued {
		t.Fatalf("Requeue = %s, %v", got.State, err)
	}
	f.mustAck(a, inv, 1, domain.StateFailed, true)
	if got := f.get(inv.ID); got.State != domain.StateFailed {
		t.Fatalf("state %s, want failed", got.State)
	}
	f.claimNone(f.worker("m-b", ""), "q")
	f.wantStats("q", map[domain.InvocationState]int{domain.StateFailed: 1}, 1)
}

// testAckSupersededCancelled is the worker that comes back from stale: its
// attempt 1 was handed to b, the control plane told it to stop (superseded),
// and its body's cancelled ack arrives while attempt 2 runs. Nobody
// cancelled the invocation: the ack must change nothing, and b's outcome
// must still count.
func testAckSupersededCancelled(t *testing.T, f *fixture) {
	inv := f.submit(submitReq())
	a := f.worker("m-a", "")
	b := f.worker("m-b", "")
	f.claimOne(a, inv)
	if got, _, err := f.s.Requeue(f.ctx, inv.ID, a.ID, domain.Loss{Kind: domain.EndStale, Why: "stale"}); err != nil || got.State != domain.StateQueued {
		t.Fatalf("Requeue = %s, %v", got.State, err)
	}
	f.claimOne(b, inv)
	resp := f.mustAck(a, inv, 1, domain.StateCancelled, false)
	if resp.State != domain.StateRunning {
		t.Fatalf("superseded cancelled ack answered state %s, want running", resp.State)
	}
	if got := f.get(inv.ID); got.State != domain.StateRunning || got.WorkerID != b.ID || got.Attempt != 2 {
		t.Fatalf("after the superseded cancelled ack: state %s worker %s attempt %d; want running by b, attempt 2",
			got.State, got.WorkerID, got.Attempt)
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateRunning: 1}, 0)
	// Even once an operator cancels, attempt 1's cancelled stays a no-op:
	// only the attempt running now can confirm the cancel.
	if _, err := f.s.Cancel(f.ctx, inv.ID); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	f.mustAck(a, inv, 1, domain.StateCancelled, false)
	f.mustAck(b, inv, 2, domain.StateCancelled, true)
	f.wantStats("q", map[domain.InvocationState]int{domain.StateCancelled: 1}, 1)
}

// testAckCancelledUnasked: the attempt running now acks cancelled although
// no operator asked (a daemon bug, or a cancel meant for an earlier
// attempt). It is not recorded: the invocation stays running, and is handed
// out again when the worker's poll omits it.
func testAckCancelledUnasked(t *testing.T, f *fixture) {
	inv := f.submit(submitReq())
	a := f.worker("m-a", "")
	f.claimOne(a, inv)
	f.mustAck(a, inv, 1, domain.StateCancelled, false)
	if got := f.get(inv.ID); got.State != domain.StateRunning {
		t.Fatalf("state %s after an unasked cancelled ack, want running", got.State)
	}
	f.mustAck(a, inv, 1, domain.StateSucceeded, true)
	f.wantStats("q", map[domain.InvocationState]int{domain.StateSucceeded: 1}, 1)
}
