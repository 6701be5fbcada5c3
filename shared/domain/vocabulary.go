package domain

import (
	"errors"
	"fmt"
	"regexp"
)

// The words of the lifecycle. Their values are the ones the wire API and
// the tables use, so the edges map them by value; docs/states.md draws them.

// InvocationState is where an invocation is in its lifecycle. A worker's
// outcome also carries one (succeeded or failed), or AckRequeued.
type InvocationState string

// Invocation states.
const (
	StateQueued    InvocationState = "queued"
	StateRunning   InvocationState = "running"
	StateSucceeded InvocationState = "succeeded"
	StateFailed    InvocationState = "failed"
	StateCancelled InvocationState = "cancelled"
)

// queueName starts with a letter or digit: a name of dots only ("." or "..")
// would be eaten as a path segment in GET /v1/queues/{queue}.
var queueName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// ValidQueue reports whether q is a well-formed queue name.
func ValidQueue(q string) bool { return queueName.MatchString(q) }

// InvocationStates lists every invocation state, in lifecycle order.
var InvocationStates = []InvocationState{StateQueued, StateRunning, StateSucceeded, StateFailed, StateCancelled}

// QueueStats are a queue's counts by state (queued and running: the live
// work; succeeded, failed, cancelled: totals since the queue began) and
// DoneCount, the terminal transitions, each counted once.
type QueueStats struct {
	Queue     string
	Counts    map[InvocationState]int
	DoneCount int
}

// Terminal reports whether s is final.
func (s InvocationState) Terminal() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCancelled
}

// AckRequeued is the state of a worker's report that hands an attempt
// back: its body asked to be queued again during a drain. It is not an
// invocation state: an invocation is never stored in it.
const AckRequeued InvocationState = "requeued"

// Phase is a daemon's phase (docs/design.md §6), as its poll reports it;
// "" when it reported none (a daemon older than phases).
type Phase string

// Daemon phases.
const (
	PhaseSetup       Phase = "setup"
	PhaseReady       Phase = "ready"
	PhaseDraining    Phase = "draining"
	PhaseTerminating Phase = "terminating"
)

// The commands a poll answers a daemon with (Command.Type).
const (
	CommandRun    = "run"
	CommandSetup  = "setup"
	CommandCancel = "cancel"
	CommandDrain  = "drain"
	CommandAdopt  = "adopt"
)

// Command is one instruction a poll answers a daemon with: run an
// invocation (Run), run a setup command (CommandID, Argv), stop an attempt
// (InvocationID, Reason), drain, or adopt a host key (HostKey, HostSetup).
type Command struct {
	Type         string
	Run          *Invocation
	CommandID    string
	Argv         []string
	InvocationID string
	Reason       string // a cancel's: CancelOperator or CancelSuperseded
	HostKey      string
	HostSetup    []string
}

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
	// Resident bodies run on warm processes that serve invocation after
	// invocation (docs/warm.md).
	Resident bool
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

// Kind classifies why an operation failed: a refused transition, or what
// the store and the use cases report. The HTTP edge alone maps it to an
// answer (shared/wire's code table).
type Kind int

// The kinds of failure.
const (
	KindInvalid      Kind = iota + 1 // the request makes no sense for any state
	KindConflict                     // the state forbids the change, or it changed since read
	KindForbidden                    // the actor may not make this change
	KindGone                         // the worker is gone: it must say hello again
	KindNotFound                     // no such record
	KindUnauthorized                 // the credential is not valid
	KindUnavailable                  // the store did not answer: try again
	KindInternal                     // a bug, or a failure no caller can act on
)

// Error is a refused transition, or a failure of a kind the edge answers.
type Error struct {
	Kind    Kind
	Message string
	// Reason says more than the kind, for a client to act on (GoneReplaced).
	Reason string
	// Err is the cause, for the log; never answered.
	Err error
}

// Errorf returns an *Error of kind with a formatted message.
func Errorf(kind Kind, format string, args ...any) *Error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

func (e *Error) Unwrap() error { return e.Err }

// GoneReplaced: the worker is gone because a hello from another boot of its
// machine replaced it.
const GoneReplaced = "replaced"

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Message + ": " + e.Err.Error()
	}
	return e.Message
}

// Sentinel is an error that stands for every error of one kind in
// errors.Is: this package's sentinels, and the wire API's (whose codes map
// to kinds), so a caller may test a store error against either.
type Sentinel interface {
	SentinelKind() (Kind, bool)
}

// SentinelKind reports e's kind, and whether e is a sentinel (no message).
func (e *Error) SentinelKind() (Kind, bool) { return e.Kind, e.Message == "" }

// Is reports whether target is a sentinel of the same kind (ErrConflict…).
func (e *Error) Is(target error) bool {
	t, ok := target.(Sentinel)
	if !ok {
		return false
	}
	k, sentinel := t.SentinelKind()
	return sentinel && k == e.Kind
}

// Sentinels for errors.Is: each matches every *Error of its kind.
var (
	ErrInvalid   = &Error{Kind: KindInvalid}
	ErrConflict  = &Error{Kind: KindConflict}
	ErrForbidden = &Error{Kind: KindForbidden}
	ErrGone      = &Error{Kind: KindGone}
	ErrNotFound  = &Error{Kind: KindNotFound}
)

// Interrupted is the error of a request whose context ended (its client
// went away, or its time ran out) while err was its cause: unavailable, so
// the caller may try again.
func Interrupted(err error) *Error {
	return &Error{Kind: KindUnavailable, Message: "request cancelled or timed out", Err: err}
}

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
