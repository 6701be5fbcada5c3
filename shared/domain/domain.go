// Package domain holds the records the control plane keeps (a worker, an
// invocation, a setup command) and the pure rules over them: the worker-state
// projection and the phase transitions of docs/design.md §6. It does
// no I/O; the store persists these records and the API renders them.
package domain

import (
	"time"
)

// WorkerState is where a worker is in its lifecycle (docs/states.md).
type WorkerState string

// Stored worker states, and the two computed on read (stale; gone also from
// host status).
const (
	WorkerPending   WorkerState = "pending"
	WorkerJoining   WorkerState = "joining"
	WorkerActive    WorkerState = "active"
	WorkerSettingUp WorkerState = "setting_up"
	WorkerDraining  WorkerState = "draining"
	WorkerGone      WorkerState = "gone"
	WorkerStale     WorkerState = "stale" // computed only, never stored
)

// WorkerStates lists every state a worker reads (stored, and the computed
// stale), in lifecycle order.
var WorkerStates = []WorkerState{WorkerPending, WorkerJoining, WorkerActive, WorkerSettingUp,
	WorkerDraining, WorkerStale, WorkerGone}

// HostStatus is what the launcher side (EC2) says of a worker's host; the
// daemon never writes it.
type HostStatus string

// Host statuses.
const (
	HostPending    HostStatus = "pending"
	HostRunning    HostStatus = "running"
	HostStopped    HostStatus = "stopped"
	HostTerminated HostStatus = "terminated"
)

// DefaultStaleAfter is how long a worker may be silent before it reads stale.
const DefaultStaleAfter = 60 * time.Second

// DefaultWorkerRetention is how long a gone worker stays in the worker list
// after it went gone (its history stays on the invocations it ran).
const DefaultWorkerRetention = 24 * time.Hour

// DefaultNeverPolledRetention is how long a worker that said hello and
// never polled is kept: a daemon polls within seconds of its hello (in
// setup too), so one that has not in an hour is not coming, and a flood of
// hellos must not grow the table for ever (docs/operations.md).
const DefaultNeverPolledRetention = time.Hour

// RetireSilentAfter is how long a stale worker may stay silent before the
// sweep retires it (gone): one that comes back after that says hello anew.
// It keeps a worker whose process died unseen from reading stale forever.
func RetireSilentAfter(staleAfter time.Duration) time.Duration {
	return max(time.Hour, 2*staleAfter)
}
