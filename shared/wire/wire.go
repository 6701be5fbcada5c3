// Package wire holds the JSON contract of the control plane (docs/design.md §3):
// every request and answer as a plain tagged struct, the validation each
// request gets before any store call, and the error codes. Unknown fields are
// ignored and every field added later is optional, so old daemons and old
// control planes keep talking.
package wire

import (
	"encoding/json"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// Invocation states. The lifecycle's words are the domain's
// (shared/domain), whose types name them; the wire sends their values as
// plain strings.
const (
	StateQueued    = string(domain.StateQueued)
	StateRunning   = string(domain.StateRunning)
	StateSucceeded = string(domain.StateSucceeded)
	StateFailed    = string(domain.StateFailed)
	StateCancelled = string(domain.StateCancelled)
)

// InvocationStates lists every invocation state, in lifecycle order.
var InvocationStates = strs(domain.InvocationStates)

// Listing orders GET /v1/invocations takes as order=: by id, which is by
// creation time (ids are ULIDs).
const (
	OrderOldest = "oldest"
	OrderNewest = "newest"
)

// WorkerStates lists every state a worker reads (stored, and the computed
// stale), as GET /v1/workers?state= takes them.
var WorkerStates = strs(domain.WorkerStates)

// strs lists a domain vocabulary's words as the strings the wire sends.
func strs[S ~string](words []S) []string {
	out := make([]string, len(words))
	for i, w := range words {
		out[i] = string(w)
	}
	return out
}

// Terminal reports whether an invocation state is final.
func Terminal(state string) bool { return domain.InvocationState(state).Terminal() }

// Daemon phases (docs/design.md §6). Booting is never sent.
const (
	PhaseBooting     = "booting"
	PhaseSetup       = string(domain.PhaseSetup)
	PhaseReady       = string(domain.PhaseReady)
	PhaseDraining    = string(domain.PhaseDraining)
	PhaseTerminating = string(domain.PhaseTerminating)
)

// Bye reasons.
const (
	ByeIdle             = "idle"
	ByeSignal           = "signal"
	ByeDrain            = "drain"
	ByeHelloFailed      = "hello_failed"
	ByeSpotInterruption = "spot_interruption"
)

// Command types in a poll answer.
const (
	CommandRun    = domain.CommandRun
	CommandSetup  = domain.CommandSetup
	CommandCancel = domain.CommandCancel
	CommandDrain  = domain.CommandDrain
	// CommandAdopt asks an idle generic worker that said hello with
	// adopt_host_setup to run host_setup and advertise host_key from then
	// on (docs/provision.md, "Adopting a host key").
	CommandAdopt = domain.CommandAdopt
)

// Why a cancel command was sent. Only an operator's cancel can make an
// invocation cancelled; a superseded attempt's cancelled ack is a no-op.
const (
	CancelOperator   = domain.CancelOperator   // an operator cancelled the invocation
	CancelSuperseded = domain.CancelSuperseded // this attempt no longer counts: handed to another attempt, or an outcome already won
)

// Setup command statuses. A command is pending until the daemon reports it.
const (
	SetupPending   = domain.SetupPending
	SetupSucceeded = domain.SetupSucceeded
	SetupFailed    = domain.SetupFailed
)

// Error types the control plane itself writes into an invocation's error.
const (
	ErrorTypeWorkerLost = domain.ErrorTypeWorkerLost
	ErrorTypeTimeout    = domain.ErrorTypeTimeout
)

// Error types of a worker's failed outcome that a retry policy matches
// (RetryPolicy): the runner writes them, the control plane reads them.
const (
	ErrorTypeExitCode = domain.ErrorTypeExitCode
	ErrorTypeSignal   = domain.ErrorTypeSignal
)

// Capabilities is what a daemon says it can do. Hello carries the whole set;
// a poll's updated_capabilities carries what changed (current_invocations).
type Capabilities struct {
	MaxConcurrency     *int `json:"max_concurrency,omitempty"`
	CurrentInvocations *int `json:"current_invocations,omitempty"`
}

// HelloRequest is the body of POST /v1/daemon/hello.
type HelloRequest struct {
	MachineID    string            `json:"machine_id"`
	BootID       string            `json:"boot_id"`
	Label        string            `json:"label,omitempty"`
	Tags         map[string]string `json:"tags,omitempty"`
	Lanes        []string          `json:"lanes,omitempty"`
	Capabilities Capabilities      `json:"capabilities"`
	Versions     map[string]string `json:"versions,omitempty"`
	HostKey      string            `json:"host_key,omitempty"`
	// AdoptHostSetup: this generic daemon (no host key) may be asked to
	// run a queued invocation's host_setup and take on its key (an adopt
	// command).
	AdoptHostSetup bool `json:"adopt_host_setup,omitempty"`
}

// HelloResponse answers a hello.
type HelloResponse struct {
	WorkerID      string  `json:"worker_id"`
	Token         string  `json:"token"`
	StaleAfterS   float64 `json:"stale_after_s"`
	PollIntervalS float64 `json:"poll_interval_s"`
	// LongPollS, when set, is the timeout_s an idle daemon's polls may ask
	// for: the control plane holds such a poll until work it can claim
	// arrives, or that long. It equals poll_interval_s, so an idle daemon
	// that polls again as each answer comes still makes one request per
	// interval. Absent: this control plane does not hold polls (each one
	// costs what it is held for); poll every poll_interval_s.
	LongPollS float64 `json:"long_poll_s,omitempty"`
	// WakeURL, when set, is the control plane's wake channel: a WebSocket
	// the daemon may keep open (Authorization: Bearer <worker token>) to be
	// told "poll now" when work it can take arrives (WakeMessage). The HTTP
	// poll stays the heartbeat and the only way to claim; without the
	// socket everything works as before.
	WakeURL string `json:"wake_url,omitempty"`
	// WakePollIntervalS is how often an idle daemon whose wake socket is
	// open polls: the wake brings new work, so the poll only proves the
	// worker alive, at the cadence of a held poll (stale_after_s / 3, at
	// most 20 s). Set with wake_url.
	WakePollIntervalS float64 `json:"wake_poll_interval_s,omitempty"`
}

// WakeMessage is what the wake channel says to a daemon: WakeTypeWake
// (work for Queue arrived: poll now) or WakeTypePong (the answer to a
// WakePing, which shows the socket still works end to end).
type WakeMessage struct {
	Type  string `json:"type"`
	Queue string `json:"queue,omitempty"`
}

// WakeFor is the wake message telling a daemon that work for queue arrived
// ("": news of its own worker): poll now.
func WakeFor(queue string) []byte {
	b, _ := json.Marshal(WakeMessage{Type: WakeTypeWake, Queue: queue})
	return b
}

// Wake message types, and the keep-alive a daemon sends on its wake socket
// (API Gateway closes a socket after 10 idle minutes). Its "action" field
// is the WebSocket API's route selection key.
const (
	WakeTypeWake = "wake"
	WakeTypePong = "pong"
	WakePing     = `{"action":"ping"}`
)

// SetupResult reports one finished setup command: a control-plane command
// (CommandID names it) or one of the daemon's own --host-setup commands
// (no CommandID: the control plane never queued it; Command holds its shell
// text). Either field may be absent on the wire, never both.
type SetupResult struct {
	CommandID  string `json:"command_id,omitempty"`
	Command    string `json:"command,omitempty"`
	Status     string `json:"status"`
	ExitCode   int    `json:"exit_code"`
	DurationMS int64  `json:"duration_ms"`
	OutputTail string `json:"output_tail,omitempty"`
}

// PollRequest is the body of POST /v1/daemon/poll: the heartbeat.
//
// Invocations lists every invocation the daemon runs or has not yet had an
// ack answered for. A list that is present (even empty) is authoritative: a
// running invocation the control plane thinks this worker holds and that the
// list omits is handed out again (its run command was lost on the way). An
// absent (null) list is an old daemon's: nothing is inferred from it.
type PollRequest struct {
	WorkerID            string        `json:"worker_id"`
	Queue               string        `json:"queue,omitempty"`
	TimeoutS            float64       `json:"timeout_s,omitempty"`
	Invocations         []string      `json:"invocations,omitzero"`
	Phase               string        `json:"phase,omitempty"`
	HostKey             string        `json:"host_key,omitempty"`
	UpdatedCapabilities *Capabilities `json:"updated_capabilities,omitempty"`
	SetupResults        []SetupResult `json:"setup_results,omitempty"`
	// AdoptFailed names the host key an adopt command asked for whose host
	// setup failed on this daemon (its setup_results say how): it stays
	// generic, and is not asked for that key again.
	AdoptFailed string `json:"adopt_failed,omitempty"`
}

// RunConfig is how an invocation is run: host setup selects the host (by its
// key), run setup runs before the body in its workdir.
type RunConfig struct {
	HostSetup []string          `json:"host_setup,omitempty"`
	RunSetup  []string          `json:"run_setup,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	// Workdir is where run setup and the body start: relative to the run
	// directory, and inside it (ValidWorkdir); "" is the run directory.
	Workdir string `json:"workdir,omitempty"`
	// DrainSignal, when set, is sent to the body's process group as the
	// daemon starts to drain, at the start of the grace window (one of
	// DrainSignals; "" sends none). RequeueExitCodes are exit statuses by
	// which a body that ends during a drain asks to be handed back to the
	// queue instead of recorded (docs/lifecycle.md).
	DrainSignal      string `json:"drain_signal,omitempty"`
	RequeueExitCodes []int  `json:"requeue_exit_codes,omitempty"`
	// Resident makes the body resident: nymph keeps a warm process per
	// run config and hands it invocation after invocation through its
	// runtime API (NYMPH_RUNTIME_API), so state the process loaded stays
	// for the next body (docs/warm.md).
	Resident bool `json:"resident,omitempty"`
}

// DrainSignals are the signals run_config.drain_signal may name.
var DrainSignals = []string{"SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2"}

// AckRequeued is the ack state by which a worker hands an attempt back to
// the queue: its body asked for it during a drain (docs/lifecycle.md). It
// is not an invocation state: the invocation is queued again.
const AckRequeued = string(domain.AckRequeued)

// RunInvocation is the payload of a run command.
type RunInvocation struct {
	InvocationID string            `json:"invocation_id"`
	Attempt      int               `json:"attempt"`
	Argv         []string          `json:"argv"`
	Env          map[string]string `json:"env,omitempty"`
	RunConfig    RunConfig         `json:"run_config"`
	TimeoutS     int               `json:"timeout_s,omitempty"`
	HostKey      string            `json:"host_key,omitempty"`
	// Input is the invocation's input (compact JSON; absent: none): nymph
	// writes it to input.json in the run directory.
	Input json.RawMessage `json:"input,omitempty"`
}

// Command is one instruction in a poll answer; Type says which fields are set.
type Command struct {
	Type         string         `json:"type"`
	Invocation   *RunInvocation `json:"invocation,omitempty"`
	CommandID    string         `json:"command_id,omitempty"`
	Argv         []string       `json:"argv,omitempty"`
	InvocationID string         `json:"invocation_id,omitempty"`
	// Reason says why a cancel was sent: CancelOperator or CancelSuperseded.
	Reason string `json:"reason,omitempty"`
	// HostSetup and HostKey are an adopt command's: the commands to run,
	// and the key (hostkey.Of of them) to advertise once they succeed.
	HostSetup []string `json:"host_setup,omitempty"`
	HostKey   string   `json:"host_key,omitempty"`
}

// PollResponse answers a poll.
type PollResponse struct {
	Commands []Command `json:"commands"`
}

// ErrorInfo is an invocation's error: a type an operator can group by and a
// human message.
type ErrorInfo struct {
	Type    string `json:"type"`
	Message string `json:"message,omitempty"`
}

// AckRequest is the body of POST /v1/daemon/ack.
type AckRequest struct {
	WorkerID     string          `json:"worker_id"`
	InvocationID string          `json:"invocation_id"`
	Attempt      int             `json:"attempt"`
	State        string          `json:"state"`
	ExitCode     *int            `json:"exit_code,omitempty"`
	ResultBlob   json.RawMessage `json:"result_blob,omitempty"`
	Error        *ErrorInfo      `json:"error,omitempty"`
	StdoutTail   string          `json:"stdout_tail,omitempty"`
	StderrTail   string          `json:"stderr_tail,omitempty"`
	// Phase is the daemon's phase as it acks (setup, ready, draining,
	// terminating; omitted by a daemon that sends none). A requeued ack is
	// accepted only from a worker stored draining or one whose phase is
	// draining or terminating (docs/lifecycle.md); otherwise it is a 409.
	Phase string `json:"phase,omitempty"`
}

// AckResponse answers an ack. Recorded is false when an earlier outcome had
// already won; State is the invocation's state either way.
type AckResponse struct {
	Recorded bool   `json:"recorded"`
	State    string `json:"state"`
}

// ByeRequest is the body of POST /v1/daemon/bye.
type ByeRequest struct {
	WorkerID          string `json:"worker_id"`
	Reason            string `json:"reason"`
	InflightAbandoned int    `json:"inflight_abandoned"`
}

// SubmitRequest is the body of POST /v1/invocations.
type SubmitRequest struct {
	Queue          string            `json:"queue"`
	Argv           []string          `json:"argv"`
	Env            map[string]string `json:"env,omitempty"`
	RunConfig      RunConfig         `json:"run_config"`
	TimeoutS       int               `json:"timeout_s,omitempty"`
	MaxAttempts    int               `json:"max_attempts,omitempty"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	// Retry is the opt-in retry of a failing body (absent: only attempts
	// whose worker was lost run again). Last, and omitted when unset, so the
	// idempotency hash of a request without it is what it always was.
	Retry *RetryPolicy `json:"retry,omitempty"`
	// Input is the body's input: any JSON value, at most MaxInputBytes in
	// its compact form, handed to the body as the file NYMPH_INPUT_FILE
	// names. After Retry, and omitted when unset, so the idempotency hash
	// of a request without it is what it always was.
	Input json.RawMessage `json:"input,omitempty"`
}

// RetryPolicy is a submit's retry of a failing body (docs/states.md):
// a failed outcome with one of exit_codes (an exit status, or 128+n for a
// body killed by signal n), or past timeout_s when timeout is set, queues
// the invocation again while max_attempts allows, after backoff_s (1 to
// MaxRetryBackoffS; left out, DefaultRetryBackoffS), doubling each retry,
// at most 15 minutes.
type RetryPolicy struct {
	ExitCodes []int `json:"exit_codes,omitempty"`
	Timeout   bool  `json:"timeout,omitempty"`
	BackoffS  int   `json:"backoff_s,omitempty"`
}

// DefaultRetryBackoffS is a retry policy's first wait when it names none.
const DefaultRetryBackoffS = 10

// TokenHeader carries a daemon's enrollment or worker token in IAM mode,
// where Authorization carries the request's SigV4 signature (docs/security.md).
const TokenHeader = "X-Lakeshore-Token"

// WakeSecretHeader carries the secret of `lakeshore dev`'s emulated wake
// management API (LAKESHORE_WAKE_SECRET): there no SigV4 check guards
// @connections, so every call presents the secret the dev server made.
const WakeSecretHeader = "X-Lakeshore-Wake-Secret"

// Redacted stands in for every environment value in an operator's view of
// an invocation: the names show, the values (often credentials) go only to
// the worker that runs it.
const Redacted = "[redacted]"

// Invocation is the operator's view of one invocation.
type Invocation struct {
	InvocationID    string            `json:"invocation_id"`
	Queue           string            `json:"queue"`
	State           string            `json:"state"`
	Attempt         int               `json:"attempt"`
	MaxAttempts     int               `json:"max_attempts"`
	WorkerID        string            `json:"worker_id,omitempty"`
	Argv            []string          `json:"argv"`
	Env             map[string]string `json:"env,omitempty"`
	RunConfig       RunConfig         `json:"run_config"`
	TimeoutS        int               `json:"timeout_s,omitempty"`
	ExitCode        *int              `json:"exit_code,omitempty"`
	ResultBlob      json.RawMessage   `json:"result_blob,omitempty"`
	Error           *ErrorInfo        `json:"error,omitempty"`
	StdoutTail      string            `json:"stdout_tail,omitempty"`
	StderrTail      string            `json:"stderr_tail,omitempty"`
	HostKey         string            `json:"host_key,omitempty"`
	CancelRequested bool              `json:"cancel_requested,omitempty"`
	IdempotencyKey  string            `json:"idempotency_key,omitempty"`
	// Input is the submit's input, shown as sent (the user's data, like
	// argv; not redacted as env values are).
	Input json.RawMessage `json:"input,omitempty"`
	// RunID and RunIndex name the run this invocation is a job of.
	RunID      string       `json:"run_id,omitempty"`
	RunIndex   *int         `json:"run_index,omitempty"`
	CreatedAt  time.Time    `json:"created_at"`
	StartedAt  *time.Time   `json:"started_at,omitempty"`
	FinishedAt *time.Time   `json:"finished_at,omitempty"`
	Attempts   []Attempt    `json:"attempts,omitempty"`
	Retry      *RetryPolicy `json:"retry,omitempty"`
	// RetryAt, while set, is when a retried invocation becomes claimable.
	RetryAt *time.Time `json:"retry_at,omitempty"`
	// WaitingReason, on queued work, says why no host is launched for it
	// now: the provisioner holds its key back after its hosts failed
	// (their host setup failed, they never said hello, EC2 refused them).
	WaitingReason string `json:"waiting_reason,omitempty"`
}

// Attempt is one attempt in an invocation's history (docs/states.md): the
// worker that ran it, when it was claimed and ended, and how it ended:
// outcome is succeeded, failed or cancelled when its worker reported it,
// else why it was taken back (stale, gone, bye, omitted, superseded); ""
// while it runs. Recorded marks the attempt whose outcome is the
// invocation's.
type Attempt struct {
	Attempt   int        `json:"attempt"`
	WorkerID  string     `json:"worker_id"`
	ClaimedAt time.Time  `json:"claimed_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	Outcome   string     `json:"outcome,omitempty"`
	ExitCode  *int       `json:"exit_code,omitempty"`
	Reason    string     `json:"reason,omitempty"`
	Recorded  bool       `json:"recorded,omitempty"`
	// Retried marks a failed attempt the retry policy ran again.
	Retried bool `json:"retried,omitempty"`
}

// InvocationList answers GET /v1/invocations.
type InvocationList struct {
	Invocations []Invocation `json:"invocations"`
	NextCursor  string       `json:"next_cursor,omitempty"`
	// PrevCursor stands at the page's first invocation (on an ordered
	// listing): given as cursor with the other order, it reads the
	// invocations before this page, nearest first.
	PrevCursor string `json:"prev_cursor,omitempty"`
}

// Worker is the operator's view of one worker. State is computed on read.
type Worker struct {
	WorkerID           string            `json:"worker_id"`
	MachineID          string            `json:"machine_id"`
	Label              string            `json:"label,omitempty"`
	State              string            `json:"state"`
	StoredState        string            `json:"stored_state"`
	HostStatus         string            `json:"host_status,omitempty"`
	Phase              string            `json:"phase,omitempty"`
	HostKey            string            `json:"host_key,omitempty"`
	Tags               map[string]string `json:"tags,omitempty"`
	Lanes              []string          `json:"lanes,omitempty"`
	MaxConcurrency     int               `json:"max_concurrency"`
	CurrentInvocations int               `json:"current_invocations"`
	LastSeenAt         *time.Time        `json:"last_seen_at,omitempty"`
	CreatedAt          time.Time         `json:"created_at"`
	// RetiredAt is when the worker went gone (a bye, a new boot of its
	// machine, its host stopped); last_seen_at stays when it was last heard.
	RetiredAt *time.Time `json:"retired_at,omitempty"`
	// StateSince and StateWhy say since when and why a stale or gone worker
	// reads so ("silent for 1m20s; stale after 1m0s").
	StateSince *time.Time `json:"state_since,omitempty"`
	StateWhy   string     `json:"state_why,omitempty"`
	// RetiredWhy says why the worker was retired, whatever retired it: its
	// bye, the new boot that replaced it, its host, the provisioner or the
	// sweep. Its JSON name, bye_reason, is pinned and older than that.
	RetiredWhy      string       `json:"bye_reason,omitempty"`
	LastSetupResult *SetupResult `json:"last_setup_result,omitempty"`
	// AdoptHostSetup: a generic worker that may take on a queued
	// invocation's host key (nymph --adopt-host-setup); Adoption is the
	// key it was last asked to take on.
	AdoptHostSetup bool      `json:"adopt_host_setup,omitempty"`
	Adoption       *Adoption `json:"adoption,omitempty"`
}

// Adoption is a key a generic worker was asked to take on: by the
// provisioner, for the queue's work of that key no live worker could take.
// It ends when the worker advertises the key (then it is no longer shown)
// or its host setup fails (Failed says so).
type Adoption struct {
	HostKey string    `json:"host_key"`
	Queue   string    `json:"queue"`
	AskedAt time.Time `json:"asked_at"`
	Failed  string    `json:"failed,omitempty"`
}

// WorkerList answers GET /v1/workers.
type WorkerList struct {
	Workers    []Worker `json:"workers"`
	NextCursor string   `json:"next_cursor,omitempty"`
}

// SetupRequest is the body of POST /v1/workers/{id}/setup.
type SetupRequest struct {
	Argv []string `json:"argv"`
}

// SetupAccepted answers POST /v1/workers/{id}/setup.
type SetupAccepted struct {
	CommandID string `json:"command_id"`
}

// SetupCommand is one entry of a worker's setup history.
type SetupCommand struct {
	CommandID  string     `json:"command_id"`
	Argv       []string   `json:"argv"`
	Status     string     `json:"status"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	DurationMS int64      `json:"duration_ms,omitempty"`
	OutputTail string     `json:"output_tail,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// SetupResults answers GET /v1/workers/{id}/setup-results.
type SetupResults struct {
	WorkerID     string         `json:"worker_id"`
	SetupResults []SetupCommand `json:"setup_results"`
}

// DrainAccepted answers POST /v1/workers/{id}/drain.
type DrainAccepted struct {
	WorkerID string `json:"worker_id"`
	State    string `json:"state"`
	// Note says what happens next, in words.
	Note string `json:"note,omitempty"`
}

// QueueStats answers GET /v1/queues/{queue}: counts by state (queued and
// running: the live work; succeeded, failed, cancelled: totals since the
// queue began) and done_count, the terminal transitions, each counted once.
type QueueStats struct {
	Queue     string         `json:"queue"`
	Counts    map[string]int `json:"counts"`
	DoneCount int            `json:"done_count"`
}

// Health answers GET /v1/healthz.
type Health struct {
	Status string `json:"status"`
}

// Worker reports the worker a daemon request acts for.
func (r *PollRequest) Worker() string { return r.WorkerID }

// Worker reports the worker a daemon request acts for.
func (r *AckRequest) Worker() string { return r.WorkerID }

// Worker reports the worker a daemon request acts for.
func (r *ByeRequest) Worker() string { return r.WorkerID }

// LogsRequest is the body of POST /v1/daemon/logs: new output of attempts
// the worker runs or ran (docs/logs.md).
type LogsRequest struct {
	WorkerID string     `json:"worker_id"`
	Logs     []LogBatch `json:"logs"`
}

// LogBatch is the new output of one attempt.
type LogBatch struct {
	InvocationID string     `json:"invocation_id"`
	Attempt      int        `json:"attempt"`
	Chunks       []LogChunk `json:"chunks"`
}

// LogChunk is one piece of an attempt's output. data is base64 in JSON (the
// output is bytes, not necessarily text). dropped, when set, counts the
// bytes of its stream left out just before it (the stream passed the
// per-attempt cap; head and tail are kept); eof marks the attempt's last
// chunk. end, on a read, is where the chunk ends in its stream: the bytes
// of that stream the body wrote through it, those left out counted (so the
// last chunk's end is the stream's size so far); ignored when a worker
// ships. A chunk stored without the left-out counts ends at its stored
// bytes only (short of the true size by what the cap left out).
type LogChunk struct {
	Seq     int       `json:"seq"`
	Stream  string    `json:"stream"`
	Data    []byte    `json:"data,omitempty"`
	At      time.Time `json:"at"`
	Dropped int64     `json:"dropped,omitempty"`
	EOF     bool      `json:"eof,omitempty"`
	End     int64     `json:"end,omitempty"`
}

// LogsAccepted answers a LogsRequest.
type LogsAccepted struct {
	Stored int `json:"stored"`
}

// LogPage answers GET /v1/invocations/{id}/logs: the chunks of one attempt
// after a seq, in order. next is the after= of the following read; eof says
// the attempt's last chunk is in (nothing more will come).
type LogPage struct {
	InvocationID string     `json:"invocation_id"`
	Attempt      int        `json:"attempt"`
	Chunks       []LogChunk `json:"chunks"`
	Next         int        `json:"next"`
	EOF          bool       `json:"eof"`
}

// Worker reports the worker a daemon request acts for.
func (r *LogsRequest) Worker() string { return r.WorkerID }

// Host is the operator's view of one host the provisioner launched, or
// tried to (docs/provision.md): what it serves, how it went and why.
type Host struct {
	HostID     string     `json:"host_id"`
	Queue      string     `json:"queue"`
	HostKey    string     `json:"host_key,omitempty"`
	State      string     `json:"state"`
	InstanceID string     `json:"instance_id,omitempty"`
	Market     string     `json:"market,omitempty"`
	Reason     string     `json:"reason,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	LaunchedAt *time.Time `json:"launched_at,omitempty"`
	EndedAt    *time.Time `json:"ended_at,omitempty"`
}

// HostList answers GET /v1/hosts.
type HostList struct {
	Hosts []Host `json:"hosts"`
}

// ReleaseHoldRequest is the body of POST /v1/hosts/release: the key (a
// queue, and a host key or none for its generic work) whose failed hosts
// hold its launches back, to let launch again.
type ReleaseHoldRequest struct {
	Queue   string `json:"queue"`
	HostKey string `json:"host_key,omitempty"`
}

// HoldReleased answers POST /v1/hosts/release: whether a hold was
// released, and how many failed hosts in a row it counted.
type HoldReleased struct {
	Queue    string `json:"queue"`
	HostKey  string `json:"host_key,omitempty"`
	Released bool   `json:"released"`
	Failures int    `json:"failures"`
	// Note says what happens next, in words.
	Note string `json:"note,omitempty"`
}
