package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The conformance cases of runs: a replayed submit finishes a partial
// write without touching what was written, and a run's counters are its
// terminal jobs, each counted once, run on every backend.
func init() {
	conformanceCases = append(conformanceCases,
		conformanceCase{"runs/replayed submit writes only the missing jobs", testRunReplayedSubmit},
		conformanceCase{"runs/counters are the terminal jobs, each once", testRunCountersOnce},
		conformanceCase{"runs/a cancel during the submit reaches the jobs written after it", testRunCancelWhileSubmitting},
	)
}

// runSpec is a run of n listed jobs on queue q, each allowed 2 attempts.
func runSpec(key string, n int) domain.RunSpec {
	req := wire.RunRequest{Queue: "q", Argv: []string{"job"}, MaxAttempts: 2, IdempotencyKey: key,
		Jobs: make([]wire.RunJob, n)}
	for i := range req.Jobs {
		req.Jobs[i].Argv = []string{"job", fmt.Sprint(i)}
	}
	return req.RunSpec()
}

// runJobs reports the invocations that are run's jobs, as its submit
// writes them.
func (f *fixture) runJobs(run domain.Run, spec domain.RunSpec) []domain.Invocation {
	f.t.Helper()
	out := make([]domain.Invocation, len(spec.Jobs))
	for i, j := range spec.Jobs {
		id, err := ids.Child(ids.Invocation, run.ID, i)
		if err != nil {
			f.t.Fatal(err)
		}
		out[i] = run.Job(id, i, j, run.CreatedAt)
	}
	return out
}

func (f *fixture) getRun(id string) domain.Run {
	f.t.Helper()
	run, err := f.s.GetRun(f.ctx, id)
	if err != nil {
		f.t.Fatalf("GetRun(%s): %v", id, err)
	}
	return run
}

// testRunReplayedSubmit: a submit died after writing the first 2 of 5
// jobs, and one of those was claimed meanwhile. The replay (same key, same
// request) answers the same run, writes the 3 missing jobs, leaves the
// claimed one as it is, and marks the run submitted with 5 jobs.
func testRunReplayedSubmit(t *testing.T, f *fixture) {
	spec := runSpec("replayed", 5)
	run, created, err := f.s.CreateRun(f.ctx, spec)
	if err != nil || !created {
		t.Fatalf("CreateRun = %v, %v", created, err)
	}
	jobs := f.runJobs(run, spec)
	if n, err := f.s.PutJobs(f.ctx, jobs[:2]); err != nil || n != 2 {
		t.Fatalf("PutJobs of the prefix = %d, %v; want 2", n, err)
	}
	if got := f.getRun(run.ID); got.State() != domain.RunSubmitting {
		t.Fatalf("after the partial write the run is %s, want submitting", got.State())
	}
	w := f.worker("m1", "")
	res := f.claim(w, "q", 1)
	if len(res.Claimed) != 1 || res.Claimed[0].RunID != run.ID || res.Claimed[0].RunIndex > 1 {
		t.Fatalf("claimed %v, want one of the 2 written jobs", invIDs(res.Claimed))
	}
	claimed := res.Claimed[0]

	f.clock.Advance(time.Second)
	again, created, err := f.svc.SubmitRun(f.ctx, spec)
	if err != nil || created || again.ID != run.ID {
		t.Fatalf("replay = run %s created %v, %v; want run %s, not created", again.ID, created, err, run.ID)
	}
	if got := f.getRun(run.ID); got.State() != domain.RunRunning || got.Total != 5 || !got.Submitted {
		t.Fatalf("after the replay: %+v; want submitted (running) with 5 jobs", got)
	}
	for i, j := range jobs {
		got := f.get(j.ID)
		if j.ID == claimed.ID {
			if got.State != domain.StateRunning || got.WorkerID != w.ID || got.Version != claimed.Version || got.Attempt != 1 {
				t.Fatalf("the claimed job after the replay: %+v; want it untouched (running by %s, version %d)", got, w.ID, claimed.Version)
			}
			continue
		}
		if got.State != domain.StateQueued || got.RunID != run.ID || got.RunIndex != i || got.Version != 1 {
			t.Fatalf("job %d after the replay: %+v; want queued at version 1", i, got)
		}
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateQueued: 4, domain.StateRunning: 1}, 0)
	// Every job is written now: writing them all again writes none.
	if n, err := f.s.PutJobs(f.ctx, jobs); err != nil || n != 0 {
		t.Fatalf("PutJobs of written jobs = %d, %v; want 0", n, err)
	}
	if got := f.get(claimed.ID); got.Version != claimed.Version {
		t.Fatalf("a second write moved the claimed job to version %d", got.Version)
	}
}

// testRunCountersOnce: a run's jobs end by a duplicated ack, late acks
// of attempts whose worker was lost (refused once the job has an
// outcome, counted when first), a requeue then success, a requeue past
// max_attempts, and a run cancel (of a queued job and a running one,
// whose cancelled ack comes twice); the run's counters are its terminal
// jobs, each counted once.
func testRunCountersOnce(t *testing.T, f *fixture) {
	spec := runSpec("counters", 7)
	run, _, err := f.svc.SubmitRun(f.ctx, spec)
	if err != nil {
		t.Fatalf("SubmitRun: %v", err)
	}
	jobs := f.runJobs(run, spec)
	a, b := f.worker("m-a", ""), f.worker("m-b", "")
	lost := domain.Loss{Kind: domain.EndStale, Why: "stale"}
	// a claims every job (in an order of the store's choosing), so each
	// job handed back below is the only one queued when b claims.
	res := f.claim(a, "q", len(jobs))
	if len(res.Claimed) != len(jobs) {
		t.Fatalf("a claimed %v, want all %d jobs", invIDs(res.Claimed), len(jobs))
	}
	j := res.Claimed
	handBack := func(inv domain.Invocation) {
		t.Helper()
		if _, _, err := f.s.Requeue(f.ctx, inv.ID, a.ID, lost); err != nil {
			t.Fatalf("Requeue(%s): %v", inv.ID, err)
		}
	}

	// Succeeded, then the same ack again and a contrary one.
	f.mustAck(a, j[0], 1, domain.StateSucceeded, true)
	f.mustAck(a, j[0], 1, domain.StateSucceeded, false)
	f.mustAck(a, j[0], 1, domain.StateFailed, false)

	// a is lost; b's attempt 2 fails; a's late success is refused.
	handBack(j[1])
	f.claimOne(b, j[1])
	f.mustAck(b, j[1], 2, domain.StateFailed, true)
	f.mustAck(a, j[1], 1, domain.StateSucceeded, false)

	// a is lost; a's cancelled ack of its superseded attempt is a no-op;
	// b's attempt 2 succeeds, acked twice.
	handBack(j[2])
	f.claimOne(b, j[2])
	f.mustAck(a, j[2], 1, domain.StateCancelled, false)
	f.mustAck(b, j[2], 2, domain.StateSucceeded, true)
	f.mustAck(b, j[2], 2, domain.StateSucceeded, false)

	// a is lost, but its late success arrives while b's attempt 2 runs:
	// the work was done, so it counts, and b's own success does not.
	handBack(j[5])
	f.claimOne(b, j[5])
	f.mustAck(a, j[5], 1, domain.StateSucceeded, true)
	f.mustAck(b, j[5], 2, domain.StateSucceeded, false)

	// Lost twice: its last allowed attempt handed back, it fails
	// worker_lost, counted by the requeue that ends it; a second requeue
	// counts nothing.
	handBack(j[6])
	f.claimOne(b, j[6])
	for range 2 {
		if got, _, err := f.s.Requeue(f.ctx, j[6].ID, b.ID, lost); err != nil || got.State != domain.StateFailed {
			t.Fatalf("Requeue of the last attempt = %s, %v; want failed", got.State, err)
		}
	}

	// The run is cancelled with j[3] queued (handed back) and j[4]
	// running; j[4]'s worker acks its cancel twice, and a second cancel
	// of the run asks none.
	handBack(j[3])
	n, remaining, err := f.svc.CancelRun(f.ctx, run.ID, f.clock.Now().Add(time.Minute))
	if err != nil || n != 2 || remaining != 0 {
		t.Fatalf("CancelRun = %d, %d, %v; want 2 asked (the queued job and the running one), none remaining", n, remaining, err)
	}
	f.mustAck(a, j[4], 1, domain.StateCancelled, true)
	f.mustAck(a, j[4], 1, domain.StateCancelled, false)
	if n, _, err := f.svc.CancelRun(f.ctx, run.ID, f.clock.Now().Add(time.Minute)); err != nil || n != 0 {
		t.Fatalf("second CancelRun = %d, %v; want none asked", n, err)
	}

	want := domain.RunCounts{}
	for _, inv := range jobs {
		switch got := f.get(inv.ID); got.State {
		case domain.StateSucceeded:
			want.Succeeded++
		case domain.StateFailed:
			want.Failed++
		case domain.StateCancelled:
			want.Cancelled++
		default:
			t.Fatalf("job %d ended %s, want terminal", got.RunIndex, got.State)
		}
		want.Done++
	}
	if want != (domain.RunCounts{Done: 7, Succeeded: 3, Failed: 2, Cancelled: 2}) {
		t.Fatalf("jobs ended %+v; want 3 succeeded, 2 failed, 2 cancelled", want)
	}
	got := f.getRun(run.ID)
	if got.Counts != want || got.State() != domain.RunDone {
		t.Fatalf("run counts %+v state %s; want %+v, done", got.Counts, got.State(), want)
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateSucceeded: 3, domain.StateFailed: 2, domain.StateCancelled: 2}, 7)
}

// testRunCancelWhileSubmitting: a submit died after writing 2 of 4 jobs;
// the run is cancelled (its 2 written jobs at once), then the submit is
// replayed: the 2 jobs it writes are cancelled too, and the run ends done
// with every job cancelled, none left queued.
func testRunCancelWhileSubmitting(t *testing.T, f *fixture) {
	spec := runSpec("cancelled-midway", 4)
	run, _, err := f.s.CreateRun(f.ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.PutJobs(f.ctx, f.runJobs(run, spec)[:2]); err != nil {
		t.Fatal(err)
	}
	n, remaining, err := f.svc.CancelRun(f.ctx, run.ID, f.clock.Now().Add(time.Minute))
	if err != nil || n != 2 || remaining != 0 {
		t.Fatalf("CancelRun while submitting = %d, %d, %v; want the 2 written jobs", n, remaining, err)
	}
	replayed, created, err := f.svc.SubmitRun(f.ctx, spec)
	if err != nil || created || replayed.ID != run.ID {
		t.Fatalf("replay = %+v %v %v", replayed, created, err)
	}
	got := f.getRun(run.ID)
	if got.State() != domain.RunDone || got.Counts.Cancelled != 4 || got.Counts.Done != 4 {
		t.Fatalf("after the replay the run is %s with %+v; want done, 4 cancelled", got.State(), got.Counts)
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateCancelled: 4}, 4)
}
