package domain

import (
	"errors"
	"fmt"
)

// The words of the lifecycle. Their values are the ones the wire API and
// the tables use, so the edges map them by value; docs/states.md draws them.

// Invocation states.
const (
	StateQueued    = "queued"
	StateRunning   = "running"
	StateSucceeded = "succeeded"
	StateFailed    = "failed"
	StateCancelled = "cancelled"
)

// Terminal reports whether an invocation state is final.
func Terminal(state string) bool {
	return state == StateSucceeded || state == StateFailed || state == StateCancelled
}

// AckRequeued is the state of a worker's report that hands an attempt
// back: its body asked to be queued again during a drain. It is not an
// invocation state.
const AckRequeued = "requeued"

// Daemon phases (docs/design.md §6), as its poll reports them.
const (
	PhaseSetup       = "setup"
	PhaseReady       = "ready"
	PhaseDraining    = "draining"
	PhaseTerminating = "terminating"
)

// Why a worker is told to stop an attempt.
const (
	CancelOperator   = "operator"   // an operator cancelled the invocation
	CancelSuperseded = "superseded" // the attempt no longer counts: handed to another attempt, or an outcome already won
)

// Setup command statuses. A command is pending until the daemon reports it.
const (
	SetupPending   = "pending"
	SetupSucceeded = "succeeded"
	SetupFailed    = "failed"
)

// Error types the control plane itself writes into an invocation's error.
const (
	ErrorTypeWorkerLost = "worker_lost" // its worker was lost max_attempts times
	ErrorTypeCancelled  = "cancelled"   // an operator cancelled it
)

// RunConfig is how an invocation is run: host setup selects the host (by
// its key), run setup runs before the body in its workdir.
type RunConfig struct {
	HostSetup []string
	RunSetup  []string
	Env       map[string]string
	Workdir   string
	// DrainSignal and RequeueExitCodes are how a body hears a drain and
	// asks to be handed back (docs/lifecycle.md).
	DrainSignal      string
	RequeueExitCodes []int
}

// ErrorInfo is an invocation's error: a type an operator can group by and
// a human message.
type ErrorInfo struct {
	Type    string
	Message string
}

// String reads "type: message", or the type alone.
func (e ErrorInfo) String() string {
	if e.Message == "" {
		return e.Type
	}
	return e.Type + ": " + e.Message
}

// SetupResult is one finished setup command as its daemon reported it: a
// control-plane command (CommandID) or one of its own host-setup commands
// (Command holds its shell text).
type SetupResult struct {
	CommandID  string
	Command    string
	Status     string
	ExitCode   int
	DurationMS int64
	OutputTail string
}

// Kind classifies why a transition was refused; the edges (the store's
// callers, the API) map it to an answer.
type Kind int

// The kinds of refusal.
const (
	KindInvalid   Kind = iota + 1 // the request makes no sense for any state
	KindConflict                  // the state forbids the change
	KindForbidden                 // the actor may not make this change
	KindGone                      // the worker is gone: it must say hello again
)

// Error is a refused transition.
type Error struct {
	Kind    Kind
	Message string
	// Reason says more than the kind, for a client to act on (GoneReplaced).
	Reason string
}

// GoneReplaced: the worker is gone because a hello from another boot of its
// machine replaced it.
const GoneReplaced = "replaced"

func (e *Error) Error() string { return e.Message }

// Is reports whether target is a sentinel of the same kind (ErrConflict…).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Kind == e.Kind
}

// Sentinels for errors.Is: each matches every *Error of its kind.
var (
	ErrInvalid   = &Error{Kind: KindInvalid}
	ErrConflict  = &Error{Kind: KindConflict}
	ErrForbidden = &Error{Kind: KindForbidden}
	ErrGone      = &Error{Kind: KindGone}
)

func refuse(kind Kind, format string, args ...any) *Error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// KindOf reports the kind of a refused transition in err's chain (0: none).
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return 0
}
