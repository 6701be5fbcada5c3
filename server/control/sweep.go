package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// sweepGoneFor is how long after a worker went gone its holder index may
// still show a late claim (AWS GSIs are eventually consistent). The sweep
// keeps looking at a gone worker until a sweep after that finds it holding
// nothing; then it marks the worker reaped and never queries it again. Work
// is never stranded on a gone worker, and a sweep does not query every
// worker that ever lived.
const sweepGoneFor = 10 * time.Minute

// SweepResult reports what one sweep did.
type SweepResult struct {
	Workers  int // workers read
	Lost     int // workers reading stale or gone whose work was looked for
	Requeued int // invocations handed back
	Released int // retried invocations whose backoff passed, claimable again
}

// Sweep releases the retried invocations whose backoff has passed
// (store.Store.ReleaseRetries: they become claimable at the first sweep
// after it), then hands back the running work of every worker that reads stale
// (silent past the stale window) or gone (bye, a new boot, a stopped or
// terminated host; domain.Worker.LostWhy): each invocation goes back to
// the queue with attempt + 1 at its next claim, or fails as worker_lost
// once max_attempts is spent. The reaper runs it on a schedule; `lakeshore
// dev` on a ticker. It reads the workers it is not done with
// (store.Store.EachWorker: the reaped ones cost it nothing), never the
// table. A worker that cannot be swept is reported in the error and the
// sweep goes on with the others.
func (s *Service) Sweep(ctx context.Context) (SweepResult, error) {
	var res SweepResult
	now := s.clock.Now().UTC()
	released, rerr := s.store.ReleaseRetries(ctx)
	for _, inv := range released {
		s.log.Info("retry released: claimable again", "invocation_id", inv.ID, "queue", inv.Queue, "next_attempt", inv.Attempt+1)
		s.claimable(ctx, inv)
	}
	res.Released = len(released)
	err := s.store.EachWorker(ctx, "sweep", func(w domain.Worker) error {
		res.Workers++
		why, lost := w.LostWhy(now, s.staleAfter)
		if !lost {
			return nil
		}
		res.Lost++
		if why.Kind == domain.EndStale && now.Sub(w.LastSeenAt) > domain.RetireSilentAfter(s.staleAfter) {
			// Silent for so long its process is surely dead: retire it,
			// so it leaves the list after the worker retention.
			reason := fmt.Sprintf("retired after %s of silence", now.Sub(w.LastSeenAt).Round(time.Minute))
			if _, _, err := s.store.MarkGone(ctx, w.ID, nil, domain.EndGone, reason); err != nil {
				return err
			}
			s.log.Info("retired a silent worker", "worker_id", w.ID, "last_seen_at", w.LastSeenAt, "why", reason)
		}
		n, err := s.HandBack(ctx, w.ID, why)
		res.Requeued += n
		if err != nil {
			return err
		}
		if n == 0 && domain.Retired(w) && now.Sub(w.GoneSince()) > sweepGoneFor {
			return s.store.MarkReaped(ctx, w.ID)
		}
		return nil
	})
	return res, errors.Join(rerr, err)
}

// SetHostStatus records the EC2 status of worker id's host. A worker stored
// gone is left as it is, and a host status never moves back from stopped or
// terminated (domain.HostStatusMoves): those calls are no-ops that return
// the row unchanged.
//
// When the host is stopped or terminated the worker reads gone at once
// (domain.Project), and its running invocations are handed back here rather
// than at the next sweep, so a terminated instance frees its work within
// seconds instead of after the stale window. The hand-back is repeated on
// every call that finds the host stopped or terminated, so a retry finishes
// one that failed halfway; it costs a query when nothing is held.
func (s *Service) SetHostStatus(ctx context.Context, id string, status domain.HostStatus) (domain.Worker, error) {
	if !domain.ValidHostStatus(status) {
		return domain.Worker{}, domain.Errorf(domain.KindInvalid, "host status %q is not one of pending, running, stopped, terminated", status)
	}
	w, err := s.store.UpdateHostStatus(ctx, id, status)
	if err != nil || w.State == domain.WorkerGone || !domain.HostGone(w.HostStatus) {
		return w, err
	}
	s.workerNews(ctx, id)
	if _, err := s.HandBack(ctx, id, domain.Loss{Kind: domain.EndGone, Why: "host " + string(w.HostStatus)}); err != nil {
		return w, err
	}
	return w, nil
}
