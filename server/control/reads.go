package control

import (
	"context"
	"time"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// The operator's reads: what the API and the web view show, read here like
// every other use case, so the HTTP edge only translates.

// Clock is what the service reads worker states by.
func (s *Service) Clock() clock.Clock { return s.clock }

// StaleAfter is how long a silent worker stays live.
func (s *Service) StaleAfter() time.Duration { return s.staleAfter }

// Invocation reads invocation id.
func (s *Service) Invocation(ctx context.Context, id string) (domain.Invocation, error) {
	return s.store.GetInvocation(ctx, id)
}

// Invocations reads one page of the invocations q selects, and the cursor
// of the next ("" at the end).
func (s *Service) Invocations(ctx context.Context, q store.ListQuery) ([]domain.Invocation, string, error) {
	return s.store.List(ctx, q)
}

// Workers reads one page of the worker list (at most limit rows read), and
// the cursor of the next: the workers not yet out of the list
// (domain.Listed; DynamoDB's TTL deletes their rows some time later,
// emulators never).
func (s *Service) Workers(ctx context.Context, limit int, cursor string) ([]domain.Worker, string, error) {
	ws, next, err := s.store.ListWorkers(ctx, limit, cursor)
	if err != nil {
		return nil, "", err
	}
	now := s.clock.Now()
	out := ws[:0]
	for _, w := range ws {
		if domain.Listed(w, now, s.retention) {
			out = append(out, w)
		}
	}
	return out, next, nil
}

// Worker reads worker id.
func (s *Service) Worker(ctx context.Context, id string) (domain.Worker, error) {
	return s.store.GetWorker(ctx, id)
}

// SetupResults reads worker id's setup commands and their outcomes, oldest
// first (not found: no such worker).
func (s *Service) SetupResults(ctx context.Context, id string) ([]domain.SetupCommand, error) {
	if _, err := s.store.GetWorker(ctx, id); err != nil {
		return nil, err
	}
	return s.store.SetupCommands(ctx, id, false)
}

// Hosts reads the hosts the provisioner launched or tried to, alive and
// the day's ended ones.
func (s *Service) Hosts(ctx context.Context) ([]domain.Host, error) { return s.store.Hosts(ctx) }

// QueueStats reads queue's counts by state.
func (s *Service) QueueStats(ctx context.Context, queue string) (domain.QueueStats, error) {
	return s.store.QueueStats(ctx, queue)
}

// Ping checks that the store answers.
func (s *Service) Ping(ctx context.Context) error { return s.store.Ping(ctx) }
