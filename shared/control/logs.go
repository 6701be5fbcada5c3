package control

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/store"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// DefaultLogPage is how many chunks one read of an attempt's output
// answers at most (32 KiB each: at most 512 KiB of output).
const DefaultLogPage = 16

// ShipLogs stores the output a worker shipped (docs/logs.md). The token
// must be the worker's (auth), and each attempt one the worker ran and
// that ended no more than domain.LogGrace ago (its last chunks come just
// after its ack); the store writes each chunk once and holds each stream
// to its cap. It reports how many chunks were stored; an attempt refused
// stops the request there.
func (s *Service) ShipLogs(ctx context.Context, req wire.LogsRequest, auth store.Authorize) (wire.LogsAccepted, error) {
	w, err := s.store.GetWorker(ctx, req.WorkerID)
	if errors.Is(err, wire.ErrNotFound) {
		return wire.LogsAccepted{}, store.UnknownWorker(req.WorkerID, auth)
	}
	if err != nil {
		return wire.LogsAccepted{}, fmt.Errorf("ship logs: %w", err)
	}
	if err := auth(w); err != nil {
		return wire.LogsAccepted{}, err
	}
	var res wire.LogsAccepted
	for _, b := range req.Logs {
		inv, err := s.store.GetInvocation(ctx, b.InvocationID)
		if err != nil {
			return res, fmt.Errorf("ship logs of %s: %w", b.InvocationID, err)
		}
		if err := inv.TakesLogs(req.WorkerID, b.Attempt, s.clock.Now()); err != nil {
			return res, err
		}
		chunks := make([]domain.LogChunk, 0, len(b.Chunks))
		for _, c := range b.Chunks {
			chunks = append(chunks, domain.LogChunk(c))
		}
		if err := s.store.PutLogs(ctx, b.InvocationID, b.Attempt, chunks); err != nil {
			return res, err
		}
		res.Stored += len(chunks)
	}
	return res, nil
}

// ReadLogs reads the output of attempt n of invocation id from seq after on
// (n 0: its latest attempt; an invocation never claimed has none yet, an
// empty page of attempt 0).
func (s *Service) ReadLogs(ctx context.Context, id string, n, after, limit int) (wire.LogPage, error) {
	return s.readLogs(ctx, id, n, after, func(n int) ([]domain.LogChunk, error) {
		return s.store.Logs(ctx, id, n, after, cmp.Or(max(limit, 0), DefaultLogPage))
	})
}

// ReadLogsTail reads the last limit chunks of attempt n of invocation id,
// in order, as ReadLogs does: a page whose Next follows the output on.
func (s *Service) ReadLogsTail(ctx context.Context, id string, n, limit int) (wire.LogPage, error) {
	return s.readLogs(ctx, id, n, 0, func(n int) ([]domain.LogChunk, error) {
		return s.store.LogsTail(ctx, id, n, cmp.Or(max(limit, 0), DefaultLogPage))
	})
}

// readLogs answers the page read reads of attempt n of invocation id (n 0:
// its latest), after the attempt is checked.
func (s *Service) readLogs(ctx context.Context, id string, n, after int, read func(n int) ([]domain.LogChunk, error)) (wire.LogPage, error) {
	inv, err := s.store.GetInvocation(ctx, id)
	if err != nil {
		return wire.LogPage{}, err
	}
	if n == 0 {
		n = inv.Attempt
	}
	page := wire.LogPage{InvocationID: id, Attempt: n, Chunks: []wire.LogChunk{}, Next: after}
	if n == 0 {
		return page, nil
	}
	if n > inv.Attempt {
		return wire.LogPage{}, wire.Errorf(wire.CodeNotFound, "invocation %s has run %d attempts; there is no attempt %d", id, inv.Attempt, n)
	}
	chunks, err := read(n)
	if err != nil {
		return wire.LogPage{}, err
	}
	for _, c := range chunks {
		page.Chunks = append(page.Chunks, wire.LogChunk(c))
		page.Next = c.Seq + 1
		page.EOF = page.EOF || c.EOF
	}
	return page, nil
}
