package control

import (
	"context"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// Submit queues the invocation spec asks for (domain.NewInvocation). With
// an idempotency key, a replay of the same request (spec.RequestHash)
// answers the invocation the first one made (created false); a different
// request under the same key is a conflict.
func (s *Service) Submit(ctx context.Context, spec domain.Spec) (inv domain.Invocation, created bool, err error) {
	inv, created, err = s.store.Submit(ctx, spec, spec.RequestHash)
	if err == nil && created {
		s.log.Info("submitted", "invocation_id", inv.ID, "queue", inv.Queue)
		s.claimable(ctx, inv)
		if err := s.store.NoteQueue(ctx, inv.Queue); err != nil {
			// Only the metrics miss it (until its first outcome is counted).
			s.log.Warn("queue not noted for the metrics", "queue", inv.Queue, "error", err.Error())
		}
		if s.submitted != nil {
			s.submitted(ctx, inv)
		}
	}
	return inv, created, err
}

// Cancel cancels invocation id (domain.Invocation.Cancel): a queued one at
// once, a running one by flagging it so its worker's next poll carries a
// cancel command. A finished one is a conflict.
func (s *Service) Cancel(ctx context.Context, id string) (domain.Invocation, error) {
	inv, err := s.store.Cancel(ctx, id)
	if err == nil {
		s.log.Info("cancel", "invocation_id", id, "state", inv.State)
		if inv.State == domain.StateCancelled {
			s.metrics.Finished(inv.Queue, inv.State) // it was queued: cancelled at once
		}
	}
	return inv, err
}

// Drain asks worker id to drain (domain.Worker.Drain): it claims nothing
// more, and its next poll carries a drain command.
func (s *Service) Drain(ctx context.Context, id string) (domain.Worker, error) {
	w, err := s.store.RequestDrain(ctx, id)
	if err == nil {
		s.log.Info("drain requested", "worker_id", id)
		s.workerNews(ctx, id)
	}
	return w, err
}

// Hold reports what holds key k's launches back (ok false: nothing ever
// did): its queued work's waiting reason.
func (s *Service) Hold(ctx context.Context, k domain.ProvisionKey) (domain.KeyHold, bool, error) {
	return s.store.KeyHold(ctx, k)
}

// ReleaseHold lets key k launch again: its hold (the failed hosts in a row
// that hold its launches back, docs/provision.md) is reset, so the next
// provisioner pass plans for its queued work as for a key that never
// failed. It reports the hold as it was (Failures 0: nothing held it).
// A hold that moved meanwhile (a host of k ended) is a conflict.
func (s *Service) ReleaseHold(ctx context.Context, k domain.ProvisionKey) (domain.KeyHold, error) {
	hold, ok, err := s.store.KeyHold(ctx, k)
	if err != nil || !ok || hold.Failures == 0 {
		return hold, err
	}
	released := domain.KeyHold{Key: k, Version: hold.Version}
	if err := s.store.SaveKeyHold(ctx, &released); err != nil {
		return hold, err
	}
	s.log.Info("hold released", "queue", k.Queue, "host_key", k.HostKey, "failures", hold.Failures, "stopped", hold.Stopped)
	return hold, nil
}

// AddSetup queues setup command argv for worker id; its polls hand it out
// until it reports a result.
func (s *Service) AddSetup(ctx context.Context, id string, argv []string) (domain.SetupCommand, error) {
	cmd, err := s.store.AddSetup(ctx, id, argv)
	if err == nil {
		s.log.Info("setup queued", "worker_id", id, "command_id", cmd.CommandID)
		s.workerNews(ctx, id)
	}
	return cmd, err
}
