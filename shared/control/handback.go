package control

import (
	"context"
	"errors"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// HandBack hands back every invocation worker holds, for why (its worker
// was lost, left or was replaced; domain.Invocation.Requeue): each is
// queued again, or ends failed or cancelled, and a waiting poll is woken for
// each one queued. It reports how many the worker held; an invocation that
// could not be handed back is in the error, and the others are still tried.
func (s *Service) HandBack(ctx context.Context, workerID, why string) (int, error) {
	held, err := s.store.Held(ctx, workerID)
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, inv := range held {
		if _, err := s.requeue(ctx, inv.ID, workerID, why); err != nil {
			errs = append(errs, err)
		}
	}
	return len(held), errors.Join(errs...)
}

// requeue hands back worker's attempt of invocation id (store.Requeue) and
// wakes a waiting poll if it is queued again.
func (s *Service) requeue(ctx context.Context, id, workerID, why string) (domain.Invocation, error) {
	inv, err := s.store.Requeue(ctx, id, workerID, why)
	if err == nil {
		s.claimable(ctx, inv)
	}
	return inv, err
}
