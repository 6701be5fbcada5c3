package store

import (
	"context"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// hostRank orders host statuses by how final they are: a host status only
// moves forward. A stopped instance's daemon is dead even if the instance
// starts again (it boots a new daemon, which says hello as a new worker),
// and a terminated instance never comes back.
var hostRank = map[string]int{
	"":                    0,
	domain.HostPending:    1,
	domain.HostRunning:    1, // pending ⇄ running both mean alive
	domain.HostStopped:    2,
	domain.HostTerminated: 3,
}

// ValidHostStatus reports whether status is one of the host statuses a
// worker row may carry (pending, running, stopped, terminated).
func ValidHostStatus(status string) bool {
	_, ok := hostRank[status]
	return ok && status != ""
}

// HostStatusMoves reports whether SetHostStatus would write to a worker
// whose host status is from when told to: to differs, and it does not move
// back from stopped or terminated (that would revive a worker whose work
// was already handed back) nor from terminated to stopped.
func HostStatusMoves(from, to string) bool {
	if from == to || !ValidHostStatus(to) {
		return false
	}
	rf, ok := hostRank[from]
	if !ok { // an unknown stored value: anything valid replaces it
		return true
	}
	return hostRank[to] >= rf
}

// goneHost reports whether a host status makes its worker read gone.
func goneHost(status string) bool {
	return status == domain.HostStopped || status == domain.HostTerminated
}

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
	if !ValidHostStatus(status) {
		return domain.Worker{}, wire.Errorf(wire.CodeInvalid, "host status %q is not one of pending, running, stopped, terminated", status)
	}
	now := s.now()
	w, err := s.updateWorker(ctx, "set host status", id, nil, func(w *domain.Worker) error {
		if w.State == domain.WorkerGone || !HostStatusMoves(w.HostStatus, status) {
			return nil
		}
		if goneHost(status) && !goneHost(w.HostStatus) && w.GoneAt.IsZero() {
			// The worker reads gone from now: the sweep measures its
			// look-for-held-work window from GoneAt.
			w.GoneAt = now
		}
		w.HostStatus = status
		w.Version++
		return nil
	})
	if err != nil || w.State == domain.WorkerGone || !goneHost(w.HostStatus) {
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
		if w.State != domain.WorkerGone && w.HostStatus != domain.HostTerminated && w.MachineID != "" {
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
