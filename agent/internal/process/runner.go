// Package process runs nymph's work: each invocation's body (after its
// run_setup) and each setup command, in a process group of its own, in its
// own run directory, with a clean environment; a stop is SIGTERM to the
// group, --kill-after, SIGKILL, and a wait for the kernel to confirm every
// member gone. It reports how each run ended (Outcome) and knows nothing of
// the control plane. It also keeps a ledger of the process groups running
// (Ledger), so a restart can kill what a SIGKILLed daemon left, and removes
// finished runs' directories (Retention).
package process

import (
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Error types the runner writes into an outcome's error. Timeout is the
// control plane's own type, so an operator groups both sides' timeouts
// together.
const (
	ErrorTypeTimeout        = wire.ErrorTypeTimeout  // timeout_s passed
	ErrorTypeExitCode       = wire.ErrorTypeExitCode // the body exited non-zero
	ErrorTypeSignal         = wire.ErrorTypeSignal   // the body was killed by a signal nobody in the daemon sent
	ErrorTypeCancelled      = "cancelled"            // a cancel command stopped the run: an operator cancelled it, or its attempt was superseded
	ErrorTypeAbandoned      = "abandoned"            // the daemon killed the run on its way out; never acked
	ErrorTypeRunSetupFailed = "run_setup_failed"     // a run_setup command failed; the body never started
	ErrorTypeBadWorkdir     = "bad_workdir"          // run_config.workdir (or the invocation id) escapes the run directory
	ErrorTypeWorkdirFailed  = "workdir_failed"       // the run directory or its log files could not be created
	ErrorTypeStartFailed    = "start_failed"         // the body could not be started (not found, not executable)
	ErrorTypeBadResult      = "bad_result"           // the result file is not JSON, not UTF-8, or over the limit
	ErrorTypeInternal       = "internal"             // a bug in the runner; see the daemon's log
)

// Names of the files the runner keeps in each run directory.
const (
	ResultFileName = "result.json"
	InputFileName  = "input.json"
	StdoutFileName = "stdout.log"
	StderrFileName = "stderr.log"
)

// fallbackPath is the PATH a body gets when the daemon itself has none.
const fallbackPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Config configures how bodies run.
type Config struct {
	// Workdir is the root; each run gets <Workdir>/<invocation_id>/<attempt>,
	// created 0700. Empty means <os.TempDir()>/nymph. A relative root is made
	// absolute at NewRunner, so NYMPH_RESULT_FILE is absolute.
	Workdir string
	// KillAfter is the grace between SIGTERM and SIGKILL; zero (nymph
	// --kill-after 0s) is SIGKILL right after SIGTERM.
	KillAfter time.Duration
	// BaseEnv is the clean environment ("K=V") every body and every Exec
	// starts from. The daemon's own environment is never inherited, so its
	// enroll token cannot leak into a body.
	BaseEnv []string
	Logger  *slog.Logger
	// Clock is what durations are measured with (zero: real time).
	// Deadlines (timeout_s, KillAfter) always run on real timers.
	Clock clock.Clock
	// Ledger, if set, records each process group of a run while it runs
	// (<state-dir>/bodies), so the next daemon can kill what a SIGKILLed
	// one left running (Ledger.Sweep).
	Ledger *Ledger
	// RunAs, if set, is the account bodies and their run_setup run as
	// (Exec, for host and setup commands, stays the daemon's). Their run
	// directory is then theirs; the directories above it are the daemon's,
	// searchable but not writable, so a body cannot plant files in a later
	// attempt's directory.
	RunAs *RunAs

	// Runtime, if set, is the runtime API warm processes pull their
	// invocations from; without it a resident run fails to start.
	// WarmCapacity bounds the warm processes kept (the daemon's
	// --capacity); WarmKeepAlive is how long an idle one is kept (zero:
	// it ends once idle, at the next ExpireWarm).
	Runtime       RuntimeAPI
	WarmCapacity  int
	WarmKeepAlive time.Duration

	// LiveMembers reports the processes of group pgid that still run
	// (default: read from /proc); tests make a group outlive its SIGKILL.
	LiveMembers func(pgid int) []int
	// Hooks stop the runner at points where a race would otherwise decide
	// (tests only).
	Hooks Hooks
}

// Hooks are the runner's test hooks; nil ones do nothing.
type Hooks struct {
	// BeforeWait is called on the goroutine that reaps a group's leader,
	// before it does.
	BeforeWait func(pid int)
	// StopHandled is called once runGroup has dealt with a stop: terminated
	// says it signalled the group (false: the leader had already exited).
	StopHandled func(pid int, terminated bool)
}

// Runner starts bodies and setup commands, each in its own process group.
// It is safe for concurrent use; its config must not change while runs
// start.
//
// The runner is Unix-only: it relies on sessions and process groups
// (Setsid and kill(-pgid)). Each group leads a session of its own, so no
// process of another run can join it (setpgid never crosses a session):
// membership of a run's group is what its lifecycle endpoint trusts. A
// descendant that leaves the group (setsid, a daemonising double fork)
// escapes termination; containing that needs cgroups.
type Runner struct {
	cfg  Config
	log  *slog.Logger
	warm *pool // nil without a runtime API
}

// NewRunner returns a runner for cfg, with its zero fields defaulted.
func New(cfg Config) *Runner {
	if cfg.Workdir == "" {
		cfg.Workdir = filepath.Join(os.TempDir(), "nymph")
	}
	if abs, err := filepath.Abs(cfg.Workdir); err == nil {
		cfg.Workdir = abs
	}
	cfg.KillAfter = max(cfg.KillAfter, 0)
	if cfg.LiveMembers == nil {
		cfg.LiveMembers = liveGroupMembers
	}
	cfg.BaseEnv = slices.Clone(cfg.BaseEnv)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Runner{cfg: cfg, log: log}
	if cfg.Runtime != nil {
		r.warm = &pool{r: r, live: map[*warmProc]bool{}}
	}
	return r
}

// DefaultBaseEnv reports a minimal clean environment for bodies, read through
// getenv (os.Getenv in the daemon): PATH (the daemon's, or a sane default),
// and HOME, LANG, LC_ALL, TMPDIR, USER and LOGNAME where set. Nothing else
// passes: no tokens, no credentials, no NYMPH_* variable.
//
// pass names more variables to carry over (--pass-env), each where set.
func DefaultBaseEnv(getenv func(string) string, pass ...string) []string {
	path := getenv("PATH")
	if path == "" {
		path = fallbackPath
	}
	env := []string{"PATH=" + path}
	for _, k := range append([]string{"HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME"}, pass...) {
		if v := getenv(k); v != "" && k != "PATH" {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// stopReason is why a run was told to stop. The first one wins.
type stopReason int

const (
	stopNone stopReason = iota
	stopCancel
	stopKill
	stopTimeout
)

// Run is one attempt of an invocation, started by Runner.Start.
type Run struct {
	runner *Runner
	inv    wire.RunInvocation
	// extraEnv is the daemon's per-run variables (Start's env).
	extraEnv map[string]string
	log      *slog.Logger
	begin    time.Time
	ended    time.Time // when the run's processes were over (set and read on its own goroutine)

	started     chan struct{}
	startedOnce sync.Once
	done        chan struct{}
	stopc       chan struct{} // closed by the first stop request

	mu      sync.Mutex
	reason  stopReason
	sealed  bool // the run's end has been observed; later stops change nothing
	outcome Outcome
	pid     int // the body's, once started (it leads its process group)
	group   int // the process group running now (a run_setup command's or the body's); 0 between them
	// pending is a Signal that found no group running (one was being
	// started), sent to the next group the run records (0: none).
	pending     syscall.Signal
	leftPgid    int   // a group whose cleanup was not confirmed …
	leftMembers []int // … and its members still alive after SIGKILL
}

// Start begins running inv for worker workerID (its body sees it as
// NYMPH_WORKER_ID; each run carries its own, so a re-hello never changes a
// run under way) and returns at once. The run goes through these steps, any
// of which may end it:
//
//  1. The run directory <Workdir>/<invocation_id>/<attempt> is created 0700
//     and a result file left there by an earlier process is removed. The body
//     works in run_config.workdir, a relative subdirectory (created too); an
//     absolute or escaping one fails the run with bad_workdir.
//  2. run_config.run_setup commands run in order, each as /bin/sh -c CMD, in
//     the body's directory with the body's environment; the first that fails
//     fails the run with run_setup_failed and its exit code.
//  3. The body, inv.Argv, runs directly (argv[0] is looked up in the PATH of
//     the body's environment, not the daemon's), stdin /dev/null, in its own
//     process group. When it exits, anything left in its group is SIGKILLed:
//     a run's processes do not outlive it.
//
// Every process gets BaseEnv, then run_config.env, then inv.Env (later wins),
// then NYMPH_INVOCATION_ID, NYMPH_ATTEMPT, NYMPH_WORKER_ID, NYMPH_WORKDIR
// (the run directory) and NYMPH_RESULT_FILE (<run directory>/result.json).
//
// Output of the setup commands and the body goes to stdout.log and
// stderr.log in the run directory; the outcome carries the last 4 KiB of
// each, as valid UTF-8 (a rune split by the cut is dropped, invalid bytes
// become U+FFFD).
//
// timeout_s, when positive, covers setup and body together, because the
// control plane's clock starts at the claim: when it passes, the running
// process group is terminated (SIGTERM, KillAfter, SIGKILL) and the run fails
// with error type timeout.
//
// How the outcome is decided:
//   - exit 0: succeeded; ExitCode 0.
//   - exit N: failed, exit_code, "exited with status N".
//   - killed by a signal: failed, signal, "killed by SIGKILL"; ExitCode is
//     128+signal (137 for SIGKILL), the shell's convention, so the number
//     means the same in an ack as in a terminal.
//   - Cancel, Kill or the timeout, whichever came first and before the
//     process then running (the body, or a run_setup command) had exited,
//     decides the state whatever the exit status was: cancelled (error
//     cancelled), Abandoned (state failed, error abandoned; never to be
//     acked), or failed (error timeout). ExitCode is still how the process
//     ended, when one had started. A stop that finds that process already
//     exited changes nothing: the outcome it left is known, and stands.
//   - After the last SIGKILL of a group the runner waits (killConfirmWait)
//     for every member to be gone; one that is not is logged, and reported
//     by Unconfirmed.
//   - Result file: if <run directory>/result.json exists once the body has
//     exited, it must be a regular file of at most wire.MaxResultBlobBytes,
//     valid UTF-8, holding either one JSON value, which becomes ResultBlob
//     as it is, or JSON lines (one value per line; blank lines and CRLF
//     endings are fine), which become ResultBlob as one array of the lines'
//     values in order, so a body may append a record per line as it goes.
//     Two values on one line are refused: a line is one record. The blob,
//     array or not, must be at most wire.MaxResultBlobBytes in its compact,
//     HTML-escaped form (the form json.Marshal sends, so the control plane's
//     limit holds). A bad file (empty, not JSON, a line that is not one value,
//     which the error names by number, or over the limit) turns a would-be
//     success into failed with error bad_result; a run that failed anyway
//     keeps its state and error, and the bad file is only logged, because
//     the first failure is the one to see.
//
// env, if given, is set last of all (the daemon's own variables for this
// run, such as NYMPH_LIFECYCLE_URL: the invocation cannot override them).
func (r *Runner) Start(inv wire.RunInvocation, workerID string, env ...map[string]string) *Run {
	// The run reads these from its own goroutine; the caller keeps its copy.
	inv.Argv = slices.Clone(inv.Argv)
	inv.Env = maps.Clone(inv.Env)
	inv.RunConfig.Env = maps.Clone(inv.RunConfig.Env)
	inv.RunConfig.RunSetup = slices.Clone(inv.RunConfig.RunSetup)
	inv.RunConfig.HostSetup = slices.Clone(inv.RunConfig.HostSetup)
	inv.RunConfig.RequeueExitCodes = slices.Clone(inv.RunConfig.RequeueExitCodes)
	extra := map[string]string{}
	for _, m := range env {
		maps.Copy(extra, m)
	}
	run := &Run{
		extraEnv: extra,
		runner:   r,
		inv:      inv,
		log:      r.log.With("invocation_id", inv.InvocationID, "attempt", inv.Attempt),
		begin:    r.cfg.Clock.Now(),
		started:  make(chan struct{}),
		done:     make(chan struct{}),
		stopc:    make(chan struct{}),
	}
	go run.execute(workerID)
	return run
}

// Cancel obeys a cancel command, whether an operator cancelled the
// invocation or the control plane superseded this attempt (its cancelled ack
// is then a no-op): the process group is terminated (SIGTERM, KillAfter,
// SIGKILL) and the outcome's state is cancelled, even if the body then exits
// non-zero. It does nothing once the run's end was observed or
// another stop came first.
func (r *Run) Cancel() { r.requestStop(stopCancel) }

// Kill is the daemon's shutdown: the process group is terminated like Cancel
// and the outcome is Abandoned, so the control plane hands the invocation out
// again after bye. A body that had already exited on its own keeps its
// outcome (Start): that one is known, and is acked.
func (r *Run) Kill() { r.requestStop(stopKill) }

// Signal sends sig to the process group the run has running now (a
// run_setup command's, or the body's), as a drain notice: it stops
// nothing by itself. It reports whether it sent it now. With no group
// running (the run is between its steps, or its body is being started and
// may already run), the run keeps sig and sends it to the next group it
// starts, so a notice is not lost to a start in flight; a run that ended
// sends none.
func (r *Run) Signal(sig syscall.Signal) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sealed {
		return false
	}
	if r.group == 0 {
		r.pending = sig
		return false
	}
	return syscall.Kill(-r.group, sig) == nil
}

// Group reports the process group the run has running now (a run_setup
// command's, or the body's; each leads a session of its own), or 0.
func (r *Run) Group() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.group
}

// Done is closed once the outcome is final.
func (r *Run) Done() <-chan struct{} { return r.done }

// Started is closed once the body's process has started, or once the run
// ended without starting it (bad workdir, failed setup, stopped early,
// start failure). It is always closed before Done.
func (r *Run) Started() <-chan struct{} { return r.started }

// Outcome reports how the run ended. It is final after Done; before, it is
// the zero Outcome.
func (r *Run) Outcome() Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.outcome
}

// Pid reports the body's process id, which is also its process group's id;
// 0 until the body has started (or if it never did).
func (r *Run) Pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pid
}

// Unconfirmed reports a process group of the run (the body's or a
// run_setup command's) that still had live members after its SIGKILL and
// killConfirmWait, and those members' pids: its cleanup was not confirmed.
// pgid is 0 when every group the run started was confirmed gone. Final
// after Done.
func (r *Run) Unconfirmed() (pgid int, pids []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leftPgid, slices.Clone(r.leftMembers)
}

// noteGroup records how a group of the run ended: a cleanup that was not
// confirmed is logged and kept for Unconfirmed.
func (r *Run) noteGroup(what string, res groupResult) {
	if len(res.survivors) == 0 {
		return
	}
	r.log.Error("process group still has live processes after SIGKILL: cleanup not confirmed",
		"process", what, "pgid", res.pgid, "pids", res.survivors)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leftPgid, r.leftMembers = res.pgid, res.survivors
}

// LogFiles reports the paths of the run's stdout.log and stderr.log (""
// for a run whose directory cannot be named: it never starts).
func (r *Run) LogFiles() (stdout, stderr string) {
	dir, _, err := runDirs(r.runner.cfg.Workdir, r.inv)
	if err != nil {
		return "", ""
	}
	return filepath.Join(dir, StdoutFileName), filepath.Join(dir, StderrFileName)
}

// Dirs reports the run directory and the directory the body works in
// (run_config.workdir inside it), or an error for a run whose directories
// cannot be named (it never starts).
func (r *Run) Dirs() (dir, bodyDir string, err error) {
	return runDirs(r.runner.cfg.Workdir, r.inv)
}

// InvocationID reports the id of the invocation this run belongs to.
func (r *Run) InvocationID() string { return r.inv.InvocationID }

// Attempt reports which attempt of the invocation this run is.
func (r *Run) Attempt() int { return r.inv.Attempt }

func (r *Run) requestStop(why stopReason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sealed || r.reason != stopNone {
		return
	}
	r.reason = why
	close(r.stopc)
}

// seal fixes the stop reason: whatever stops arrive later came after the end.
func (r *Run) seal() stopReason {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sealed = true
	return r.reason
}

func (r *Run) stopped() bool {
	select {
	case <-r.stopc:
		return true
	default:
		return false
	}
}

func (r *Run) markStarted() { r.startedOnce.Do(func() { close(r.started) }) }
