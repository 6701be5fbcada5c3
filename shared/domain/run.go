package domain

import (
	"maps"
	"strconv"
	"strings"
	"time"
)

// MaxRunJobs is the most jobs one run holds. A run is submitted in one
// request, so its jobs must fit a Lambda's request payload (6 MB) and be
// written within API Gateway's 29 s (docs/runs.md).
const MaxRunJobs = 10_000

// RunState is where a run is, computed on read (Run.State).
type RunState string

// Run states.
const (
	RunSubmitting RunState = "submitting" // its jobs are still being written
	RunRunning    RunState = "running"    // every job written, not every one terminal
	RunDone       RunState = "done"       // every job terminal: Done == Total
)

// RunStates lists every run state, in lifecycle order.
var RunStates = []RunState{RunSubmitting, RunRunning, RunDone}

// RunCounts are a run's terminal jobs, each counted once, in the
// transaction that recorded its outcome (as a queue's counters are).
type RunCounts struct {
	Done, Succeeded, Failed, Cancelled int
}

// Run is a run of many jobs on one queue (docs/runs.md): each job is an
// ordinary invocation whose id is derived from the run's and its index.
type Run struct {
	ID    string
	Queue string
	Name  string
	Total int
	// Submitted: every job is written. Until then the run reads
	// submitting, and a replay of its submit writes what is missing.
	Submitted bool
	// CancelRequested: an operator cancelled the run; a replay of its
	// submit cancels the jobs it writes too.
	CancelRequested bool
	IdempotencyKey  string
	RequestHash     string
	CreatedAt       time.Time
	Counts          RunCounts
	Version         int64
}

// State reports where r is: submitting until every job is written, done
// once every job is terminal, running in between.
func (r Run) State() RunState {
	switch {
	case !r.Submitted:
		return RunSubmitting
	case r.Counts.Done >= r.Total:
		return RunDone
	default:
		return RunRunning
	}
}

// Axis is one named axis of a run's matrix and the value a job takes on it.
type Axis struct {
	Name, Value string
}

// RunJob is one job of a run's submit: the invocation it asks for, and
// its values on the matrix's axes (none for a run of listed jobs).
type RunJob struct {
	Spec Spec
	Axes []Axis
}

// RunSpec is what a run's submit asks for: its jobs, in index order.
type RunSpec struct {
	Queue          string
	Name           string
	Jobs           []RunJob
	IdempotencyKey string
	// RequestHash is what the idempotency key remembers of the request.
	RequestHash string
}

// NewRun reports the run spec makes at now under id (not yet submitted).
func NewRun(id string, spec RunSpec, now time.Time) Run {
	return Run{ID: id, Queue: spec.Queue, Name: spec.Name, Total: len(spec.Jobs),
		IdempotencyKey: spec.IdempotencyKey, RequestHash: spec.RequestHash, CreatedAt: now}
}

// Environment a run's job sees besides its own.
const (
	EnvRunID        = "LAKESHORE_RUN_ID"
	EnvRunIndex     = "LAKESHORE_RUN_INDEX"
	EnvMatrixPrefix = "LAKESHORE_MATRIX_" // + the axis name, upper-cased
)

// Job reports the invocation that is job n of r, queued under id at now:
// job's spec, with LAKESHORE_RUN_ID, LAKESHORE_RUN_INDEX and one
// LAKESHORE_MATRIX_<AXIS> per axis in its environment (over the job's own
// variables of those names).
func (r Run) Job(id string, n int, job RunJob, now time.Time) Invocation {
	spec := job.Spec
	spec.Env = maps.Clone(spec.Env)
	if spec.Env == nil {
		spec.Env = map[string]string{}
	}
	spec.Env[EnvRunID] = r.ID
	spec.Env[EnvRunIndex] = strconv.Itoa(n)
	for _, a := range job.Axes {
		spec.Env[EnvMatrixPrefix+strings.ToUpper(a.Name)] = a.Value
	}
	spec.IdempotencyKey, spec.RequestHash = "", ""
	inv := NewInvocation(id, spec, now)
	inv.RunID, inv.RunIndex = r.ID, n
	return inv
}
