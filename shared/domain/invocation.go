package domain

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/dreamlake/lakeshore/shared/hostkey"
)

// Attempt records which worker ran one attempt of an invocation and how
// the attempt ended. The list of them is what lets a late ack from an
// earlier attempt's worker count, what stops any other worker from acking,
// and the attempt history an operator reads (docs/states.md).
type Attempt struct {
	Attempt   int
	WorkerID  string
	ClaimedAt time.Time
	// EndedAt is when the attempt ended: its outcome was recorded, or it
	// was taken back from its worker. Zero while it runs.
	EndedAt time.Time
	// Outcome is how it ended: an outcome's state (succeeded, failed,
	// cancelled) or why it was taken back (an End* kind). "" while it runs.
	Outcome  string
	ExitCode *int
	// Reason says more: the loss, an error's type and message.
	Reason string
	// Recorded marks the attempt whose outcome is the invocation's.
	Recorded bool
	// Retried marks a failed attempt the retry policy ran again.
	Retried bool
	// Artifacts are what its body published (docs/artifacts.md), one
	// record per name.
	Artifacts []Artifact
}

// RetryPolicy is an invocation's opt-in retry of a failing body (the
// default, none, retries only attempts whose worker was lost). A failed
// outcome with one of ExitCodes (an exit status, or 128+n for a signal),
// or past timeout_s when Timeout is set, queues the invocation again while
// attempts remain, after a backoff: BackoffS, doubling each retry, at most
// MaxRetryBackoff.
type RetryPolicy struct {
	ExitCodes []int
	Timeout   bool
	BackoffS  int
}

// MaxRetryBackoff caps the wait before a retry.
const MaxRetryBackoff = 15 * time.Minute

// Error types of a worker's failed outcome that a retry policy matches.
const (
	ErrorTypeExitCode = "exit_code"
	ErrorTypeSignal   = "signal"
	ErrorTypeTimeout  = "timeout"
)

// retries reports whether policy p retries failed outcome o.
func (p *RetryPolicy) retries(o Outcome) bool {
	if p == nil || o.State != StateFailed || o.Error == nil {
		return false
	}
	switch o.Error.Type {
	case ErrorTypeTimeout:
		return p.Timeout
	case ErrorTypeExitCode, ErrorTypeSignal:
		return o.ExitCode != nil && slices.Contains(p.ExitCodes, *o.ExitCode)
	}
	return false
}

// backoff is the wait before retry n (0 for the first).
func (p *RetryPolicy) backoff(n int) time.Duration {
	d := time.Duration(p.BackoffS) * time.Second
	for range n {
		if d >= MaxRetryBackoff {
			break
		}
		d *= 2
	}
	return min(d, MaxRetryBackoff)
}

// Bounds on how often one invocation is handed out. An attempt its worker
// never received (EndUndelivered) does not spend one of max_attempts, up to
// FreeUndelivered of them; beyond that a worker that drops every run
// command spends attempts as a lost worker does. MaxHandOuts bounds the
// attempts of one invocation in all, reruns included: its history lives on
// its row, and attempt numbers on the wire stay below it.
const (
	FreeUndelivered = 20
	MaxHandOuts     = 100
)

// EndKind is how an attempt that has no recorded outcome ended
// (Attempt.Outcome), and how a worker was retired (Worker.GoneKind).
type EndKind string

// End kinds.
const (
	EndStale       EndKind = "stale"       // its worker went silent past the stale window
	EndGone        EndKind = "gone"        // its worker is gone: a new boot, its host stopped or terminated
	EndBye         EndKind = "bye"         // its worker said bye while it ran
	EndOmitted     EndKind = "omitted"     // its worker's poll no longer listed it
	EndUndelivered EndKind = "undelivered" // its worker never received it: no poll since its claim listed it
	EndSuperseded  EndKind = "superseded"  // another attempt's outcome was recorded first
	EndRequeued    EndKind = "requeued"    // its body asked to be handed back as its worker drained (AckRequeued)
)

// Loss says why a worker's attempt was taken back: Kind is an End* kind,
// Why the words for logs and the history.
type Loss struct {
	Kind EndKind
	Why  string
}

func (l Loss) String() string {
	if l.Why == "" {
		return string(l.Kind)
	}
	return l.Why
}

// attemptIndex reports the index of attempt n in inv's history, or -1.
func (inv Invocation) attemptIndex(n int) int {
	return slices.IndexFunc(inv.Attempts, func(a Attempt) bool { return a.Attempt == n })
}

// Invocation is the stored row of one submitted command.
type Invocation struct {
	ID          string
	Queue       string
	State       InvocationState
	Attempt     int
	MaxAttempts int
	Argv        []string
	Env         map[string]string
	// Input is the body's input as compact JSON ("" for none).
	Input     string
	RunConfig RunConfig
	TimeoutS  int
	HostKey   string
	WorkerID  string
	Attempts  []Attempt
	// Retry is the opt-in retry policy (nil: none).
	Retry *RetryPolicy
	// RetryAt, while set, is when a retried invocation becomes claimable:
	// it is queued but waits out its backoff (ReleaseRetry).
	RetryAt         time.Time
	ExitCode        *int
	ResultBlob      string
	Error           *ErrorInfo
	StdoutTail      string
	StderrTail      string
	CancelRequested bool
	IdempotencyKey  string
	// RunID and RunIndex name the run it is job RunIndex of ("": none).
	RunID      string
	RunIndex   int
	CreatedAt  time.Time
	StartedAt  time.Time
	FinishedAt time.Time
	Version    int64
}

// CountedAttempt reports the attempt whose outcome is inv's (0: none yet,
// or it ended without one: cancelled while queued, lost max_attempts times).
func (inv Invocation) CountedAttempt() int {
	for _, a := range inv.Attempts {
		if a.Recorded {
			return a.Attempt
		}
	}
	return 0
}

// HeldBy reports whether worker ran attempt n of inv.
func (inv Invocation) HeldBy(workerID string, n int) bool {
	i := inv.attemptIndex(n)
	return i >= 0 && inv.Attempts[i].WorkerID == workerID
}

// AckRecords reports whether worker's ack of attempt n with outcome state
// is recorded (docs/states.md). The first succeeded or failed outcome of any
// attempt the worker ran wins, even a superseded one: the work was done.
// A cancelled outcome counts only from the attempt running now, and only
// after an operator asked for the cancel: an attempt the control plane
// stopped because it was superseded was never cancelled by anyone, and its
// invocation runs on elsewhere. Nothing is recorded on a terminal invocation.
func (inv Invocation) AckRecords(workerID string, n int, state InvocationState) bool {
	switch {
	case inv.State.Terminal() || !inv.HeldBy(workerID, n):
		return false
	case state == StateCancelled:
		return inv.CancelRequested && inv.Running(workerID) && inv.Attempt == n
	default:
		return true
	}
}

// CancelReason reports why worker, which says it runs inv, must stop it
// ("" when it may run on): CancelOperator when an operator cancelled
// the attempt it runs, CancelSuperseded when that attempt no longer
// counts (handed to another attempt or worker, or an outcome already won).
func (inv Invocation) CancelReason(workerID string) string {
	switch {
	case !inv.Running(workerID):
		return CancelSuperseded
	case inv.CancelRequested:
		return CancelOperator
	default:
		return ""
	}
}

// ClaimableSince reports when inv, running its latest attempt, last became
// claimable: when it was submitted, or when its previous attempt was taken
// back. Its claim time minus this is how long it waited for a worker.
func (inv Invocation) ClaimableSince() time.Time {
	if n := len(inv.Attempts); n >= 2 && !inv.Attempts[n-2].EndedAt.IsZero() {
		return inv.Attempts[n-2].EndedAt
	}
	return inv.CreatedAt
}

// Undelivered reports whether inv's running attempt never reached its
// worker, whose poll now omits it: the worker's poll before this one did
// not list it either (priorListed, Worker.Listed). A daemon lists what it
// receives in its very next poll, and keeps listing it until its ack is
// answered; a poll that omits what it held then is the first not to list
// it. So an attempt the prior poll listed was received (its body ran, and
// its warm process died or its ack was refused): it counts. One it did not
// list was claimed for that poll or later, and its answer was lost.
func (inv Invocation) Undelivered(priorListed []string) bool {
	return inv.State == StateRunning && !slices.Contains(priorListed, inv.ID)
}

// Running reports whether inv is running its current attempt on worker.
func (inv Invocation) Running(workerID string) bool {
	return inv.State == StateRunning && inv.WorkerID == workerID
}

// Spec is what an operator's submit asks for.
type Spec struct {
	Queue          string
	Argv           []string
	Env            map[string]string
	RunConfig      RunConfig
	TimeoutS       int
	MaxAttempts    int
	Retry          *RetryPolicy
	IdempotencyKey string
	// Input is the body's input as compact JSON ("" for none).
	Input string
	// RequestHash is what the idempotency key remembers of the request
	// that first used it ("" without a key): a replay under the key must
	// carry the same.
	RequestHash string
}

// NewInvocation reports the invocation spec makes at now, queued under id.
// Its host key is that of its host setup (docs/design.md §7): only a
// worker that ran the same setup may claim it.
func NewInvocation(id string, spec Spec, now time.Time) Invocation {
	return Invocation{
		ID:             id,
		Queue:          spec.Queue,
		State:          StateQueued,
		MaxAttempts:    spec.MaxAttempts,
		Argv:           spec.Argv,
		Env:            spec.Env,
		RunConfig:      spec.RunConfig,
		TimeoutS:       spec.TimeoutS,
		HostKey:        hostkey.Of(spec.RunConfig.HostSetup),
		Retry:          spec.Retry,
		IdempotencyKey: spec.IdempotencyKey,
		Input:          spec.Input,
		CreatedAt:      now,
	}
}

// Claim reports inv handed to worker w at now as its next attempt: running
// on w, attempt + 1, the attempt recorded in its history. Only a queued
// invocation can be claimed, and one with a host key only by a worker that
// advertises that key; otherwise the answer is a conflict and inv stays.
func (inv Invocation) Claim(w Worker, now time.Time) (Invocation, error) {
	if inv.State != StateQueued {
		return inv, refuse(KindConflict, "invocation %s is %s, not queued", inv.ID, inv.State)
	}
	if !inv.RetryAt.IsZero() {
		return inv, refuse(KindConflict, "invocation %s waits to be retried at %s", inv.ID, inv.RetryAt.Format(time.RFC3339))
	}
	if inv.HostKey != "" && inv.HostKey != w.HostKey {
		return inv, refuse(KindConflict, "invocation %s needs host key %s; worker %s has %q", inv.ID, inv.HostKey, w.ID, w.HostKey)
	}
	next := inv
	next.State = StateRunning
	next.Attempt = inv.Attempt + 1
	next.WorkerID = w.ID
	next.StartedAt = now
	next.Attempts = append(slices.Clone(inv.Attempts), Attempt{Attempt: next.Attempt, WorkerID: w.ID, ClaimedAt: now})
	return next, nil
}

// Outcome is what a worker reports for one attempt it ran.
type Outcome struct {
	InvocationID string
	WorkerID     string
	Attempt      int
	State        InvocationState // succeeded, failed, cancelled or requeued (AckRequeued)
	ExitCode     *int
	ResultBlob   string // JSON, "" for none
	Error        *ErrorInfo
	StdoutTail   string
	StderrTail   string
	// Phase is the daemon's phase when it reported ("" from a daemon that
	// sends none); it decides whether a requeued report may hand the
	// attempt back (Worker.MayHandBack).
	Phase Phase
}

// Record reports inv with outcome o recorded at now, and whether o counts
// (AckRecords): the first succeeded or failed outcome of any attempt wins;
// a cancelled one only when an operator cancelled the attempt running now.
// An outcome that does not count leaves inv as it is (a recorded no-op). A
// worker that did not run o's attempt may not report it (forbidden).
//
// The history shows o's attempt ended with o (Recorded), and an attempt
// still running elsewhere as superseded: its worker is told to stop.
func (inv Invocation) Record(o Outcome, now time.Time) (Invocation, bool, error) {
	if !o.State.Terminal() && o.State != AckRequeued {
		return inv, false, refuse(KindInvalid, "outcome state %q is not succeeded, failed, cancelled or requeued", o.State)
	}
	if !inv.HeldBy(o.WorkerID, o.Attempt) {
		return inv, false, refuse(KindForbidden, "attempt %d of %s was not run by %s", o.Attempt, inv.ID, o.WorkerID)
	}
	if o.State == AckRequeued {
		next, changed := inv.handBack(o, now)
		return next, changed, nil
	}
	if !inv.AckRecords(o.WorkerID, o.Attempt, o.State) {
		return inv, false, nil
	}
	if inv.retryFor(o) {
		return inv.retry(o, now), true, nil
	}
	next := inv
	next.State = o.State
	next.ExitCode = o.ExitCode
	next.ResultBlob = o.ResultBlob
	next.Error = o.Error
	next.WorkerID = o.WorkerID // the worker whose outcome won
	next.StdoutTail, next.StderrTail = o.StdoutTail, o.StderrTail
	next.FinishedAt = now
	next.Attempts = slices.Clone(inv.Attempts)
	if inv.State == StateRunning && inv.Attempt != o.Attempt {
		next.end(inv.Attempt, string(EndSuperseded), fmt.Sprintf("attempt %d's outcome was recorded first", o.Attempt), now)
	}
	a := &next.Attempts[next.attemptIndex(o.Attempt)]
	var why []string
	if o.Error != nil {
		why = append(why, o.Error.String())
	}
	if a.Outcome != "" {
		why = append(why, fmt.Sprintf("reported after the attempt was taken back (%s)", a.Outcome))
	}
	a.Reason = strings.Join(why, "; ")
	a.Outcome, a.ExitCode, a.Recorded, a.EndedAt = string(o.State), o.ExitCode, true, now
	return next, true, nil
}

// handBack reports inv after worker's report that its body asked, during
// a drain, to be queued again (AckRequeued), and whether it counts: only
// for the attempt running now. It is handed back as a lost worker's
// attempt is (Requeue): queued again for attempt + 1, cancelled if an
// operator's cancel was pending, failed once max_attempts is spent. The
// history shows the attempt ended requeued, with its exit status.
func (inv Invocation) handBack(o Outcome, now time.Time) (Invocation, bool) {
	if !inv.Running(o.WorkerID) || inv.Attempt != o.Attempt {
		return inv, false
	}
	why := fmt.Sprintf("its body asked to be handed back as worker %s drained", o.WorkerID)
	if o.Error != nil && o.Error.Message != "" {
		why += " (" + o.Error.Message + ")"
	}
	next, changed := inv.Requeue(o.WorkerID, Loss{Kind: EndRequeued, Why: why}, now)
	if changed {
		next.Attempts[next.attemptIndex(o.Attempt)].ExitCode = o.ExitCode
	}
	return next, changed
}

// retryFor reports whether outcome o, which counts, is retried instead of
// recorded: the policy matches it, it is the attempt running now, no
// operator asked to cancel, and attempts remain.
func (inv Invocation) retryFor(o Outcome) bool {
	return inv.Retry.retries(o) && inv.Running(o.WorkerID) && inv.Attempt == o.Attempt &&
		!inv.CancelRequested && inv.Attempt < inv.MaxAttempts
}

// retry reports inv queued again after failed outcome o at now: the
// history shows the attempt failed and retried, and the invocation waits
// out its backoff (RetryAt) before it can be claimed.
func (inv Invocation) retry(o Outcome, now time.Time) Invocation {
	retried := 0
	for _, a := range inv.Attempts {
		if a.Retried {
			retried++
		}
	}
	wait := inv.Retry.backoff(retried)
	next := inv
	next.State = StateQueued
	next.WorkerID = ""
	next.RetryAt = now.Add(wait)
	next.Attempts = slices.Clone(inv.Attempts)
	a := &next.Attempts[next.attemptIndex(o.Attempt)]
	a.Outcome, a.ExitCode, a.EndedAt, a.Retried = string(o.State), o.ExitCode, now, true
	a.Reason = fmt.Sprintf("%s; retried after %s (retry policy)", o.Error, wait)
	return next
}

// ReleaseRetry reports inv claimable again once its retry backoff has
// passed at now, and whether that changes it.
func (inv Invocation) ReleaseRetry(now time.Time) (Invocation, bool) {
	if inv.State != StateQueued || inv.RetryAt.IsZero() || now.Before(inv.RetryAt) {
		return inv, false
	}
	next := inv
	next.RetryAt = time.Time{}
	return next, true
}

// Rerun reports failed inv queued again at an operator's ask (a run's
// retry of its failed jobs), and whether that changes it: its failure no
// longer counts (the attempt that recorded it reads retried, not recorded),
// and it gets its max_attempts again on top of the attempts it used, up to
// MaxHandOuts in all. Only a failed invocation with hand-outs left is
// rerun; any other is left as it is.
func (inv Invocation) Rerun(now time.Time) (Invocation, bool) {
	if inv.State != StateFailed {
		return inv, false
	}
	if inv.Attempt >= MaxHandOuts {
		return inv, false
	}
	next := inv
	next.State = StateQueued
	next.MaxAttempts = min(inv.Attempt+inv.MaxAttempts, MaxHandOuts)
	next.WorkerID = ""
	next.ExitCode, next.ResultBlob, next.Error = nil, "", nil
	next.StdoutTail, next.StderrTail = "", ""
	next.FinishedAt, next.RetryAt = time.Time{}, time.Time{}
	next.Attempts = slices.Clone(inv.Attempts)
	for i := range next.Attempts {
		if next.Attempts[i].Recorded {
			next.Attempts[i].Recorded, next.Attempts[i].Retried = false, true
		}
	}
	return next, true
}

// end records in next's history (a clone the caller owns) that attempt n
// ended at now as outcome, for reason. An attempt already ended keeps how.
func (next *Invocation) end(n int, outcome, reason string, now time.Time) {
	i := next.attemptIndex(n)
	if i < 0 || next.Attempts[i].Outcome != "" {
		return
	}
	next.Attempts[i].Outcome, next.Attempts[i].Reason, next.Attempts[i].EndedAt = outcome, reason, now
}

// Cancel reports inv after an operator's cancel at now, and whether that
// changes it: a queued invocation is cancelled at once (terminal); a
// running one is flagged, so its worker's next poll carries a cancel
// command and its cancelled outcome counts. A finished one is a conflict.
func (inv Invocation) Cancel(now time.Time) (Invocation, bool, error) {
	switch {
	case inv.State.Terminal():
		return inv, false, refuse(KindConflict, "invocation %s is already %s", inv.ID, inv.State)
	case inv.State == StateRunning && inv.CancelRequested:
		return inv, false, nil
	}
	next := inv
	next.CancelRequested = true
	if inv.State == StateQueued {
		next.State = StateCancelled
		next.FinishedAt = now
		next.Error = &ErrorInfo{Type: ErrorTypeCancelled, Message: "cancelled by an operator before it ran"}
	}
	return next, true, nil
}

// Requeue reports inv with the attempt running on worker handed back at now
// (the worker was lost, for loss; the history shows how the attempt
// ended), and whether that changes it: queued
// again (its next claim is attempt + 1); failed with error type
// worker_lost once max_attempts is spent; cancelled if an operator's
// cancel was pending. An attempt its worker never received
// (EndUndelivered: the poll's answer was lost, as an overloaded control
// plane loses them) is given back: max_attempts grows by one, for up to
// FreeUndelivered such attempts. No invocation is handed out more than
// MaxHandOuts times. An invocation no longer running that worker's attempt
// is left as it is.
func (inv Invocation) Requeue(workerID string, loss Loss, now time.Time) (Invocation, bool) {
	if !inv.Running(workerID) {
		return inv, false
	}
	next := inv
	next.WorkerID = ""
	next.Attempts = slices.Clone(inv.Attempts)
	next.end(inv.Attempt, string(loss.Kind), loss.Why, now)
	switch {
	case inv.CancelRequested:
		next.State = StateCancelled
		next.FinishedAt = now
		next.Error = &ErrorInfo{Type: ErrorTypeCancelled, Message: "cancelled; its worker was lost before it confirmed"}
	case inv.Attempt >= MaxHandOuts:
		next.fail(now, fmt.Sprintf("handed out %d times, the most one invocation may be; the last ended: %s", inv.Attempt, loss))
	case loss.Kind == EndUndelivered && next.undelivered() <= FreeUndelivered:
		// Its worker never received it, so the attempt is given back.
		next.State = StateQueued
		next.MaxAttempts = inv.MaxAttempts + 1
	case inv.Attempt >= inv.MaxAttempts:
		msg := fmt.Sprintf("worker %s was lost (%s) on attempt %d of %d", workerID, loss, inv.Attempt, inv.MaxAttempts)
		switch loss.Kind {
		case EndRequeued:
			msg = fmt.Sprintf("%s on attempt %d of %d; no attempt left to hand it to", loss, inv.Attempt, inv.MaxAttempts)
		case EndUndelivered:
			msg = fmt.Sprintf("worker %s never received attempt %d of %d, and the %d earlier hand-outs its workers never received were given back already",
				workerID, inv.Attempt, inv.MaxAttempts, FreeUndelivered)
		}
		next.fail(now, msg)
	default:
		next.State = StateQueued
	}
	return next, true
}

// fail ends next (a clone the caller owns) at now as failed with error
// type worker_lost: no attempt is left to hand it to.
func (next *Invocation) fail(now time.Time, msg string) {
	next.State = StateFailed
	next.FinishedAt = now
	next.Error = &ErrorInfo{Type: ErrorTypeWorkerLost, Message: msg}
}

// undelivered counts the attempts in inv's history that ended because
// their worker never received them (EndUndelivered).
func (inv Invocation) undelivered() int {
	n := 0
	for _, a := range inv.Attempts {
		if a.Outcome == string(EndUndelivered) {
			n++
		}
	}
	return n
}
