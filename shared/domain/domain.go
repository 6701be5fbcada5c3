// Package domain holds the records the control plane keeps (a worker, an
// invocation, a setup command) and the pure rules over them: the worker-state
// projection and the phase transitions of docs/design.md §6. It does
// no I/O; the store persists these records and the API renders them.
package domain

import (
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// Stored worker states, and the two computed on read (stale; gone also from
// host status).
const (
	WorkerPending   = "pending"
	WorkerJoining   = "joining"
	WorkerActive    = "active"
	WorkerSettingUp = "setting_up"
	WorkerDraining  = "draining"
	WorkerGone      = "gone"
	WorkerStale     = "stale" // computed only, never stored
)

// Host statuses, written by the launcher side (EC2), never by the daemon.
const (
	HostPending    = "pending"
	HostRunning    = "running"
	HostStopped    = "stopped"
	HostTerminated = "terminated"
)

// DefaultStaleAfter is how long a worker may be silent before it reads stale.
const DefaultStaleAfter = 60 * time.Second

// Worker is the stored row of one daemon process (one machine boot).
type Worker struct {
	ID                 string            `dynamodbav:"worker_id"`
	MachineID          string            `dynamodbav:"machine_id"`
	BootID             string            `dynamodbav:"boot_id"`
	Label              string            `dynamodbav:"label,omitempty"`
	Tags               map[string]string `dynamodbav:"tags,omitempty"`
	Lanes              []string          `dynamodbav:"lanes,omitempty"`
	Versions           map[string]string `dynamodbav:"versions,omitempty"`
	HostKey            string            `dynamodbav:"host_key,omitempty"`
	MaxConcurrency     int               `dynamodbav:"max_concurrency"`
	CurrentInvocations int               `dynamodbav:"current_invocations"`
	State              string            `dynamodbav:"state"`
	Phase              string            `dynamodbav:"phase,omitempty"`
	HostStatus         string            `dynamodbav:"host_status,omitempty"`
	TokenHash          string            `dynamodbav:"token_hash"`
	ByeReason          string            `dynamodbav:"bye_reason,omitempty"`
	LastSetupResult    *wire.SetupResult `dynamodbav:"last_setup_result,omitempty"`
	CreatedAt          time.Time         `dynamodbav:"created_at"`
	LastSeenAt         time.Time         `dynamodbav:"last_seen_at"`
	GoneAt             time.Time         `dynamodbav:"gone_at,omitempty"`
	// Reaped marks a gone worker the sweep no longer needs to look at: a
	// sweep found it holding nothing after the holder index settled.
	Reaped  bool  `dynamodbav:"reaped,omitempty"`
	Version int64 `dynamodbav:"version"`
}

// Project reports the state an operator (and the redelivery sweep) sees for
// w at now. Gone is never relabelled; a stopped or terminated host reads
// gone; silence longer than staleAfter reads stale; otherwise the stored
// state stands.
func Project(w Worker, now time.Time, staleAfter time.Duration) string {
	switch {
	case w.State == WorkerGone:
		return WorkerGone
	case w.HostStatus == HostStopped || w.HostStatus == HostTerminated:
		return WorkerGone
	case !w.LastSeenAt.IsZero() && now.Sub(w.LastSeenAt) > staleAfter:
		return WorkerStale
	default:
		return w.State
	}
}

// Retired reports whether w is over for good: stored gone, or its host
// stopped or terminated (a stopped machine that starts again boots a new
// daemon, which says hello as a new worker). A retired worker claims
// nothing, its poll is refused (410) and a hello never returns it.
func Retired(w Worker) bool {
	return w.State == WorkerGone || w.HostStatus == HostStopped || w.HostStatus == HostTerminated
}

// PollTransition reports the stored state a poll carrying phase moves a
// worker in stored state cur to (phase "" means an old daemon that sends
// none). It never widens the allowed flips: draining never returns to
// active or setting_up, and a gone worker is not revived (ErrWorkerGone).
func PollTransition(cur, phase string) (string, error) {
	if cur == WorkerGone {
		return "", wire.Errorf(wire.CodeWorkerGone, "worker is gone; say hello again")
	}
	switch phase {
	case "", wire.PhaseSetup, wire.PhaseReady, wire.PhaseDraining, wire.PhaseTerminating:
	default:
		return "", wire.Errorf(wire.CodeInvalid, "unknown phase %q", phase)
	}
	if cur == WorkerDraining {
		return WorkerDraining, nil
	}
	switch phase {
	case "":
		if cur == WorkerPending || cur == WorkerJoining {
			return WorkerActive, nil
		}
		return cur, nil
	case wire.PhaseSetup:
		return WorkerSettingUp, nil
	case wire.PhaseReady:
		return WorkerActive, nil
	default: // draining, terminating
		return WorkerDraining, nil
	}
}

// AcceptsWork reports whether a worker may be handed new invocations, and
// if not, why. setupPending is whether its setup FIFO holds unreported
// commands.
func AcceptsWork(w Worker, setupPending bool) (bool, string) {
	switch {
	case Retired(w):
		return false, "retired"
	case w.State != WorkerActive:
		return false, "state " + w.State
	case w.Phase == wire.PhaseSetup || w.Phase == wire.PhaseDraining || w.Phase == wire.PhaseTerminating:
		return false, "phase " + w.Phase
	case setupPending:
		return false, "setup commands pending"
	case w.CurrentInvocations >= w.MaxConcurrency:
		return false, "at capacity"
	default:
		return true, ""
	}
}

// Attempt records which worker ran one attempt of an invocation. The list
// of them is what lets a late ack from an earlier attempt's worker count,
// and what stops any other worker from acking.
type Attempt struct {
	Attempt   int       `dynamodbav:"attempt"`
	WorkerID  string    `dynamodbav:"worker_id"`
	ClaimedAt time.Time `dynamodbav:"claimed_at"`
}

// Invocation is the stored row of one submitted command.
type Invocation struct {
	ID              string            `dynamodbav:"invocation_id"`
	Queue           string            `dynamodbav:"queue"`
	State           string            `dynamodbav:"state"`
	Attempt         int               `dynamodbav:"attempt"`
	MaxAttempts     int               `dynamodbav:"max_attempts"`
	Argv            []string          `dynamodbav:"argv"`
	Env             map[string]string `dynamodbav:"env,omitempty"`
	RunConfig       wire.RunConfig    `dynamodbav:"run_config"`
	TimeoutS        int               `dynamodbav:"timeout_s,omitempty"`
	HostKey         string            `dynamodbav:"host_key,omitempty"`
	WorkerID        string            `dynamodbav:"worker_id,omitempty"`
	Attempts        []Attempt         `dynamodbav:"attempts,omitempty"`
	ExitCode        *int              `dynamodbav:"exit_code,omitempty"`
	ResultBlob      string            `dynamodbav:"result_blob,omitempty"`
	Error           *wire.ErrorInfo   `dynamodbav:"error,omitempty"`
	StdoutTail      string            `dynamodbav:"stdout_tail,omitempty"`
	StderrTail      string            `dynamodbav:"stderr_tail,omitempty"`
	CancelRequested bool              `dynamodbav:"cancel_requested,omitempty"`
	IdempotencyKey  string            `dynamodbav:"idempotency_key,omitempty"`
	CreatedAt       time.Time         `dynamodbav:"created_at"`
	StartedAt       time.Time         `dynamodbav:"started_at,omitempty"`
	FinishedAt      time.Time         `dynamodbav:"finished_at,omitempty"`
	Version         int64             `dynamodbav:"version"`
}

// HeldBy reports whether worker ran attempt n of inv.
func (inv Invocation) HeldBy(workerID string, n int) bool {
	for _, a := range inv.Attempts {
		if a.Attempt == n {
			return a.WorkerID == workerID
		}
	}
	return false
}

// AckRecords reports whether worker's ack of attempt n with outcome state
// is recorded (docs/states.md). The first succeeded or failed outcome of any
// attempt the worker ran wins, even a superseded one: the work was done.
// A cancelled outcome counts only from the attempt running now, and only
// after an operator asked for the cancel: an attempt the control plane
// stopped because it was superseded was never cancelled by anyone, and its
// invocation runs on elsewhere. Nothing is recorded on a terminal invocation.
func (inv Invocation) AckRecords(workerID string, n int, state string) bool {
	switch {
	case wire.Terminal(inv.State) || !inv.HeldBy(workerID, n):
		return false
	case state == wire.StateCancelled:
		return inv.CancelRequested && inv.Running(workerID) && inv.Attempt == n
	default:
		return true
	}
}

// CancelReason reports why worker, which says it runs inv, must stop it
// ("" when it may run on): wire.CancelOperator when an operator cancelled
// the attempt it runs, wire.CancelSuperseded when that attempt no longer
// counts (handed to another attempt or worker, or an outcome already won).
func (inv Invocation) CancelReason(workerID string) string {
	switch {
	case !inv.Running(workerID):
		return wire.CancelSuperseded
	case inv.CancelRequested:
		return wire.CancelOperator
	default:
		return ""
	}
}

// Running reports whether inv is running its current attempt on worker.
func (inv Invocation) Running(workerID string) bool {
	return inv.State == wire.StateRunning && inv.WorkerID == workerID
}

// SetupCommand is one entry of a worker's setup FIFO, kept after it runs as
// its history.
type SetupCommand struct {
	WorkerID   string    `dynamodbav:"worker_id"`
	CommandID  string    `dynamodbav:"command_id"`
	Argv       []string  `dynamodbav:"argv"`
	Status     string    `dynamodbav:"status"`
	ExitCode   *int      `dynamodbav:"exit_code,omitempty"`
	DurationMS int64     `dynamodbav:"duration_ms,omitempty"`
	OutputTail string    `dynamodbav:"output_tail,omitempty"`
	CreatedAt  time.Time `dynamodbav:"created_at"`
	FinishedAt time.Time `dynamodbav:"finished_at,omitempty"`
}
