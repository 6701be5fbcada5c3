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
	instance, err := s.callerInstance(r)
	if err != nil {
		return 0, nil, err
	}
	if !auth.Equal(s.daemonToken(r), s.cfg.EnrollToken) {
		if s.cfg.DaemonAuth == auth.DaemonAuthIAM {
			return 0, nil, wire.Errorf(wire.CodeUnauthorized, "hello needs %s: <enrollment token>", wire.TokenHeader)
		}
		return 0, nil, wire.Errorf(wire.CodeUnauthorized, "hello needs Authorization: Bearer <enrollment token>")
	}
	var req wire.HelloRequest
	if err := wire.Decode(r.Body, &req); err != nil {
		return 0, nil, err
	}
	if err := sameInstance(instance, req.MachineID); err != nil {
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
	_, authorize, err := s.workerRequest(r, &req)
	if err != nil {
		return 0, nil, err
	}
	ctx := r.Context()
	st := s.cfg.Store
	w, err := st.Heartbeat(ctx, req, authorize)
	if err != nil {
		return 0, nil, err
	}
	if w, err = st.RecordSetupResults(ctx, w, req.SetupResults); err != nil {
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
	cancels, err := s.reconcile(ctx, w, req.Invocations)
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

// reconcile compares what the daemon says it runs with what the control
// plane thinks it holds. An invocation the daemon runs but should stop gets
// a cancel command saying why: "operator" (an operator cancelled it) or
// "superseded" (an earlier attempt's ack won, or it was handed to another
// worker; the cancelled ack that follows is a no-op). An invocation the
// worker holds but the daemon's (present) list omits was never received —
// its run command was lost — and is handed out again.
func (s *Server) reconcile(ctx context.Context, w domain.Worker, inflight []string) ([]wire.Command, error) {
	if inflight == nil {
		return nil, nil // an old daemon that sends no list: nothing to compare
	}
	st := s.cfg.Store
	held, err := st.Held(ctx, w.ID)
	if err != nil {
		return nil, err
	}
	for _, inv := range held {
		if !slices.Contains(inflight, inv.ID) {
			// Requeue re-reads the invocation and does nothing unless it still
			// runs this worker's attempt (the holder index may lag on AWS).
			got, err := st.Requeue(ctx, inv.ID, w.ID, "omitted from its worker's poll")
			if err != nil {
				return nil, err
			}
			s.log.Warn("redelivered an invocation its worker does not know", "worker_id", w.ID,
				"invocation_id", inv.ID, "attempt", inv.Attempt, "state", got.State)
		}
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
			inv, err = st.GetInvocation(ctx, id)
			if errors.Is(err, wire.ErrNotFound) {
				out = append(out, wire.Command{Type: wire.CommandCancel, InvocationID: id, Reason: wire.CancelSuperseded})
				continue
			}
			if err != nil {
				return nil, err
			}
		}
		if why := inv.CancelReason(w.ID); why != "" {
			out = append(out, wire.Command{Type: wire.CommandCancel, InvocationID: id, Reason: why})
		}
	}
	return out, nil
}

// claim takes up to the worker's free capacity of queued work, waiting up to
// the poll's timeout (capped) for some to arrive when wait is set. Any change
// to the worker's row during the wait (a drain, a setup command, a newer
// hello, a retirement) ends the wait without a claim: the next poll sees it.
func (s *Server) claim(ctx context.Context, w domain.Worker, queue string, wait bool, timeoutS float64) ([]wire.Command, error) {
	st := s.cfg.Store
	free := w.MaxConcurrency - w.CurrentInvocations
	waitFor := min(time.Duration(timeoutS*float64(time.Second)), s.cfg.MaxPollWait, s.cfg.StaleAfter/3)
	if !wait {
		waitFor = 0
	}
	var waited time.Duration
	backoff := pollBackoffMin
	for {
		res, err := st.Claim(ctx, w, queue, free)
		if err != nil {
			return nil, err
		}
		if len(res.Claimed) > 0 {
			return s.handOut(ctx, w, res.Claimed)
		}
		if waited >= waitFor {
			return nil, nil
		}
		d := min(backoff, waitFor-waited)
		if err := s.cfg.Sleep(ctx, d); err != nil {
			return nil, nil // the client went away; nothing was claimed
		}
		waited += d
		backoff = min(backoff*2, pollBackoffMax)
		cur, err := st.GetWorker(ctx, w.ID)
		if err != nil {
			return nil, err
		}
		if cur.Version != w.Version {
			return nil, nil
		}
	}
}

// handOut turns claimed invocations into run commands, unless the worker
// was retired while they were claimed: then they go straight back to the
// queue, since nobody will run them.
func (s *Server) handOut(ctx context.Context, w domain.Worker, claimed []domain.Invocation) ([]wire.Command, error) {
	st := s.cfg.Store
	cur, err := st.GetWorker(ctx, w.ID)
	if err != nil {
		return nil, err
	}
	if cur.State == domain.WorkerGone {
		for _, inv := range claimed {
			if _, err := st.Requeue(ctx, inv.ID, w.ID, "its worker was retired as it claimed"); err != nil {
				return nil, err
			}
		}
		return nil, wire.Errorf(wire.CodeWorkerGone, "worker is gone; say hello again")
	}
	out := make([]wire.Command, 0, len(claimed))
	for _, inv := range claimed {
		s.log.Info("claimed", "worker_id", w.ID, "invocation_id", inv.ID, "attempt", inv.Attempt)
		out = append(out, wire.Command{Type: wire.CommandRun, Invocation: runPayload(inv)})
	}
	return out, nil
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
	tok, authorize, err := s.workerRequest(r, &req)
	if err != nil {
		return 0, nil, err
	}
	resp, err := s.cfg.Store.Ack(r.Context(), req, authorize, auth.Hash(tok))
	if err != nil {
		return 0, nil, err
	}
	s.log.Info("ack", "worker_id", req.WorkerID, "invocation_id", req.InvocationID, "attempt", req.Attempt,
		"state", req.State, "recorded", resp.Recorded)
	return http.StatusOK, resp, nil
}

func (s *Server) bye(r *http.Request) (int, any, error) {
	var req wire.ByeRequest
	_, authorize, err := s.workerRequest(r, &req)
	if err != nil {
		return 0, nil, err
	}
	n, err := s.cfg.Store.Bye(r.Context(), req, authorize)
	if err != nil {
		return 0, nil, fmt.Errorf("bye %s: %w", req.WorkerID, err)
	}
	s.log.Info("bye", "worker_id", req.WorkerID, "reason", req.Reason,
		"inflight_abandoned", req.InflightAbandoned, "requeued", n)
	return http.StatusNoContent, nil, nil
}
