package control

import (
	"context"
	"fmt"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
)

// SubmitRun creates the run spec asks for and writes its jobs, each an
// invocation whose id is derived from the run's and its index
// (ids.Child), so a replay of the submit under its idempotency key writes
// only what a submit that died left unwritten, and never a job twice. The
// run reads submitting until every job is written (docs/runs.md).
func (s *Service) SubmitRun(ctx context.Context, spec domain.RunSpec) (domain.Run, bool, error) {
	run, created, err := s.store.CreateRun(ctx, spec)
	if err != nil || run.Submitted {
		return run, created, err
	}
	jobs, err := runJobs(run, spec)
	if err != nil {
		return run, created, err
	}
	wrote, err := s.store.PutJobs(ctx, jobs)
	if err != nil {
		return run, created, fmt.Errorf("run %s: %d of %d jobs written: %w", run.ID, wrote, len(jobs), err)
	}
	marked, err := s.store.MarkRunSubmitted(ctx, run.ID)
	if err != nil {
		return run, created, err
	}
	run = marked
	s.log.Info("run submitted", "run_id", run.ID, "queue", run.Queue, "jobs", run.Total, "written", wrote, "replay", !created)
	if err := s.store.NoteQueue(ctx, run.Queue); err != nil {
		s.log.Warn("queue not noted for the metrics", "queue", run.Queue, "error", err.Error())
	}
	if run.CancelRequested {
		// An operator cancelled the run while its jobs were written: its
		// cancel may not have seen these, so they are cancelled here.
		if _, _, err := s.CancelRun(ctx, run.ID, s.clock.Now().Add(runCancelBudget)); err != nil {
			return run, created, err
		}
		return run, created, nil
	}
	woken := map[string]bool{}
	for _, inv := range jobs {
		if !woken[inv.HostKey] {
			woken[inv.HostKey] = true
			s.claimable(ctx, inv)
			if s.submitted != nil {
				s.submitted(ctx, inv)
			}
		}
	}
	return run, created, nil
}

// runJobs reports the invocations that are run's jobs as spec lists them,
// each created when the run was (so a replay makes the same items).
func runJobs(run domain.Run, spec domain.RunSpec) ([]domain.Invocation, error) {
	if len(spec.Jobs) != run.Total {
		return nil, domain.Errorf(domain.KindConflict, "run %s has %d jobs; this submit lists %d", run.ID, run.Total, len(spec.Jobs))
	}
	jobs := make([]domain.Invocation, len(spec.Jobs))
	for i, j := range spec.Jobs {
		id, err := jobID(run.ID, i)
		if err != nil {
			return nil, err
		}
		jobs[i] = run.Job(id, i, j, run.CreatedAt)
	}
	return jobs, nil
}

// jobID is the invocation id of run's job n.
func jobID(run string, n int) (string, error) {
	id, err := ids.Child(ids.Invocation, run, n)
	if err != nil {
		return "", domain.Errorf(domain.KindInvalid, "job %d of %s: %v", n, run, err)
	}
	return id, nil
}

// RunStatus is a run and its live jobs now: Running counted from its
// queue's running work, Queued the rest of the jobs not yet terminal.
type RunStatus struct {
	domain.Run
	Queued, Running int
}

// Run reads run id with its live counts. It costs two reads and a count
// of its queue's running work, whatever the run's size.
func (s *Service) Run(ctx context.Context, id string) (RunStatus, error) {
	run, err := s.store.GetRun(ctx, id)
	if err != nil {
		return RunStatus{}, err
	}
	return s.runStatus(ctx, run)
}

func (s *Service) runStatus(ctx context.Context, run domain.Run) (RunStatus, error) {
	st := RunStatus{Run: run}
	if run.State() == domain.RunDone {
		return st, nil
	}
	running, err := s.store.RunningJobs(ctx, run.Queue, run.ID)
	if err != nil {
		return st, err
	}
	st.Running = min(running, run.Total-run.Counts.Done)
	st.Queued = max(run.Total-run.Counts.Done-st.Running, 0)
	return st, nil
}

// Runs answers a page of up to limit runs (of queue; "" for all), newest
// first, each with its live counts, and the cursor of the next page
// (store.Store.Runs).
func (s *Service) Runs(ctx context.Context, queue string, limit int, cursor string) ([]RunStatus, string, error) {
	runs, next, err := s.store.Runs(ctx, queue, limit, cursor)
	if err != nil {
		return nil, "", err
	}
	out := make([]RunStatus, len(runs))
	for i, r := range runs {
		if out[i], err = s.runStatus(ctx, r); err != nil {
			return nil, "", err
		}
	}
	return out, next, nil
}

// RunJobs reads jobs [from, from+n) of run id, in index order, clipped to
// the run. A job a submitting run has not written yet reads queued.
func (s *Service) RunJobs(ctx context.Context, id string, from, n int) (domain.Run, []domain.Invocation, error) {
	run, err := s.store.GetRun(ctx, id)
	if err != nil {
		return run, nil, err
	}
	if from < 0 || from > run.Total {
		return run, nil, domain.Errorf(domain.KindInvalid, "from must be 0 to %d (the run's jobs)", run.Total)
	}
	end := min(from+n, run.Total)
	jobIDs := make([]string, 0, end-from)
	for i := from; i < end; i++ {
		jid, err := jobID(run.ID, i)
		if err != nil {
			return run, nil, err
		}
		jobIDs = append(jobIDs, jid)
	}
	found, err := s.store.GetInvocations(ctx, jobIDs)
	if err != nil {
		return run, nil, err
	}
	out := make([]domain.Invocation, len(jobIDs))
	for i, jid := range jobIDs {
		inv, ok := found[jid]
		if !ok {
			inv = domain.Invocation{ID: jid, Queue: run.Queue, State: domain.StateQueued, RunID: run.ID, RunIndex: from + i}
		}
		out[i] = inv
	}
	return run, out, nil
}

// runCancelBudget is how long a replayed submit of a cancelled run works
// at cancelling the jobs it wrote.
const runCancelBudget = 20 * time.Second

// runPage is how many jobs CancelRun reads at a time.
const runPage = 100

// CancelRun cancels every job of run id not yet terminal (Cancel: a
// queued one at once, a running one through its worker), until deadline.
// It reports how many it asked to cancel and how many jobs it did not get
// to (call again to go on).
func (s *Service) CancelRun(ctx context.Context, id string, deadline time.Time) (cancelled, remaining int, err error) {
	// The flag first: a replay of the run's submit that writes jobs after
	// it cancels them too, and one that wrote them before is seen below.
	if _, err := s.store.MarkRunCancelled(ctx, id); err != nil {
		return 0, 0, err
	}
	remaining, err = s.eachRunJob(ctx, id, deadline, func(inv domain.Invocation) error {
		if inv.State.Terminal() || inv.CancelRequested || inv.Version == 0 {
			return nil // done, asked already, or not written (a submitting run)
		}
		switch _, err := s.Cancel(ctx, inv.ID); {
		case err == nil:
			cancelled++
		case domain.KindOf(err) != domain.KindConflict: // a conflict: it finished meanwhile
			return err
		}
		return nil
	})
	if err == nil && remaining == 0 {
		s.log.Info("run cancelled", "run_id", id, "jobs", cancelled)
	}
	return cancelled, remaining, err
}

// RetryRun queues every failed job of run id again (its failure no longer
// counts: domain.Invocation.Rerun), until deadline. It reports how many it
// queued and how many jobs it did not get to (call again to go on). A job
// already queued again is not failed, so a second call queues nothing
// twice.
func (s *Service) RetryRun(ctx context.Context, id string, deadline time.Time) (retried, remaining int, err error) {
	woken := map[string]bool{}
	remaining, err = s.eachRunJob(ctx, id, deadline, func(inv domain.Invocation) error {
		if inv.State != domain.StateFailed {
			return nil
		}
		next, rerun, err := s.store.Rerun(ctx, inv.ID)
		if err != nil || !rerun {
			return err
		}
		retried++
		if !woken[next.HostKey] {
			woken[next.HostKey] = true
			s.claimable(ctx, next)
			if s.submitted != nil {
				s.submitted(ctx, next)
			}
		}
		return nil
	})
	if retried > 0 {
		s.log.Info("run's failed jobs queued again", "run_id", id, "jobs", retried, "remaining", remaining)
	}
	return retried, remaining, err
}

// eachRunJob hands each job of run id to fn, runPage at a time, until
// deadline; it reports how many jobs it did not get to.
func (s *Service) eachRunJob(ctx context.Context, id string, deadline time.Time, fn func(domain.Invocation) error) (remaining int, err error) {
	run, err := s.store.GetRun(ctx, id)
	if err != nil {
		return 0, err
	}
	for from := 0; from < run.Total; from += runPage {
		if !s.clock.Now().Before(deadline) {
			return run.Total - from, nil
		}
		_, jobs, err := s.RunJobs(ctx, id, from, runPage)
		if err != nil {
			return run.Total - from, err
		}
		for _, inv := range jobs {
			if err := fn(inv); err != nil {
				return run.Total - from, err
			}
		}
	}
	return 0, nil
}
