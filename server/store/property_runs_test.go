package store_test

import (
	"fmt"
	"time"

	"pgregory.net/rapid"

	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// mRun is the model of a run: its jobs are invocations of the model.
type mRun struct {
	id   string
	jobs []string // invocation ids, in index order
}

// runRequest is a run of 1 to 4 jobs on the model's queue.
func runRequest(rt *rapid.T) (wire.RunRequest, int) {
	n := rapid.IntRange(1, 4).Draw(rt, "jobs")
	maxAttempts := rapid.IntRange(1, 3).Draw(rt, "maxAttempts")
	return wire.RunRequest{Queue: propQueue, Argv: []string{"job"}, MaxAttempts: maxAttempts, Jobs: make([]wire.RunJob, n)}, maxAttempts
}

func (m *propModel) submitRun(rt *rapid.T) {
	req, maxAttempts := runRequest(rt)
	run, created, err := m.svc.SubmitRun(m.ctx, req.RunSpec())
	propWant(rt, "submit run", err, "")
	if !created {
		rt.Fatalf("submit run: created false without an idempotency key")
	}
	m.addRun(rt, run, maxAttempts)
}

// submitRun submits under an idempotency key, retried as a client does:
// a retry after a fault finishes writing what the first try left.
func (f *faultModel) submitRun(rt *rapid.T) {
	req, maxAttempts := runRequest(rt)
	f.keys++
	req.IdempotencyKey = fmt.Sprintf("run-k%d", f.keys)
	run, err := retry(rt, "submit run", func() (domain.Run, error) {
		run, _, err := f.svc.SubmitRun(f.ctx, req.RunSpec())
		return run, err
	})
	propWant(rt, "submit run", err, "")
	f.addRun(rt, run, maxAttempts)
}

// addRun adds run's jobs to the model, queued.
func (m *propModel) addRun(rt *rapid.T, run domain.Run, maxAttempts int) {
	if run.State() == domain.RunSubmitting {
		rt.Fatalf("run %s answered still submitting", run.ID)
	}
	r := mRun{id: run.ID}
	for i := range run.Total {
		id, err := ids.Child(ids.Invocation, run.ID, i)
		if err != nil {
			rt.Fatal(err)
		}
		if _, dup := m.invs[id]; dup {
			rt.Fatalf("run %s job %d reused invocation id %s", run.ID, i, id)
		}
		m.invs[id] = &mInv{id: id, state: domain.StateQueued, maxAttempts: maxAttempts}
		m.iOrder = append(m.iOrder, id)
		r.jobs = append(r.jobs, id)
	}
	rt.Logf("submit run %s: %d jobs, max_attempts %d", run.ID, run.Total, maxAttempts)
	m.runs = append(m.runs, r)
	m.clock.Advance(time.Millisecond) // ids sort in submit order
}

// checkRuns: each run's counters equal its terminal jobs, each counted
// once, and its results hold one line per job, in index order, each in
// its job's state.
func (m *propModel) checkRuns(rt *rapid.T) {
	read := storetest.Control(m.reader())
	for _, r := range m.runs {
		_, jobs, err := read.RunJobs(m.ctx, r.id, 0, len(r.jobs)+1)
		propWant(rt, "run jobs", err, "")
		if len(jobs) != len(r.jobs) {
			rt.Fatalf("run %s: %d result lines, want %d", r.id, len(jobs), len(r.jobs))
		}
		var want domain.RunCounts
		for i, inv := range jobs {
			if inv.ID != r.jobs[i] || inv.RunIndex != i || inv.RunID != r.id {
				rt.Fatalf("run %s line %d: job %s (run %s index %d), want %s", r.id, i, inv.ID, inv.RunID, inv.RunIndex, r.jobs[i])
			}
			if inv.State != m.invs[inv.ID].state {
				rt.Fatalf("run %s job %d: %s, model %s", r.id, i, inv.State, m.invs[inv.ID].state)
			}
			switch inv.State {
			case domain.StateSucceeded:
				want.Succeeded++
			case domain.StateFailed:
				want.Failed++
			case domain.StateCancelled:
				want.Cancelled++
			}
		}
		want.Done = want.Succeeded + want.Failed + want.Cancelled
		st, err := read.Run(m.ctx, r.id)
		propWant(rt, "run", err, "")
		if st.Counts != want || st.Total != len(r.jobs) {
			rt.Fatalf("run %s counts %+v of %d, but its jobs are %+v", r.id, st.Counts, st.Total, want)
		}
		if (st.State() == domain.RunDone) != (want.Done == len(r.jobs)) {
			rt.Fatalf("run %s reads %s with %d of %d jobs done", r.id, st.State(), want.Done, len(r.jobs))
		}
	}
}
