package control

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// DefaultLogPage is how many chunks one read of an attempt's output
// answers at most (32 KiB each: at most 512 KiB of output).
const DefaultLogPage = 16

// ShipLogs stores the output worker workerID shipped (docs/logs.md). The
// token must be the worker's (auth), and each attempt one the worker ran
// and that ended no more than domain.LogGrace ago (its last chunks come
// just after its ack); the store writes each chunk once and holds each
// stream to its cap. It reports how many chunks were stored; an attempt
// refused stops the request there.
func (s *Service) ShipLogs(ctx context.Context, workerID string, batches []domain.LogBatch, auth store.Authorize) (stored int, err error) {
	w, err := s.store.GetWorker(ctx, workerID)
	if errors.Is(err, domain.ErrNotFound) {
		return 0, store.UnknownWorker(workerID, auth)
	}
	if err != nil {
		return 0, fmt.Errorf("ship logs: %w", err)
	}
	if err := auth(w); err != nil {
		return 0, err
	}
	for _, b := range batches {
		inv, err := s.store.GetInvocation(ctx, b.InvocationID)
		if err != nil {
			return stored, fmt.Errorf("ship logs of %s: %w", b.InvocationID, err)
		}
		if err := inv.TakesLogs(workerID, b.Attempt, s.clock.Now()); err != nil {
			return stored, err
		}
		if err := s.store.PutLogs(ctx, b.InvocationID, b.Attempt, b.Chunks); err != nil {
			return stored, err
		}
		stored += len(b.Chunks)
	}
	return stored, nil
}

// ReadLogs reads the output of attempt n of invocation id from seq after on
// (n 0: its latest attempt; an invocation never claimed has none yet, an
// empty page of attempt 0).
func (s *Service) ReadLogs(ctx context.Context, id string, n, after, limit int) (domain.LogPage, error) {
	return s.readLogs(ctx, id, n, after, func(n int) ([]domain.LogChunk, error) {
		return s.store.Logs(ctx, id, n, after, cmp.Or(max(limit, 0), DefaultLogPage))
	})
}

// ReadLogsTail reads the last limit chunks of attempt n of invocation id,
// in order, as ReadLogs does: a page whose Next follows the output on.
func (s *Service) ReadLogsTail(ctx context.Context, id string, n, limit int) (domain.LogPage, error) {
	return s.readLogs(ctx, id, n, 0, func(n int) ([]domain.LogChunk, error) {
		return s.store.LogsTail(ctx, id, n, cmp.Or(max(limit, 0), DefaultLogPage))
	})
}

// readLogs answers the page read reads of attempt n of invocation id (n 0:
// its latest), after the attempt is checked.
func (s *Service) readLogs(ctx context.Context, id string, n, after int, read func(n int) ([]domain.LogChunk, error)) (domain.LogPage, error) {
	inv, err := s.store.GetInvocation(ctx, id)
	if err != nil {
		return domain.LogPage{}, err
	}
	if n == 0 {
		n = inv.Attempt
	}
	page := domain.LogPage{InvocationID: id, Attempt: n, Next: after}
	if n == 0 {
		return page, nil
	}
	if n > inv.Attempt {
		return domain.LogPage{}, domain.Errorf(domain.KindNotFound, "invocation %s has run %d attempts; there is no attempt %d", id, inv.Attempt, n)
	}
	chunks, err := read(n)
	if err != nil {
		return domain.LogPage{}, err
	}
	for _, c := range chunks {
		page.Chunks = append(page.Chunks, c)
		page.Next = c.Seq + 1
		page.EOF = page.EOF || c.EOF
	}
	return page, nil
}
