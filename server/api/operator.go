package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

func (s *Server) submit(r *http.Request) (int, any, error) {
	var req wire.SubmitRequest
	if err := wire.Decode(r.Body, &req); err != nil {
		return 0, nil, err
	}
	inv, created, err := s.svc.Submit(r.Context(), req.Spec())
	if err != nil {
		return 0, nil, err
	}
	if !created {
		return http.StatusOK, invocationView(inv), nil
	}
	return http.StatusCreated, invocationView(inv), nil
}

func pathID(r *http.Request, prefix string) (string, error) {
	id := r.PathValue("id")
	if !ids.Valid(prefix, id) {
		return "", wire.Errorf(wire.CodeInvalid, "%q is not a %s_ id", id, prefix)
	}
	return id, nil
}

func (s *Server) getInvocation(r *http.Request) (int, any, error) {
	id, err := pathID(r, ids.Invocation)
	if err != nil {
		return 0, nil, err
	}
	inv, err := s.svc.Invocation(r.Context(), id)
	if err != nil {
		return 0, nil, err
	}
	v := invocationView(inv)
	if inv.State == domain.StateQueued {
		hold, ok, err := s.svc.Hold(r.Context(), domain.ProvisionKey{Queue: inv.Queue, HostKey: inv.HostKey})
		if err != nil {
			return 0, nil, err
		}
		if now := s.clock.Now(); ok && hold.Waiting(now) {
			v.WaitingReason = waitingReason(hold, now)
		}
	}
	return http.StatusOK, v, nil
}

// waitingReason says why queued work whose key is held waits.
func waitingReason(h domain.KeyHold, now time.Time) string {
	failed := "1 host launched for it failed"
	if h.Failures > 1 {
		failed = fmt.Sprintf("%d hosts launched for it failed in a row", h.Failures)
	}
	what := fmt.Sprintf("%s; the provisioner tries again in %s", failed, h.Until.Sub(now).Round(time.Second))
	if h.Stopped {
		what = fmt.Sprintf("%s; the provisioner launches none for it until %s (once its cause is fixed, lakeshore release-hold lets it launch; a submit with another host setup is another key)",
			failed, h.Until.UTC().Format(time.RFC3339))
	}
	return what + "; the last: " + h.Last.Reason
}

// invocationLogs answers GET /v1/invocations/{id}/logs?attempt=N&after=SEQ&limit=L:
// one page of an attempt's shipped output (attempt 0 or absent: the latest),
// or with tail=N instead of after and limit its last N chunks.
func (s *Server) invocationLogs(r *http.Request) (int, any, error) {
	id, err := pathID(r, ids.Invocation)
	if err != nil {
		return 0, nil, err
	}
	q := r.URL.Query()
	num := func(name string, lo, hi, def int) (int, error) {
		v := q.Get(name)
		if v == "" {
			return def, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			return 0, wire.Errorf(wire.CodeInvalid, "%s must be %d-%d, got %q", name, lo, hi, v)
		}
		return n, nil
	}
	attempt, err := num("attempt", 0, wire.MaxAttemptNumber, 0)
	if err != nil {
		return 0, nil, err
	}
	after, err := num("after", 0, domain.MaxLogChunks, 0)
	if err != nil {
		return 0, nil, err
	}
	limit, err := num("limit", 1, 64, control.DefaultLogPage)
	if err != nil {
		return 0, nil, err
	}
	tail, err := num("tail", 1, 64, 0)
	if err != nil {
		return 0, nil, err
	}
	if tail > 0 {
		if q.Has("after") || q.Has("limit") {
			return 0, nil, wire.Errorf(wire.CodeInvalid, "tail reads the last chunks: it takes no after or limit")
		}
		page, err := s.svc.ReadLogsTail(r.Context(), id, attempt, tail)
		if err != nil {
			return 0, nil, err
		}
		return http.StatusOK, wire.LogPageOf(page), nil
	}
	page, err := s.svc.ReadLogs(r.Context(), id, attempt, after, limit)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.LogPageOf(page), nil
}

func (s *Server) cancel(r *http.Request) (int, any, error) {
	id, err := pathID(r, ids.Invocation)
	if err != nil {
		return 0, nil, err
	}
	inv, err := s.svc.Cancel(r.Context(), id)
	if err != nil {
		return 0, nil, err
	}
	if inv.State == domain.StateRunning {
		return http.StatusAccepted, invocationView(inv), nil
	}
	return http.StatusOK, invocationView(inv), nil
}

// listParams reads limit and cursor.
func listParams(r *http.Request) (int, string, error) {
	q := r.URL.Query()
	limit := defaultLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			return 0, "", wire.Errorf(wire.CodeInvalid, "limit must be 1-%d, got %q", maxListLimit, v)
		}
		limit = n
	}
	return limit, q.Get("cursor"), nil
}

func (s *Server) listInvocations(r *http.Request) (int, any, error) {
	limit, cursor, err := listParams(r)
	if err != nil {
		return 0, nil, err
	}
	q := r.URL.Query()
	queue, state, order := q.Get("queue"), q.Get("state"), q.Get("order")
	if queue != "" && !wire.ValidQueue(queue) {
		return 0, nil, wire.Errorf(wire.CodeInvalid, "queue %q is not a valid queue name", queue)
	}
	if state != "" && !slices.Contains(wire.InvocationStates, state) {
		return 0, nil, wire.Errorf(wire.CodeInvalid, "state must be one of %v", wire.InvocationStates)
	}
	if order != "" && order != wire.OrderOldest && order != wire.OrderNewest {
		return 0, nil, wire.Errorf(wire.CodeInvalid, "order must be %s or %s, got %q", wire.OrderOldest, wire.OrderNewest, order)
	}
	prefix := q.Get("id_prefix")
	if prefix != "" && !ids.ValidPrefix(ids.Invocation, prefix) {
		return 0, nil, wire.Errorf(wire.CodeInvalid, "id_prefix must be inv_ and 1-26 characters of an id (0-9, A-Z but I, L, O, U), got %q", prefix)
	}
	lq := store.ListQuery{Queue: queue, State: domain.InvocationState(state), Order: order, Limit: limit, Cursor: cursor, IDPrefix: prefix}
	invs, next, err := s.svc.Invocations(r.Context(), lq)
	if err != nil {
		return 0, nil, err
	}
	out := wire.InvocationList{Invocations: make([]wire.Invocation, 0, len(invs)), NextCursor: next}
	if len(invs) > 0 {
		out.PrevCursor = store.CursorAt(lq, invs[0].ID)
	}
	for _, inv := range invs {
		out.Invocations = append(out.Invocations, invocationView(inv))
	}
	return http.StatusOK, out, nil
}

func (s *Server) listWorkers(r *http.Request) (int, any, error) {
	limit, cursor, err := listParams(r)
	if err != nil {
		return 0, nil, err
	}
	state, label := r.URL.Query().Get("state"), r.URL.Query().Get("label")
	if state != "" && !slices.Contains(wire.WorkerStates, state) {
		return 0, nil, wire.Errorf(wire.CodeInvalid, "state must be one of %v", wire.WorkerStates)
	}
	ws, next, err := s.svc.Workers(r.Context(), limit, cursor)
	if err != nil {
		return 0, nil, err
	}
	now := s.clock.Now()
	out := wire.WorkerList{Workers: make([]wire.Worker, 0, len(ws)), NextCursor: next}
	for _, w := range ws {
		v := s.workerView(w, now)
		if (state != "" && v.State != state) || (label != "" && v.Label != label) {
			continue
		}
		out.Workers = append(out.Workers, v)
	}
	return http.StatusOK, out, nil
}

func (s *Server) getWorker(r *http.Request) (int, any, error) {
	id, err := pathID(r, ids.Worker)
	if err != nil {
		return 0, nil, err
	}
	w, err := s.svc.Worker(r.Context(), id)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, s.workerView(w, s.clock.Now()), nil
}

func (s *Server) drain(r *http.Request) (int, any, error) {
	id, err := pathID(r, ids.Worker)
	if err != nil {
		return 0, nil, err
	}
	w, err := s.svc.Drain(r.Context(), id)
	if err != nil {
		return 0, nil, err
	}
	now := s.clock.Now()
	state := domain.Project(w, now, s.svc.StaleAfter())
	note := "it claims nothing more, finishes what it runs (within its --grace) and leaves with bye drain"
	if state == domain.WorkerStale {
		note = fmt.Sprintf("it is stale (silent for %s): it claims nothing, its work was handed back; "+
			"if it polls again it is told to drain", now.Sub(w.LastSeenAt).Round(time.Second))
	}
	return http.StatusAccepted, wire.DrainAccepted{WorkerID: w.ID, State: string(state), Note: note}, nil
}

func (s *Server) addSetup(r *http.Request) (int, any, error) {
	id, err := pathID(r, ids.Worker)
	if err != nil {
		return 0, nil, err
	}
	var req wire.SetupRequest
	if err := wire.Decode(r.Body, &req); err != nil {
		return 0, nil, err
	}
	cmd, err := s.svc.AddSetup(r.Context(), id, req.Argv)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusAccepted, wire.SetupAccepted{CommandID: cmd.CommandID}, nil
}

func (s *Server) setupResults(r *http.Request) (int, any, error) {
	id, err := pathID(r, ids.Worker)
	if err != nil {
		return 0, nil, err
	}
	cmds, err := s.svc.SetupResults(r.Context(), id)
	if err != nil {
		return 0, nil, err
	}
	out := wire.SetupResults{WorkerID: id, SetupResults: make([]wire.SetupCommand, 0, len(cmds))}
	for _, c := range cmds {
		out.SetupResults = append(out.SetupResults, wire.SetupCommand{
			CommandID: c.CommandID, Argv: c.Argv, Status: c.Status, ExitCode: c.ExitCode,
			DurationMS: c.DurationMS, OutputTail: c.OutputTail, CreatedAt: c.CreatedAt,
			FinishedAt: timePtr(c.FinishedAt),
		})
	}
	return http.StatusOK, out, nil
}

// releaseHold answers POST /v1/hosts/release: the key's failed hosts no
// longer hold its launches back.
func (s *Server) releaseHold(r *http.Request) (int, any, error) {
	var req wire.ReleaseHoldRequest
	if err := wire.Decode(r.Body, &req); err != nil {
		return 0, nil, err
	}
	hold, err := s.svc.ReleaseHold(r.Context(), domain.ProvisionKey{Queue: req.Queue, HostKey: req.HostKey})
	if err != nil {
		return 0, nil, err
	}
	out := wire.HoldReleased{Queue: req.Queue, HostKey: req.HostKey, Released: hold.Failures > 0, Failures: hold.Failures}
	if out.Released {
		out.Note = fmt.Sprintf("%d failed hosts in a row no longer hold it back; the next provisioner pass launches for its queued work", hold.Failures)
	} else {
		out.Note = "nothing held its launches back"
	}
	return http.StatusOK, out, nil
}

// listHosts answers GET /v1/hosts: every host the provisioner launched or
// tried to that has not expired (the day's), newest first: a scan of the
// hosts table, off the provisioner's path.
func (s *Server) listHosts(r *http.Request) (int, any, error) {
	hosts, err := s.svc.Hosts(r.Context())
	if err != nil {
		return 0, nil, err
	}
	slices.SortFunc(hosts, func(a, b domain.Host) int { return b.CreatedAt.Compare(a.CreatedAt) })
	out := wire.HostList{Hosts: make([]wire.Host, 0, len(hosts))}
	for _, h := range hosts {
		out.Hosts = append(out.Hosts, wire.Host{HostID: h.ID, Queue: h.Key.Queue, HostKey: h.Key.HostKey, State: string(h.State),
			InstanceID: h.InstanceID, Market: h.Market, Reason: h.Reason, CreatedAt: h.CreatedAt,
			LaunchedAt: timePtr(h.LaunchedAt), EndedAt: timePtr(h.EndedAt)})
	}
	return http.StatusOK, out, nil
}

func (s *Server) queueStats(r *http.Request) (int, any, error) {
	queue := r.PathValue("queue")
	if !wire.ValidQueue(queue) {
		return 0, nil, wire.Errorf(wire.CodeInvalid, "queue %q is not a valid queue name", queue)
	}
	st, err := s.svc.QueueStats(r.Context(), queue)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.QueueStatsOf(st), nil
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// invocationView is the operator's view of inv. Environment values are
// redacted: env is where callers put credentials, and an operator token
// (shared by dashboards and scripts) should not read them back; only the
// worker that runs the invocation receives them.
func invocationView(inv domain.Invocation) wire.Invocation {
	rc := wire.RunConfig(inv.RunConfig)
	rc.Env = redacted(rc.Env)
	v := wire.Invocation{
		InvocationID: inv.ID, Queue: inv.Queue, State: string(inv.State), Attempt: inv.Attempt,
		MaxAttempts: inv.MaxAttempts, WorkerID: inv.WorkerID, Argv: inv.Argv, Env: redacted(inv.Env),
		RunConfig: rc, TimeoutS: inv.TimeoutS, ExitCode: inv.ExitCode, Error: (*wire.ErrorInfo)(inv.Error),
		StdoutTail: inv.StdoutTail, StderrTail: inv.StderrTail, HostKey: inv.HostKey,
		CancelRequested: inv.CancelRequested, IdempotencyKey: inv.IdempotencyKey,
		CreatedAt: inv.CreatedAt, StartedAt: timePtr(inv.StartedAt), FinishedAt: timePtr(inv.FinishedAt),
	}
	if inv.RunID != "" {
		v.RunID, v.RunIndex = inv.RunID, &inv.RunIndex
	}
	if inv.ResultBlob != "" {
		v.ResultBlob = json.RawMessage(inv.ResultBlob)
	}
	if inv.Input != "" {
		v.Input = json.RawMessage(inv.Input)
	}
	for _, a := range inv.Attempts {
		v.Attempts = append(v.Attempts, wire.Attempt{
			Attempt: a.Attempt, WorkerID: a.WorkerID, ClaimedAt: a.ClaimedAt, EndedAt: timePtr(a.EndedAt),
			Outcome: a.Outcome, ExitCode: a.ExitCode, Reason: a.Reason, Recorded: a.Recorded, Retried: a.Retried,
		})
	}
	if p := inv.Retry; p != nil {
		v.Retry = &wire.RetryPolicy{ExitCodes: p.ExitCodes, Timeout: p.Timeout, BackoffS: p.BackoffS}
	}
	v.RetryAt = timePtr(inv.RetryAt)
	// A finished invocation names the worker whose outcome won.
	if v.WorkerID == "" && len(inv.Attempts) > 0 && inv.State.Terminal() {
		v.WorkerID = inv.Attempts[len(inv.Attempts)-1].WorkerID
	}
	return v
}

// redacted returns env with every value replaced by wire.Redacted.
func redacted(env map[string]string) map[string]string {
	if env == nil {
		return nil
	}
	out := make(map[string]string, len(env))
	for k := range env {
		out[k] = wire.Redacted
	}
	return out
}

// workerView is the operator's view of w at now (its current_invocations:
// domain.RunningNow).
func (s *Server) workerView(w domain.Worker, now time.Time) wire.Worker {
	since, why := domain.StateWhy(w, now, s.svc.StaleAfter())
	state := domain.Project(w, now, s.svc.StaleAfter())
	w.CurrentInvocations = domain.RunningNow(w, now, s.svc.StaleAfter())
	return wire.Worker{
		RetiredAt: timePtr(w.GoneAt), StateSince: timePtr(since), StateWhy: why,
		WorkerID: w.ID, MachineID: w.MachineID, Label: w.Label,
		State: string(state), StoredState: string(w.State),
		HostStatus: string(w.HostStatus), Phase: string(w.Phase), HostKey: w.HostKey, Tags: w.Tags, Lanes: w.Lanes,
		MaxConcurrency: w.MaxConcurrency, CurrentInvocations: w.CurrentInvocations,
		LastSeenAt: timePtr(w.LastSeenAt), CreatedAt: w.CreatedAt, RetiredWhy: w.GoneWhy,
		LastSetupResult: (*wire.SetupResult)(w.LastSetupResult),
		AdoptHostSetup:  w.AdoptHostSetup,
		Adoption:        adoptionView(w.Adoption),
	}
}

// adoptionView is the operator's view of a worker's adoption (nil: none).
func adoptionView(a *domain.Adoption) *wire.Adoption {
	if a == nil {
		return nil
	}
	return &wire.Adoption{HostKey: a.HostKey, Queue: a.Queue, AskedAt: a.AskedAt, Failed: a.Failed}
}
