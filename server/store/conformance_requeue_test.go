package store_test

import (
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The conformance cases of hand-backs of an attempt whose worker was lost,
// run on every backend.
func init() {
	conformanceCases = append(conformanceCases,
		conformanceCase{"requeue/next claim is the next attempt", testRequeueNextAttempt},
		conformanceCase{"requeue/max attempts fails worker_lost", testRequeueExhausted},
		conformanceCase{"requeue/cancel requested becomes cancelled", testRequeueCancelRequested},
	)
}

func testRequeueNextAttempt(t *testing.T, f *fixture) {
	inv := f.submit(submitReq())
	a := f.worker("m-a", "")
	b := f.worker("m-b", "")
	f.claimOne(a, inv)

	got, _, err := f.s.Requeue(f.ctx, inv.ID, a.ID, domain.Loss{Kind: domain.EndStale, Why: "stale"})
	if err != nil {
		t.Fatalf("Requeue: %v", err)
	}
	if got.State != domain.StateQueued || got.WorkerID != "" || got.Attempt != 1 {
		t.Fatalf("requeued: state %s worker %q attempt %d", got.State, got.WorkerID, got.Attempt)
	}
	if h := f.held(a.ID); len(h) != 0 {
		t.Fatalf("Held(a) = %v after requeue", h)
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateQueued: 1}, 0)

	second := f.claimOne(b, inv)
	if second.Attempt != 2 || len(second.Attempts) != 2 || second.Attempts[0].WorkerID != a.ID || second.Attempts[1].WorkerID != b.ID {
		t.Fatalf("second claim: attempt %d, attempts %+v", second.Attempt, second.Attempts)
	}
	// A requeue for a worker that no longer runs it is a no-op.
	if got, _, err := f.s.Requeue(f.ctx, inv.ID, a.ID, domain.Loss{Kind: domain.EndStale, Why: "stale"}); err != nil || got.State != domain.StateRunning || got.WorkerID != b.ID {
		t.Fatalf("stale Requeue = %s by %s, %v; want running by b", got.State, got.WorkerID, err)
	}
}

func testRequeueExhausted(t *testing.T, f *fixture) {
	req := submitReq()
	req.MaxAttempts = 2
	inv := f.submit(req)
	a := f.worker("m-a", "")
	b := f.worker("m-b", "")
	f.claimOne(a, inv)
	if _, _, err := f.s.Requeue(f.ctx, inv.ID, a.ID, domain.Loss{Kind: domain.EndStale, Why: "stale"}); err != nil {
		t.Fatalf("Requeue 1: %v", err)
	}
	f.claimOne(b, inv)
	f.clock.Advance(time.Second)
	got, _, err := f.s.Requeue(f.ctx, inv.ID, b.ID, domain.Loss{Kind: domain.EndStale, Why: "stale"})
	if err != nil {
		t.Fatalf("Requeue 2: %v", err)
	}
	if got.State != domain.StateFailed || got.Error == nil || got.Error.Type != wire.ErrorTypeWorkerLost ||
		!got.FinishedAt.Equal(f.clock.Now()) {
		t.Fatalf("after max_attempts: state %s error %+v finished %v", got.State, got.Error, got.FinishedAt)
	}
	if stored := f.get(inv.ID); stored.State != domain.StateFailed || stored.Error == nil || stored.Error.Type != wire.ErrorTypeWorkerLost {
		t.Fatalf("stored: state %s error %+v", stored.State, stored.Error)
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateFailed: 1}, 1)
	f.claimNone(a, "q")
	// Requeueing it again changes and counts nothing.
	if _, _, err := f.s.Requeue(f.ctx, inv.ID, b.ID, domain.Loss{Kind: domain.EndStale, Why: "stale"}); err != nil {
		t.Fatalf("Requeue 3: %v", err)
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateFailed: 1}, 1)
}

func testRequeueCancelRequested(t *testing.T, f *fixture) {
	inv := f.submit(submitReq())
	a := f.worker("m-a", "")
	f.claimOne(a, inv)
	c, err := f.s.Cancel(f.ctx, inv.ID)
	if err != nil || c.State != domain.StateRunning || !c.CancelRequested {
		t.Fatalf("Cancel of running = %s cancel_requested %v, %v", c.State, c.CancelRequested, err)
	}
	got, _, err := f.s.Requeue(f.ctx, inv.ID, a.ID, domain.Loss{Kind: domain.EndStale, Why: "stale"})
	if err != nil || got.State != domain.StateCancelled {
		t.Fatalf("Requeue with cancel requested = %s, %v; want cancelled", got.State, err)
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateCancelled: 1}, 1)
	f.claimNone(a, "q")
}
