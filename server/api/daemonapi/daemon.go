package daemonapi

import (
	"fmt"
	"net/http"

	"github.com/dreamlake/lakeshore/server/auth"
	"github.com/dreamlake/lakeshore/shared/wire"
)

func (s *Router) hello(r *http.Request) (int, any, error) {
	instance, err := s.callerInstance(r)
	if err != nil {
		return 0, nil, err
	}
	if !auth.EqualAny(s.daemonToken(r), s.cfg.EnrollToken, s.cfg.PreviousEnrollToken) {
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
	g, err := s.svc.Hello(r.Context(), req.Registration(), func(workerID string) (string, error) {
		tok, hash, err := auth.NewWorkerToken(workerID)
		token = tok
		return hash, err
	})
	if err != nil {
		return 0, nil, err
	}
	resp := wire.HelloResponse{WorkerID: g.Worker.ID, Token: token, StaleAfterS: g.StaleAfter.Seconds(),
		PollIntervalS: g.PollInterval.Seconds(), WakeURL: g.WakeURL, WakePollIntervalS: g.WakeInterval.Seconds()}
	if g.LongPoll {
		resp.LongPollS = resp.PollIntervalS
	}
	return http.StatusOK, resp, nil
}

func (s *Router) poll(r *http.Request) (int, any, error) {
	var req wire.PollRequest
	authorize, err := s.WorkerRequest(r, &req)
	if err != nil {
		return 0, nil, err
	}
	cmds, err := s.svc.Poll(r.Context(), req.Poll(), authorize)
	if err != nil {
		return 0, nil, err
	}
	resp := wire.PollResponse{Commands: make([]wire.Command, 0, len(cmds))}
	for _, c := range cmds {
		resp.Commands = append(resp.Commands, wire.CommandOf(c))
	}
	return http.StatusOK, resp, nil
}

func (s *Router) ack(r *http.Request) (int, any, error) {
	var req wire.AckRequest
	authorize, err := s.WorkerRequest(r, &req)
	if err != nil {
		return 0, nil, err
	}
	res, err := s.svc.Ack(r.Context(), req.Outcome(), authorize)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.AckResponse{Recorded: res.Recorded, State: string(res.State)}, nil
}

func (s *Router) logs(r *http.Request) (int, any, error) {
	var req wire.LogsRequest
	authorize, err := s.WorkerRequest(r, &req)
	if err != nil {
		return 0, nil, err
	}
	stored, err := s.svc.ShipLogs(r.Context(), req.WorkerID, req.Batches(), authorize)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.LogsAccepted{Stored: stored}, nil
}

func (s *Router) bye(r *http.Request) (int, any, error) {
	var req wire.ByeRequest
	authorize, err := s.WorkerRequest(r, &req)
	if err != nil {
		return 0, nil, err
	}
	if _, err := s.svc.Bye(r.Context(), req.Bye(), authorize); err != nil {
		return 0, nil, fmt.Errorf("bye %s: %w", req.WorkerID, err)
	}
	return http.StatusNoContent, nil, nil
}
