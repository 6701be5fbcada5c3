package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/dreamlake/lakeshore/shared/auth"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// PollInterval reports the interval hello tells daemons to poll at: five
// seconds, or a sixth of the stale window when that is shorter. Six polls
// fit in every stale window, so losing a few never makes a live worker stale.
func PollInterval(staleAfter time.Duration) time.Duration {
	return min(5*time.Second, staleAfter/6)
}

func (s *Server) hello(r *http.Request) (int, any, error) {
	if !auth.Equal(auth.Bearer(r), s.cfg.EnrollToken) {
		return 0, nil, wire.Errorf(wire.CodeUnauthorized, "hello needs Authorization: Bearer <enrollment token>")
	}
	var req wire.HelloRequest
	if err := wire.Decode(r.Body, &req); err != nil {
		return 0, nil, err
	}
	var token string
	res, err := s.cfg.Store.Hello(r.Context(), req, func(workerID string) (string, error) {
		tok, hash, err := auth.NewWorkerToken(workerID)
		token = tok
		return hash, err
	})
	if err != nil {
		return 0, nil, err
	}
	s.log.Info("hello", "worker_id", res.Worker.ID, "machine_id", req.MachineID,
		"retired_worker_id", res.Retired, "requeued", res.Requeued)
	return http.StatusOK, wire.HelloResponse{
		WorkerID:      res.Worker.ID,
		Token:         token,
		StaleAfterS:   s.cfg.StaleAfter.Seconds(),
		PollIntervalS: PollInterval(s.cfg.StaleAfter).Seconds(),
	}, nil
}

func (s *Server) poll(r *http.Request) (int, any, error) {
	var req wire.PollRequest
	if err := wire.Decode(r.Body, &req); err != nil {
		return 0, nil, err
	}
	tok, err := workerToken(r, req.WorkerID)
	if err != nil {
		return 0, nil, err
	}
	ctx := r.Context()
	st := s.cfg.Store
	w, err := st.Heartbeat(ctx, req, authorizeRow(tok))
	if err != nil {
		return 0, nil, err
	}
	if err := st.RecordSetupResults(ctx, w.ID, req.SetupResults); err != nil {
		return 0, nil, err
	}

	cmds := []wire.Command{}
	if w.State == domain.WorkerDraining && req.Phase != wire.PhaseDraining && req.Phase != wire.PhaseTerminating {
		cmds = append(cmds, wire.Command{Type: wire.CommandDrain})
	}
	pending, err := st.SetupCommands(ctx, w.ID, true)
	if err != nil {
		return 0, nil, err
	}
	// Unreported commands go out on every poll until reported: an answer
	// lost on the way must not leave the FIFO stuck. The daemon dedupes by id.
	for _, c := range pending {
		cmds = append(cmds, wire.Command{Type: wire.CommandSetup, CommandID: c.CommandID, Argv: c.Argv})
	}
	cancels, err := s.cancels(ctx, w, req.Invocations)
	if err != nil {
		return 0, nil, err
	}
	cmds = append(cmds, cancels...)

	queue := req.Queue
	if queue == "" && len(w.Lanes) > 0 {
		queue = w.Lanes[0]
	}
	ok, _ := domain.AcceptsWork(w, len(pending) > 0)
	if !ok || queue == "" {
		return http.StatusOK, wire.PollResponse{Commands: cmds}, nil
	}
	runs, err := s.claim(ctx, w, queue, len(cmds) == 0, req.TimeoutS)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.PollResponse{Commands: append(cmds, runs...)}, nil
}

// cancels reports a cancel command for each invocation the daemon says it
// runs that it should stop: an operator cancelled it, or it is no longer
// this worker's running attempt (an earlier attempt's ack won, or it was
// handed to another worker).
func (s *Server) cancels(ctx context.Context, w domain.Worker, inflight []string) ([]wire.Command, error) {
	if len(inflight) == 0 {
		return nil, nil
	}
	held, err := s.cfg.Store.Held(ctx, w.ID)
	if err != nil {
		return nil, err
	}
	var out []wire.Command
	for _, id := range inflight {
		i := slices.IndexFunc(held, func(inv domain.Invocation) bool { return inv.ID == id })
		var inv domain.Invocation
		if i >= 0 {
			inv = held[i]
		} else {
			// The holder index is eventually consistent on AWS: confirm on
			// the table before telling a worker to stop.
			inv, err = s.cfg.Store.GetInvocation(ctx, id)
			if errors.Is(err, wire.ErrNotFound) {
				out = append(out, wire.Command{Type: wire.CommandCancel, InvocationID: id})
				continue
			}
			if err != nil {
				return nil, err
			}
		}
		if !inv.Running(w.ID) || inv.CancelRequested {
			out = append(out, wire.Command{Type: wire.CommandCancel, InvocationID: id})
		}
	}
	return out, nil
}

// claim takes up to the worker's free capacity of queued work, waiting up to
// the poll's timeout (capped) for some to arrive when wait is set.
func (s *Server) claim(ctx context.Context, w domain.Worker, queue string, wait bool, timeoutS float64) ([]wire.Command, error) {
	free := w.MaxConcurrency - w.CurrentInvocations
	limit := min(s.cfg.MaxPollWait, s.cfg.StaleAfter/3)
	waitFor := min(time.Duration(timeoutS*float64(time.Second)), limit)
	if !wait {
		waitFor = 0
	}
	deadline := time.Now().Add(waitFor)
	backoff := pollBackoffMin
	for {
		res, err := s.cfg.Store.Claim(ctx, w, queue, free)
		if err != nil {
			return nil, err
		}
		if len(res.Claimed) > 0 {
			out := make([]wire.Command, 0, len(res.Claimed))
			for _, inv := range res.Claimed {
				s.log.Info("claimed", "worker_id", w.ID, "invocation_id", inv.ID, "attempt", inv.Attempt)
				out = append(out, wire.Command{Type: wire.CommandRun, Invocation: runPayload(inv)})
			}
			return out, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, nil
		}
		if err := s.cfg.Sleep(ctx, min(backoff, left)); err != nil {
			return nil, nil // the client went away; nothing was claimed
		}
		backoff = min(backoff*2, pollBackoffMax)
	}
}

func runPayload(inv domain.Invocation) *wire.RunInvocation {
	return &wire.RunInvocation{
		InvocationID: inv.ID,
		Attempt:      inv.Attempt,
		Argv:         inv.Argv,
		Env:          inv.Env,
		RunConfig:    inv.RunConfig,
		TimeoutS:     inv.TimeoutS,
		HostKey:      inv.HostKey,
	}
}

func (s *Server) ack(r *http.Request) (int, any, error) {
	var req wire.AckRequest
	if err := wire.Decode(r.Body, &req); err != nil {
		return 0, nil, err
	}
	tok, err := workerToken(r, req.WorkerID)
	if err != nil {
		return 0, nil, err
	}
	resp, err := s.cfg.Store.Ack(r.Context(), auth.Hash(tok), req)
	if err != nil {
		return 0, nil, err
	}
	s.log.Info("ack", "worker_id", req.WorkerID, "invocation_id", req.InvocationID, "attempt", req.Attempt,
		"state", req.State, "recorded", resp.Recorded)
	return http.StatusOK, resp, nil
}

func (s *Server) bye(r *http.Request) (int, any, error) {
	var req wire.ByeRequest
	if err := wire.Decode(r.Body, &req); err != nil {
		return 0, nil, err
	}
	tok, err := workerToken(r, req.WorkerID)
	if err != nil {
		return 0, nil, err
	}
	n, err := s.cfg.Store.Bye(r.Context(), req, authorizeRow(tok))
	if err != nil {
		return 0, nil, fmt.Errorf("bye %s: %w", req.WorkerID, err)
	}
	s.log.Info("bye", "worker_id", req.WorkerID, "reason", req.Reason,
		"inflight_abandoned", req.InflightAbandoned, "requeued", n)
	return http.StatusNoContent, nil, nil
}
