package control_test

import (
	"context"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestSweep: a worker silent past the stale window loses its running work
// to the queue (attempt + 1 at the next claim); a live worker keeps its own;
// past max_attempts the invocation fails as worker_lost, counted once.
func TestSweep(t *testing.T) {
	ctx := context.Background()
	s, c := storetest.Store(t)
	svc := storetest.Control(s)
	issue := func(string) (string, error) { return "h", nil }
	hello := func(m string) control.Registered {
		res, err := svc.Register(ctx, wire.HelloRequest{MachineID: m, BootID: "b", Capabilities: wire.Capabilities{MaxConcurrency: ptr(4)}}.Registration(), issue)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	dead, live := hello("dead").Worker, hello("live").Worker
	for _, arg := range []string{"x", "y"} {
		if _, _, err := svc.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{arg}, MaxAttempts: 2}.Spec()); err != nil {
			t.Fatal(err)
		}
	}
	// Claims shuffle their window: a is whichever the dead worker took.
	ra, err := s.Claim(ctx, dead, "q", 1)
	if err != nil || len(ra.Claimed) != 1 {
		t.Fatalf("claim a: %+v %v", ra, err)
	}
	rb, err := s.Claim(ctx, live, "q", 1)
	if err != nil || len(rb.Claimed) != 1 {
		t.Fatalf("claim b: %+v %v", rb, err)
	}
	a, b := ra.Claimed[0], rb.Claimed[0]

	c.Advance(30 * time.Second)
	if _, err := svc.Heartbeat(ctx, wire.PollRequest{WorkerID: live.ID}.Poll(), nil); err != nil {
		t.Fatal(err)
	}
	if res, err := svc.Sweep(ctx); err != nil || res.Requeued != 0 {
		t.Fatalf("sweep inside the stale window: %+v %v", res, err)
	}
	c.Advance(31 * time.Second) // dead: silent 61 s; live: 31 s
	res, err := svc.Sweep(ctx)
	if err != nil || res.Lost != 1 || res.Requeued != 1 {
		t.Fatalf("sweep: %+v %v; want one lost worker, one invocation handed back", res, err)
	}
	if got, _ := s.GetInvocation(ctx, a.ID); got.State != domain.StateQueued || got.Attempt != 1 {
		t.Fatalf("a after sweep: %s attempt %d", got.State, got.Attempt)
	}
	if got, _ := s.GetInvocation(ctx, b.ID); got.State != domain.StateRunning || got.WorkerID != live.ID {
		t.Fatalf("b (live worker's) after sweep: %+v", got)
	}
	// Attempt 2 is lost too: max_attempts 2 is spent → failed, worker_lost.
	if r, err := s.Claim(ctx, live, "q", 1); err != nil || len(r.Claimed) != 1 || r.Claimed[0].Attempt != 2 {
		t.Fatalf("re-claim a: %+v %v", r, err)
	}
	c.Advance(2 * time.Minute)
	if _, err := svc.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetInvocation(ctx, a.ID)
	if got.State != domain.StateFailed || got.Error == nil || got.Error.Type != wire.ErrorTypeWorkerLost {
		t.Fatalf("a after its second worker was lost: %+v", got)
	}
	if _, err := svc.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	// b's worker went silent too, on b's first of two attempts: queued again.
	st, _ := s.QueueStats(ctx, "q")
	if st.DoneCount != 1 || st.Counts[domain.StateFailed] != 1 || st.Counts[domain.StateQueued] != 1 {
		t.Fatalf("stats %+v; want a failed (counted once) and b queued again", st)
	}
}

// TestSweepNeverStrandsWorkOnAGoneWorker: a worker made gone without its
// work being handed back (a failed requeue) is swept however long ago it
// went gone; once a sweep past the index-lag window finds it holding
// nothing, later sweeps skip it.
func TestSweepNeverStrandsWorkOnAGoneWorker(t *testing.T) {
	ctx := context.Background()
	s, c := storetest.Store(t)
	svc := storetest.Control(s)
	res, err := svc.Register(ctx, wire.HelloRequest{MachineID: "m", BootID: "b"}.Registration(), func(string) (string, error) { return "h", nil })
	if err != nil {
		t.Fatal(err)
	}
	inv, _, _ := svc.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"x"}, MaxAttempts: 3}.Spec())
	if r, err := s.Claim(ctx, res.Worker, "q", 1); err != nil || len(r.Claimed) != 1 {
		t.Fatalf("claim: %+v %v", r, err)
	}
	if _, _, err := s.MarkGone(ctx, res.Worker.ID, nil, domain.EndGone, "lost without a requeue"); err != nil {
		t.Fatal(err)
	}
	c.Advance(time.Hour)
	if got, err := svc.Sweep(ctx); err != nil || got.Requeued != 1 {
		t.Fatalf("sweep an hour later: %+v %v; want the stranded invocation handed back", got, err)
	}
	if got, _ := s.GetInvocation(ctx, inv.ID); got.State != domain.StateQueued {
		t.Fatalf("invocation: %s", got.State)
	}
	if got, err := svc.Sweep(ctx); err != nil || got.Lost != 1 || got.Requeued != 0 {
		t.Fatalf("second sweep: %+v %v; want the worker looked at once more and found empty", got, err)
	}
	if got, err := svc.Sweep(ctx); err != nil || got.Lost != 0 {
		t.Fatalf("third sweep: %+v %v; want the reaped worker skipped", got, err)
	}
}
