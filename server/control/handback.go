package control

import (
	"context"
	"errors"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// HandBack hands back every invocation worker holds, for loss (its worker
// was lost, left or was replaced; domain.Invocation.Requeue): each is
// queued again, or ends failed or cancelled, and a waiting poll is woken for
// each one queued. It reports how many the worker held; an invocation that
// could not be handed back is in the error, and the others are still tried.
func (s *Service) HandBack(ctx context.Context, workerID string, loss domain.Loss) (int, error) {
	held, err := s.store.Held(ctx, workerID)
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, inv := range held {
		if _, err := s.requeue(ctx, inv.ID, workerID, loss); err != nil {
			errs = append(errs, err)
		}
	}
	return len(held), errors.Join(errs...)
}

// requeue hands back worker's attempt of invocation id (store.Requeue),
// logs it, and wakes a waiting poll if it is queued again.
func (s *Service) requeue(ctx context.Context, id, workerID string, loss domain.Loss) (domain.Invocation, error) {
	inv, handed, err := s.store.Requeue(ctx, id, workerID, loss)
	if err != nil {
		s.log.Error("hand back failed", "invocation_id", id, "worker_id", workerID, "why", loss.String(), "error", err.Error())
		return inv, err
	}
	if handed {
		s.log.Info("handed back", "invocation_id", id, "worker_id", workerID, "attempt", inv.Attempt,
			"ended", loss.Kind, "why", loss.Why, "state", inv.State)
		s.metrics.HandedBack(inv.Queue, loss.Kind)
		if inv.State.Terminal() {
			s.metrics.Finished(inv.Queue, inv.State)
		}
	}
	s.claimable(ctx, inv)
	return inv, nil
}
