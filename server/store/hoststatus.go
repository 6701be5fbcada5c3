package store

import (
	"context"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// UpdateHostStatus records status as the EC2 status of worker id's host
// (domain.Worker.SetHostStatus, a versioned read-modify-write). A status
// equal to the stored one, a worker stored gone and a status that may not
// follow the stored one (domain.HostStatusMoves) write nothing: the row is
// returned unchanged. Handing back the work of a host that stopped is the
// caller's (control.Service.SetHostStatus).
func (s *Store) UpdateHostStatus(ctx context.Context, id string, status domain.HostStatus) (domain.Worker, error) {
	now := s.now()
	return s.updateWorker(ctx, "set host status", id, nil, noError(func(w domain.Worker) (domain.Worker, bool) {
		return w.SetHostStatus(status, now)
	}))
}

// LiveWorkersByMachine reports, by machine id, the workers whose host status
// may still change: those not stored gone and not on a terminated host. It
// reads the workers the sweep is not done with (EachWorker; the filter is
// applied here): it serves the host-status poller, once a minute, never a
// request path.
func (s *Store) LiveWorkersByMachine(ctx context.Context) (map[string][]domain.Worker, error) {
	out := map[string][]domain.Worker{}
	err := s.EachWorker(ctx, "live workers", func(w domain.Worker) error {
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
