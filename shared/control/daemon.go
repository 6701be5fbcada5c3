package control

import (
	"context"
	"errors"

	"github.com/dreamlake/lakeshore/shared/cadence"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/store"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Hello registers a daemon (Register) and answers the stale window and poll
// interval it must keep; the caller adds the token issue minted.
func (s *Service) Hello(ctx context.Context, req wire.HelloRequest, issue store.TokenIssuer) (wire.HelloResponse, error) {
	res, err := s.Register(ctx, req, issue)
	if err != nil {
		return wire.HelloResponse{}, err
	}
	c := cadence.Of(s.staleAfter)
	resp := wire.HelloResponse{
		WorkerID:      res.Worker.ID,
		StaleAfterS:   s.staleAfter.Seconds(),
		PollIntervalS: c.Interval.Seconds(),
	}
	if s.longPoll {
		resp.LongPollS = resp.PollIntervalS
	}
	if s.wakeURL != "" {
		resp.WakeURL = s.wakeURL
		resp.WakePollIntervalS = c.WakeInterval.Seconds()
	}
	return resp, nil
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
func (s *Service) Register(ctx context.Context, req wire.HelloRequest, issue store.TokenIssuer) (Registered, error) {
	reg, err := s.store.Hello(ctx, registration(req), issue)
	if err != nil {
		return Registered{}, err
	}
	res := Registered{Worker: reg.Worker, Retired: reg.Retired}
	if res.Retired != "" {
		why := "machine " + req.MachineID + " said hello from a new boot"
		left, err := s.store.MarkReplaced(ctx, res.Retired, req.BootID, why)
		if err != nil && !errors.Is(err, wire.ErrNotFound) {
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
	s.log.Info("hello", "worker_id", res.Worker.ID, "machine_id", req.MachineID,
		"retired_worker_id", res.Retired, "requeued", res.Requeued)
	return res, nil
}

// registration is what hello request req says of its daemon.
func registration(req wire.HelloRequest) domain.Registration {
	return domain.Registration{
		MachineID: req.MachineID, BootID: req.BootID, Label: req.Label, Tags: req.Tags, Lanes: req.Lanes,
		Versions: req.Versions, HostKey: req.HostKey, AdoptHostSetup: req.AdoptHostSetup,
		MaxConcurrency: req.Capabilities.MaxConcurrency, CurrentInvocations: req.Capabilities.CurrentInvocations,
	}
}

// Heartbeat records poll req of its worker (domain.Worker.Heartbeat) and
// reports the worker row after it: the first step of Poll.
func (s *Service) Heartbeat(ctx context.Context, req wire.PollRequest, auth store.Authorize) (domain.Worker, error) {
	p := domain.Poll{Phase: req.Phase, Queue: req.Queue, HostKey: req.HostKey, Listed: len(req.Invocations), AdoptFailed: req.AdoptFailed}
	if c := req.UpdatedCapabilities; c != nil {
		p.Capabilities, p.MaxConcurrency, p.CurrentInvocations = true, c.MaxConcurrency, c.CurrentInvocations
	}
	w, err := s.store.Heartbeat(ctx, req.WorkerID, p, auth)
	if de := (*domain.Error)(nil); errors.As(err, &de) && de.Reason == domain.GoneReplaced {
		// A replaced worker polled: its process runs, so the hello that
		// replaced it came from another process with its machine id.
		s.log.Warn("machine id conflict: a worker replaced by a new boot of its machine still polls; two processes use one machine id",
			"worker_id", req.WorkerID, "error", de.Message)
		if _, cerr := s.store.MarkMachineConflict(ctx, req.WorkerID); cerr != nil {
			s.log.Error("machine id conflict not recorded", "worker_id", req.WorkerID, "error", cerr.Error())
		}
	}
	return w, err
}

// Ack records a worker's outcome for one attempt (domain.Invocation.Record
// decides whether it counts).
func (s *Service) Ack(ctx context.Context, req wire.AckRequest, auth store.Authorize, tokenHash string) (wire.AckResponse, error) {
	o := domain.Outcome{
		WorkerID: req.WorkerID, Attempt: req.Attempt, State: req.State, ExitCode: req.ExitCode,
		Error: (*domain.ErrorInfo)(req.Error), StdoutTail: req.StdoutTail, StderrTail: req.StderrTail,
	}
	if len(req.ResultBlob) > 0 && string(req.ResultBlob) != "null" {
		o.ResultBlob = string(req.ResultBlob)
	}
	res, err := s.store.Ack(ctx, req.InvocationID, o, auth, tokenHash)
	if err != nil {
		return wire.AckResponse{}, err
	}
	s.log.Info("ack", "worker_id", req.WorkerID, "invocation_id", req.InvocationID, "attempt", req.Attempt,
		"state", req.State, "recorded", res.Recorded)
	switch {
	case !res.Recorded:
	case res.HandedBack:
		// Its body asked to be handed back as its worker drained: queued
		// again (or ended, once max_attempts is spent).
		s.metrics.HandedBack(res.Queue, domain.EndRequeued)
		if domain.Terminal(res.State) {
			s.metrics.Finished(res.Queue, res.State)
		}
		s.claimable(ctx, domain.Invocation{State: res.State, Queue: res.Queue, HostKey: res.HostKey})
	case domain.Terminal(res.State): // not a retry, which is queued again
		s.metrics.Finished(res.Queue, res.State)
	}
	return wire.AckResponse{Recorded: res.Recorded, State: res.State}, nil
}

// Bye records a daemon's goodbye: its worker is gone at once and what it
// still held is handed back without waiting for the stale window. It
// reports how many invocations went back.
func (s *Service) Bye(ctx context.Context, req wire.ByeRequest, auth store.Authorize) (int, error) {
	why := "bye: " + req.Reason
	if _, _, err := s.store.MarkGone(ctx, req.WorkerID, auth, why); err != nil {
		return 0, err
	}
	n, err := s.HandBack(ctx, req.WorkerID, domain.Loss{Kind: domain.EndBye, Why: why})
	if err != nil {
		return n, err
	}
	s.log.Info("bye", "worker_id", req.WorkerID, "reason", req.Reason,
		"inflight_abandoned", req.InflightAbandoned, "requeued", n)
	return n, nil
}
