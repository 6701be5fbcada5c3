package store

import (
	"context"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// SetHostStatus records the EC2 status of worker id's host (a versioned
// read-modify-write; a status equal to the stored one writes nothing). A
// worker stored gone is left as it is, and a host status never moves back
// from stopped or terminated (see HostStatusMoves): those calls are no-ops
// that return the row unchanged.
//
// When the host is stopped or terminated the worker reads gone at once
// (domain.Project), and its running invocations are handed back here rather
// than at the next sweep, so a terminated instance frees its work within
// seconds instead of after the stale window. The hand-back is repeated on
// every call that finds the host stopped or terminated, so a retry finishes
// one that failed halfway; it costs a query when nothing is held.
func (s *Store) SetHostStatus(ctx context.Context, id, status string) (domain.Worker, error) {
	if !domain.ValidHostStatus(status) {
		return domain.Worker{}, wire.Errorf(wire.CodeInvalid, "host status %q is not one of pending, running, stopped, terminated", status)
	}
	now := s.now()
	w, err := s.updateWorker(ctx, "set host status", id, nil, noError(func(w domain.Worker) (domain.Worker, bool) {
		return w.SetHostStatus(status, now)
	}))
	if err != nil || w.State == domain.WorkerGone || !domain.HostGone(w.HostStatus) {
		return w, err
	}
	if _, err := s.RequeueHeld(ctx, id, "host "+w.HostStatus); err != nil {
		return w, err
	}
	return w, nil
}

// LiveWorkersByMachine reports, by machine id, the workers whose host status
// may still change: those not stored gone and not on a terminated host. It
// scans the workers table (every row is read; the filter is applied here):
// it serves the host-status poller, once a minute, never a request path.
func (s *Store) LiveWorkersByMachine(ctx context.Context) (map[string][]domain.Worker, error) {
	out := map[string][]domain.Worker{}
	err := s.eachWorker(ctx, "live workers", func(w domain.Worker) error {
		if w.HostStatusMayChange() && w.MachineID != "" {
			out[w.MachineID] = append(out[w.MachineID], w)
		}
		return nil
	})
	return out, err
}

// MachineWorker reports the worker of machine id's current boot, from the
// machines table (one strongly consistent read), and whether the machine
// is known. Earlier boots' workers were made gone by the hello that
// replaced them.
func (s *Store) MachineWorker(ctx context.Context, machineID string) (string, bool, error) {
	m, found, err := s.getMachine(ctx, machineID)
	if err != nil || !found {
		return "", false, err
	}
	return m.WorkerID, m.WorkerID != "", nil
}
