package control

import (
	"context"
	"errors"
	"time"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/cadence"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// Greeting is what a hello answers its daemon: the worker it is, and the
// cadence it must keep (the stale window, the poll interval, whether polls
// are held, the wake channel and its idle poll interval).
type Greeting struct {
	Registered
	StaleAfter   time.Duration
	PollInterval time.Duration
	// LongPoll: polls may wait for work (for up to PollInterval).
	LongPoll bool
	// WakeURL is the wake channel's ("": none), WakeInterval the poll
	// interval of a daemon whose wake socket is up.
	WakeURL      string
	WakeInterval time.Duration
}

// Hello registers a daemon (Register) and answers the cadence it must
// keep; the caller adds the token issue minted.
func (s *Service) Hello(ctx context.Context, reg domain.Registration, issue store.TokenIssuer) (Greeting, error) {
	res, err := s.Register(ctx, reg, issue)
	if err != nil {
		return Greeting{}, err
	}
	c := cadence.Of(s.staleAfter)
	g := Greeting{Registered: res, StaleAfter: s.staleAfter, PollInterval: c.Interval, LongPoll: s.longPoll}
	if s.wakeURL != "" {
		g.WakeURL, g.WakeInterval = s.wakeURL, c.WakeInterval
	}
	return g, nil
}

// Registered is what a hello did.
type Registered struct {
	Worker domain.Worker
	// Retired is the worker of the machine's previous boot that this hello
	// retired, if any. A retried hello of the same boot names it again only
	// when it still had work to do there: the first try's answer, or the
	// Lambda that ran it, was lost before the old worker was gone and its
	// work handed back.
	Retired string
	// Requeued counts the invocations handed back from the retired worker.
	Requeued int
}

// Register is hello's use case. The store registers the boot (idempotent
// per machine and boot, see store.Store.Hello); a new boot proves the old
// process dead, so the worker it replaced is made gone and its running
// invocations are queued again at once. Those writes come after the one
// that records the new boot, and a retried hello of the same boot repeats
// them (each is a no-op once done), so a lost answer or a Lambda that died
// in between never leaves the old worker live with its invocations held.
func (s *Service) Register(ctx context.Context, r domain.Registration, issue store.TokenIssuer) (Registered, error) {
	reg, err := s.store.Hello(ctx, r, issue)
	if err != nil {
		return Registered{}, err
	}
	res := Registered{Worker: reg.Worker, Retired: reg.Retired}
	if res.Retired != "" {
		why := "machine " + r.MachineID + " said hello from a new boot"
		left, err := s.store.MarkReplaced(ctx, res.Retired, r.BootID, why)
		if err != nil && !errors.Is(err, domain.ErrNotFound) {
			return res, err
		}
		s.workerNews(ctx, res.Retired) // a poll it still holds ends: 410 next
		if res.Requeued, err = s.HandBack(ctx, res.Retired, domain.Loss{Kind: domain.EndGone, Why: why}); err != nil {
			return res, err
		}
		if reg.Again && !left && res.Requeued == 0 {
			res.Retired = "" // the first try finished it: nothing retired now
		}
	}
	s.log.Info("hello", "worker_id", res.Worker.ID, "machine_id", r.MachineID,
		"retired_worker_id", res.Retired, "requeued", res.Requeued)
	return res, nil
}

// Heartbeat records poll p of its worker (domain.Worker.Heartbeat) and
// reports the worker row after it: the first step of Poll.
func (s *Service) Heartbeat(ctx context.Context, p domain.Poll, auth store.Authorize) (domain.Worker, error) {
	w, _, err := s.heartbeat(ctx, p, auth)
	return w, err
}

// heartbeat is Heartbeat, also reporting what the worker's poll before
// this one listed in flight (store.Store.Heartbeat).
func (s *Service) heartbeat(ctx context.Context, p domain.Poll, auth store.Authorize) (domain.Worker, []string, error) {
	// A poll that changes nothing else records last_seen_at at most once
	// per poll interval: the stored one is then at most the longest gap
	// plus an interval behind (a half of the stale window), so a live
	// worker never reads as stale.
	w, prior, err := s.store.Heartbeat(ctx, p.WorkerID, p, auth, cadence.Of(s.staleAfter).Interval)
	if de := (*domain.Error)(nil); errors.As(err, &de) && de.Reason == domain.GoneReplaced {
		// A replaced worker polled: its process runs, so the hello that
		// replaced it came from another process with its machine id.
		s.log.Warn("machine id conflict: a worker replaced by a new boot of its machine still polls; two processes use one machine id",
			"worker_id", p.WorkerID, "error", de.Message)
		if _, cerr := s.store.MarkMachineConflict(ctx, p.WorkerID); cerr != nil {
			s.log.Error("machine id conflict not recorded", "worker_id", p.WorkerID, "error", cerr.Error())
		}
	}
	return w, prior, err
}

// Ack records a worker's outcome o for one attempt
// (domain.Invocation.Record decides whether it counts). A requeued one is
// first put to its worker (domain.Worker.MayHandBack): only a draining
// worker hands an attempt back, and one whose ack says it drains is stored
// draining before the attempt goes back; a refused one changes nothing.
func (s *Service) Ack(ctx context.Context, o domain.Outcome, auth store.Authorize) (store.AckResult, error) {
	if o.State == domain.AckRequeued {
		if _, err := s.store.AllowHandBack(ctx, o.WorkerID, o.Phase, auth); err != nil {
			if domain.KindOf(err) == domain.KindConflict {
				s.log.Warn("requeued ack refused: its worker does not drain; the attempt stays running until a poll no longer lists it, its bye or the sweep",
					"worker_id", o.WorkerID, "invocation_id", o.InvocationID, "attempt", o.Attempt, "phase", o.Phase, "error", err.Error())
			}
			return store.AckResult{}, err
		}
	}
	res, err := s.store.Ack(ctx, o.InvocationID, o, auth)
	if err != nil {
		return res, err
	}
	s.log.Info("ack", "worker_id", o.WorkerID, "invocation_id", o.InvocationID, "attempt", o.Attempt,
		"state", o.State, "recorded", res.Recorded)
	switch {
	case !res.Recorded:
	case res.HandedBack:
		// Its body asked to be handed back as its worker drained: queued
		// again (or ended, once max_attempts is spent).
		s.metrics.HandedBack(res.Queue, domain.EndRequeued)
		if res.State.Terminal() {
			s.metrics.Finished(res.Queue, res.State)
		}
		s.claimable(ctx, domain.Invocation{State: res.State, Queue: res.Queue, HostKey: res.HostKey})
	case res.State.Terminal(): // not a retry, which is queued again
		s.metrics.Finished(res.Queue, res.State)
	}
	return res, nil
}

// Bye records a daemon's goodbye: its worker is gone at once and what it
// still held is handed back without waiting for the stale window. It
// reports how many invocations went back.
func (s *Service) Bye(ctx context.Context, b domain.Bye, auth store.Authorize) (int, error) {
	why := "bye: " + b.Reason
	if _, _, err := s.store.MarkGone(ctx, b.WorkerID, auth, domain.EndBye, why); err != nil {
		return 0, err
	}
	n, err := s.HandBack(ctx, b.WorkerID, domain.Loss{Kind: domain.EndBye, Why: why})
	if err != nil {
		return n, err
	}
	s.log.Info("bye", "worker_id", b.WorkerID, "reason", b.Reason,
		"inflight_abandoned", b.Abandoned, "requeued", n)
	return n, nil
}
