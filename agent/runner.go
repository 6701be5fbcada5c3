package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// Error types the runner writes into an outcome's error. Timeout is the
// control plane's own type, so an operator groups both sides' timeouts
// together.
const (
	ErrorTypeTimeout        = wire.ErrorTypeTimeout // timeout_s passed
	ErrorTypeExitCode       = "exit_code"           // the body exited non-zero
	ErrorTypeSignal         = "signal"              // the body was killed by a signal nobody in the daemon sent
	ErrorTypeCancelled      = "cancelled"           // an operator cancelled the run
	ErrorTypeAbandoned      = "abandoned"           // the daemon killed the run on its way out; never acked
	ErrorTypeRunSetupFailed = "run_setup_failed"    // a run_setup command failed; the body never started
	ErrorTypeBadWorkdir     = "bad_workdir"         // run_config.workdir (or the invocation id) escapes the run directory
	ErrorTypeWorkdirFailed  = "workdir_failed"      // the run directory or its log files could not be created
	ErrorTypeStartFailed    = "start_failed"        // the body could not be started (not found, not executable)
	ErrorTypeBadResult      = "bad_result"          // the result file is not JSON, not UTF-8, or over the limit
	ErrorTypeInternal       = "internal"            // a bug in the runner; see the daemon's log
)

// Names of the files the runner keeps in each run directory.
const (
	ResultFileName = "result.json"
	StdoutFileName = "stdout.log"
	StderrFileName = "stderr.log"
)

// execDrainWait bounds how long Exec waits for its output pipe to reach EOF
// once the command's process group is gone. Only a descendant that left the
// group (setsid) can still hold the pipe then, and it must not hang setup.
const execDrainWait = 2 * time.Second

// groupPollInterval is how often a terminating group is checked for
// members once its leader has exited.
const groupPollInterval = 20 * time.Millisecond

// killConfirmWait bounds how long the runner waits, after the last SIGKILL
// of a group, for the kernel to confirm every member dead. Only a process
// that cannot die (stuck in uninterruptible sleep, say) outlasts it; the run
// then ends with its cleanup not confirmed (Run.Unconfirmed).
const killConfirmWait = 2 * time.Second

// fallbackPath is the PATH a body gets when the daemon itself has none.
const fallbackPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// RunnerConfig configures how bodies run.
type RunnerConfig struct {
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
	// WorkerID is handed to bodies as NYMPH_WORKER_ID. It is read at each
	// Start, so the daemon may set it after hello.
	WorkerID string
	Logger   *slog.Logger
	// Now is the clock durations are measured with (default time.Now).
	// Deadlines (timeout_s, KillAfter) always run on real timers.
	Now func() time.Time
	// RunAs, if set, is the account bodies and their run_setup run as
	// (Exec, for host and setup commands, stays the daemon's). Their run
	// directory is then theirs; the directories above it are the daemon's,
	// searchable but not writable, so a body cannot plant files in a later
	// attempt's directory.
	RunAs *RunAs

	// liveMembers reports the processes of group pgid that still run
	// (default liveGroupMembers); tests make a group outlive its SIGKILL.
	liveMembers func(pgid int) []int
	// hooks stop the runner at points where a race would otherwise decide
	// (tests only).
	hooks runnerHooks
}

// runnerHooks are the runner's test hooks; nil ones do nothing.
type runnerHooks struct {
	// beforeWait is called on the goroutine that reaps a group's leader,
	// before it does.
	beforeWait func(pid int)
	// stopHandled is called once runGroup has dealt with a stop: terminated
	// says it signalled the group (false: the leader had already exited).
	stopHandled func(pid int, terminated bool)
}

// Runner starts bodies and setup commands, each in its own process group.
// It is safe for concurrent use; its config must not change while runs
// start.
//
// The runner is Unix-only: it relies on process groups (Setpgid and
// kill(-pgid)). A descendant that leaves the group (setsid, a daemonising
// double fork) escapes termination; containing that needs cgroups.
type Runner struct {
	cfg RunnerConfig
	log *slog.Logger
}

// NewRunner returns a runner for cfg, with its zero fields defaulted.
func NewRunner(cfg RunnerConfig) *Runner {
	if cfg.Workdir == "" {
		cfg.Workdir = filepath.Join(os.TempDir(), "nymph")
	}
	if abs, err := filepath.Abs(cfg.Workdir); err == nil {
		cfg.Workdir = abs
	}
	cfg.KillAfter = max(cfg.KillAfter, 0)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.liveMembers == nil {
		cfg.liveMembers = liveGroupMembers
	}
	cfg.BaseEnv = slices.Clone(cfg.BaseEnv)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Runner{cfg: cfg, log: log}
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
	log    *slog.Logger
	begin  time.Time

	started     chan struct{}
	startedOnce sync.Once
	done        chan struct{}
	stopc       chan struct{} // closed by the first stop request

	mu          sync.Mutex
	reason      stopReason
	sealed      bool // the run's end has been observed; later stops change nothing
	outcome     Outcome
	pid         int   // the body's, once started (it leads its process group)
	leftPgid    int   // a group whose cleanup was not confirmed …
	leftMembers []int // … and its members still alive after SIGKILL
}

// Start begins running inv and returns at once. The run goes through these
// steps, any of which may end it:
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
//     exited, it must be a regular file holding valid UTF-8 JSON of at most
//     wire.MaxResultBlobBytes in its compact, HTML-escaped form (the form
//     json.Marshal sends, so the control plane's limit holds). It becomes
//     ResultBlob. A bad one turns a would-be success into failed with error
//     bad_result; a run that failed anyway keeps its state and error, and the
//     bad file is only logged, because the first failure is the one to see.
func (r *Runner) Start(inv wire.RunInvocation) *Run {
	// The run reads these from its own goroutine; the caller keeps its copy.
	inv.Argv = slices.Clone(inv.Argv)
	inv.Env = maps.Clone(inv.Env)
	inv.RunConfig.Env = maps.Clone(inv.RunConfig.Env)
	inv.RunConfig.RunSetup = slices.Clone(inv.RunConfig.RunSetup)
	inv.RunConfig.HostSetup = slices.Clone(inv.RunConfig.HostSetup)
	run := &Run{
		runner:  r,
		inv:     inv,
		log:     r.log.With("invocation_id", inv.InvocationID, "attempt", inv.Attempt),
		begin:   r.cfg.Now(),
		started: make(chan struct{}),
		done:    make(chan struct{}),
		stopc:   make(chan struct{}),
	}
	go run.execute(r.cfg.WorkerID)
	return run
}

// Cancel is an operator's cancel: the process group is terminated (SIGTERM,
// KillAfter, SIGKILL) and the outcome's state is cancelled, even if the body
// then exits non-zero. It does nothing once the run's end was observed or
// another stop came first.
func (r *Run) Cancel() { r.requestStop(stopCancel) }

// Kill is the daemon's shutdown: the process group is terminated like Cancel
// and the outcome is Abandoned, so the control plane hands the invocation out
// again after bye. A body that had already exited on its own keeps its
// outcome (Start): that one is known, and is acked.
func (r *Run) Kill() { r.requestStop(stopKill) }

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

func (r *Run) execute(workerID string) {
	var o Outcome
	func() {
		defer func() {
			if p := recover(); p != nil {
				r.log.Error("runner panicked; failing the run", "panic", fmt.Sprint(p))
				o = Outcome{State: wire.StateFailed, Error: &wire.ErrorInfo{Type: ErrorTypeInternal, Message: "the runner failed; see the daemon's log"}}
			}
		}()
		o = r.run(workerID)
	}()
	o.Duration = r.runner.cfg.Now().Sub(r.begin)
	attrs := []any{"state", o.State, "abandoned", o.Abandoned, "duration_ms", o.Duration.Milliseconds()}
	if o.ExitCode != nil {
		attrs = append(attrs, "exit_code", *o.ExitCode)
	}
	if o.Error != nil {
		attrs = append(attrs, "error_type", o.Error.Type)
	}
	r.log.Info("run finished", attrs...)
	r.mu.Lock()
	r.outcome = o
	r.sealed = true
	r.mu.Unlock()
	r.markStarted()
	close(r.done)
}

// run does the work of execute and reports the outcome, less its duration.
func (r *Run) run(workerID string) Outcome {
	cfg := r.runner.cfg
	dir, bodyDir, err := runDirs(cfg.Workdir, r.inv)
	if err != nil {
		return failedOutcome(ErrorTypeBadWorkdir, err.Error(), nil)
	}
	if err := os.MkdirAll(bodyDir, 0o700); err != nil {
		r.log.Error("cannot create the run directory", "error", err.Error())
		return failedOutcome(ErrorTypeWorkdirFailed, fmt.Sprintf("create the run directory: %v", err), nil)
	}
	if cfg.RunAs != nil {
		if err := handOver(cfg.Workdir, dir, bodyDir, cfg.RunAs.Cred); err != nil {
			r.log.Error("cannot hand the run directory to --run-as", "user", cfg.RunAs.Name, "error", err.Error())
			return failedOutcome(ErrorTypeWorkdirFailed, fmt.Sprintf("hand the run directory to %s: %v", cfg.RunAs.Name, err), nil)
		}
	}
	resultPath := filepath.Join(dir, ResultFileName)
	if err := os.Remove(resultPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return failedOutcome(ErrorTypeWorkdirFailed, fmt.Sprintf("remove a stale result file: %v", err), nil)
	}
	stdout, err := createLog(filepath.Join(dir, StdoutFileName))
	if err != nil {
		return failedOutcome(ErrorTypeWorkdirFailed, err.Error(), nil)
	}
	defer stdout.Close()
	stderr, err := createLog(filepath.Join(dir, StderrFileName))
	if err != nil {
		return failedOutcome(ErrorTypeWorkdirFailed, err.Error(), nil)
	}
	defer stderr.Close()

	o := r.supervised(workerID, dir, bodyDir, stdout, stderr)
	o.StdoutTail = r.logTail(stdout)
	o.StderrTail = r.logTail(stderr)
	return o
}

// supervised runs setup and body with the log files open and reports the
// outcome without tails.
func (r *Run) supervised(workerID, dir, bodyDir string, stdout, stderr *os.File) Outcome {
	cfg := r.runner.cfg
	env := bodyEnv(cfg.BaseEnv, r.inv, workerID, dir)
	var sys *syscall.SysProcAttr
	if cfg.RunAs != nil {
		// The account's own identity, whatever the daemon's was.
		env = mergeEnv(env, map[string]string{"HOME": cfg.RunAs.Home, "USER": cfg.RunAs.Name, "LOGNAME": cfg.RunAs.Name})
		sys = &syscall.SysProcAttr{Credential: cfg.RunAs.Cred}
	}
	var timeout time.Duration
	if r.inv.TimeoutS > 0 {
		timeout = time.Duration(r.inv.TimeoutS) * time.Second
		t := time.AfterFunc(timeout, func() { r.requestStop(stopTimeout) })
		defer t.Stop()
	}

	for i, line := range r.inv.RunConfig.RunSetup {
		if r.stopped() {
			break
		}
		cmd := &exec.Cmd{Path: "/bin/sh", Args: []string{"/bin/sh", "-c", line}, Dir: bodyDir, Env: env, Stdout: stdout, Stderr: stderr, SysProcAttr: sys}
		res := r.runner.runGroup(cmd, r.stopc, nil)
		r.noteGroup(fmt.Sprintf("run_setup[%d]", i), res)
		if res.startErr == nil && res.exitCode() == 0 && !res.signaled() {
			continue
		}
		if reason := r.seal(); reason != stopNone && (res.terminated || res.startErr != nil) {
			return r.stoppedOutcome(reason, fmt.Sprintf(" during run_setup[%d]", i), res, timeout)
		}
		if res.startErr != nil {
			r.log.Error("run_setup command could not start", "index", i, "error", res.startErr.Error())
			return failedOutcome(ErrorTypeRunSetupFailed, fmt.Sprintf("run_setup[%d] could not start: %v", i, res.startErr), nil)
		}
		code := res.exitCode()
		r.log.Warn("run_setup command failed", "index", i, "exit_code", code)
		return failedOutcome(ErrorTypeRunSetupFailed, fmt.Sprintf("run_setup[%d] %s", i, res.describe()), &code)
	}
	if reason := r.sealIfStopped(); reason != stopNone {
		return r.stoppedOutcome(reason, " before the body started", groupResult{}, timeout)
	}

	if len(r.inv.Argv) == 0 {
		r.seal()
		return failedOutcome(ErrorTypeStartFailed, "argv is empty", nil)
	}
	path, err := lookPathIn(r.inv.Argv[0], envValue(env, "PATH"))
	if err != nil {
		r.seal()
		return failedOutcome(ErrorTypeStartFailed, err.Error(), nil)
	}
	cmd := &exec.Cmd{Path: path, Args: r.inv.Argv, Dir: bodyDir, Env: env, Stdout: stdout, Stderr: stderr, SysProcAttr: sys}
	res := r.runner.runGroup(cmd, r.stopc, func(pid int) {
		r.log.Info("body started", "pid", pid)
		r.mu.Lock()
		r.pid = pid
		r.mu.Unlock()
		r.markStarted()
	})
	r.noteGroup("body", res)
	reason := r.seal()
	if res.startErr == nil && reason != stopNone && !res.terminated {
		// The body had ended on its own before the stop reached it: its
		// outcome is known and stands.
		r.log.Info("stop arrived after the body had exited; keeping its outcome")
		reason = stopNone
	}
	if res.startErr != nil {
		if reason != stopNone {
			return r.stoppedOutcome(reason, " before the body started", res, timeout)
		}
		r.log.Error("body could not start", "error", res.startErr.Error())
		return failedOutcome(ErrorTypeStartFailed, fmt.Sprintf("start the body: %v", res.startErr), nil)
	}

	var o Outcome
	code := res.exitCode()
	switch {
	case reason != stopNone:
		o = r.stoppedOutcome(reason, "", res, timeout)
	case res.signaled():
		o = failedOutcome(ErrorTypeSignal, res.describe(), &code)
	case code != 0:
		o = failedOutcome(ErrorTypeExitCode, res.describe(), &code)
	default:
		o = Outcome{State: wire.StateSucceeded, ExitCode: &code}
	}
	if o.Abandoned {
		return o
	}
	blob, err := readResultFile(filepath.Join(dir, ResultFileName))
	switch {
	case err == nil:
		o.ResultBlob = blob
	case o.State == wire.StateSucceeded:
		o.State = wire.StateFailed
		o.Error = &wire.ErrorInfo{Type: ErrorTypeBadResult, Message: clipMessage(err.Error())}
	default:
		r.log.Warn("ignoring a bad result file of a run that failed anyway", "error", err.Error())
	}
	return o
}

// sealIfStopped seals the run if a stop already arrived, reporting it.
func (r *Run) sealIfStopped() stopReason {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reason != stopNone {
		r.sealed = true
	}
	return r.reason
}

// stoppedOutcome is the outcome of a run a stop ended. where says which step
// it interrupted; res is the process it terminated, if any.
func (r *Run) stoppedOutcome(reason stopReason, where string, res groupResult, timeout time.Duration) Outcome {
	var code *int
	how := ""
	if res.state != nil {
		c := res.exitCode()
		code = &c
		how = "; " + res.describe()
	}
	switch reason {
	case stopCancel:
		return Outcome{State: wire.StateCancelled, ExitCode: code,
			Error: &wire.ErrorInfo{Type: ErrorTypeCancelled, Message: "cancelled" + where + how}}
	case stopKill:
		return Outcome{State: wire.StateFailed, Abandoned: true, ExitCode: code,
			Error: &wire.ErrorInfo{Type: ErrorTypeAbandoned, Message: "terminated because the daemon is shutting down" + where + how}}
	default:
		return Outcome{State: wire.StateFailed, ExitCode: code,
			Error: &wire.ErrorInfo{Type: ErrorTypeTimeout, Message: fmt.Sprintf("timed out after %s (timeout_s %d)%s%s", timeout, r.inv.TimeoutS, where, how)}}
	}
}

func (r *Run) logTail(f *os.File) string {
	s, err := fileTail(f, wire.MaxTailBytes)
	if err != nil {
		r.log.Warn("cannot read an output tail", "file", filepath.Base(f.Name()), "error", err.Error())
	}
	return s
}

func failedOutcome(errType, msg string, code *int) Outcome {
	return Outcome{State: wire.StateFailed, ExitCode: code, Error: &wire.ErrorInfo{Type: errType, Message: clipMessage(msg)}}
}

// Exec runs argv to completion in dir, for setup commands: argv[0] is looked
// up in BaseEnv's PATH, the environment is BaseEnv alone, stdin is /dev/null,
// and the command leads its own process group, which is SIGKILLed once the
// command exits. outputTail is the last 4 KiB of stdout and stderr
// interleaved, as valid UTF-8. Cancelling ctx terminates the group (SIGTERM,
// KillAfter, SIGKILL).
//
// err is nil when the command ran to an end of its own, whatever its exit
// status; exitCode is then its status, or 128+signal if a signal killed it.
// err is non-nil when it could not start (exitCode -1) or when ctx ended it
// (err wraps ctx's error; exitCode is how it ended).
func (r *Runner) Exec(ctx context.Context, argv []string, dir string) (exitCode int, outputTail string, dur time.Duration, err error) {
	begin := r.cfg.Now()
	elapsed := func() time.Duration { return r.cfg.Now().Sub(begin) }
	if len(argv) == 0 {
		return -1, "", elapsed(), errors.New("exec: argv is empty")
	}
	if err := ctx.Err(); err != nil {
		return -1, "", elapsed(), fmt.Errorf("exec %q: not started: %w", clipString(argv[0], 200), err)
	}
	env := mergeEnv(r.cfg.BaseEnv)
	path, err := lookPathIn(argv[0], envValue(env, "PATH"))
	if err != nil {
		return -1, "", elapsed(), fmt.Errorf("exec: %w", err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return -1, "", elapsed(), fmt.Errorf("exec %q: output pipe: %w", clipString(argv[0], 200), err)
	}
	tail := &tailBuffer{max: wire.MaxTailBytes}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, _ = io.Copy(tail, pr)
	}()
	cmd := &exec.Cmd{Path: path, Args: slices.Clone(argv), Dir: dir, Env: env, Stdout: pw, Stderr: pw}
	res := r.runGroup(cmd, ctx.Done(), nil)
	if len(res.survivors) > 0 {
		r.log.Error("process group still has live processes after SIGKILL: cleanup not confirmed",
			"process", "exec", "pgid", res.pgid, "pids", res.survivors)
	}
	_ = pw.Close()
	drain := time.NewTimer(execDrainWait)
	select {
	case <-copied:
	case <-drain.C:
		r.log.Warn("exec output still open after its process group ended; a descendant left the group")
	}
	drain.Stop()
	_ = pr.Close() // unblocks the copy if a stray descendant still holds the pipe
	<-copied
	outputTail = tail.String()

	if res.startErr != nil {
		return -1, outputTail, elapsed(), fmt.Errorf("exec %q: %w", clipString(argv[0], 200), res.startErr)
	}
	exitCode = res.exitCode()
	r.log.Debug("exec finished", "exit_code", exitCode, "terminated", res.terminated)
	if res.terminated {
		return exitCode, outputTail, elapsed(), fmt.Errorf("exec %q: terminated (%s): %w", clipString(argv[0], 200), res.describe(), ctx.Err())
	}
	return exitCode, outputTail, elapsed(), nil
}

// groupResult is how one process group run ended.
type groupResult struct {
	startErr   error
	state      *os.ProcessState
	terminated bool  // a stop arrived before the leader exited, and the group was signalled
	killed     bool  // the grace ran out and the group got SIGKILL
	pgid       int   // the group, once started
	survivors  []int // members still alive after the last SIGKILL and killConfirmWait
}

func (g groupResult) waitStatus() (syscall.WaitStatus, bool) {
	if g.state == nil {
		return 0, false
	}
	ws, ok := g.state.Sys().(syscall.WaitStatus)
	return ws, ok
}

func (g groupResult) signaled() bool {
	ws, ok := g.waitStatus()
	return ok && ws.Signaled()
}

// exitCode is the exit status, or 128+signal for a signalled process, or -1
// when there is no process.
func (g groupResult) exitCode() int {
	ws, ok := g.waitStatus()
	switch {
	case !ok:
		if g.state != nil {
			return g.state.ExitCode()
		}
		return -1
	case ws.Signaled():
		return 128 + int(ws.Signal())
	default:
		return ws.ExitStatus()
	}
}

// describe says how the process ended: "exited with status N" or "killed by
// SIGKILL".
func (g groupResult) describe() string {
	ws, ok := g.waitStatus()
	if ok && ws.Signaled() {
		return "killed by " + signalName(ws.Signal())
	}
	return fmt.Sprintf("exited with status %d", g.exitCode())
}

// runGroup starts cmd as the leader of a new process group, with stdin
// /dev/null unless set, and waits for it. When stop closes, the group gets
// SIGTERM, then SIGKILL after KillAfter (or sooner, once the leader is gone
// and the group empty) — unless the leader had already exited on its own,
// which the result then says (terminated false). When the leader exits,
// whatever is left of its group is SIGKILLed, so no descendant in the group
// outlives it, and the runner waits up to killConfirmWait to see every
// member gone; the ones it does not are the result's survivors. onStart, if
// set, is called with the pid once the process has started.
func (r *Runner) runGroup(cmd *exec.Cmd, stop <-chan struct{}, onStart func(pid int)) groupResult {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		return groupResult{startErr: err}
	}
	pgid := cmd.Process.Pid
	if onStart != nil {
		onStart(pgid)
	}
	waited := make(chan struct{})
	go func() {
		if r.cfg.hooks.beforeWait != nil {
			r.cfg.hooks.beforeWait(pgid)
		}
		// The error only restates ProcessState, or reports a failed copy
		// into a writer, which the runner does not use.
		_ = cmd.Wait()
		close(waited)
	}()

	res := groupResult{pgid: pgid}
	var grace *time.Timer
	var graceC <-chan time.Time
	defer func() {
		if grace != nil {
			grace.Stop()
		}
	}()
	for {
		select {
		case <-stop:
			stop = nil
			if leaderExited(pgid, waited) {
				// Its end is known already; whatever is left of the
				// group is SIGKILLed once the leader is reaped.
				if r.cfg.hooks.stopHandled != nil {
					r.cfg.hooks.stopHandled(pgid, false)
				}
				continue
			}
			res.terminated = true
			r.signalGroup(pgid, syscall.SIGTERM)
			grace = time.NewTimer(r.cfg.KillAfter)
			graceC = grace.C
			if r.cfg.hooks.stopHandled != nil {
				r.cfg.hooks.stopHandled(pgid, true)
			}
		case <-graceC:
			graceC = nil
			res.killed = true
			r.signalGroup(pgid, syscall.SIGKILL)
		case <-waited:
			if res.terminated && !res.killed {
				// The rest of the group had the same SIGTERM and gets the
				// rest of the same grace.
				awaitGroupGone(pgid, graceC)
			}
			r.signalGroup(pgid, syscall.SIGKILL)
			res.state = cmd.ProcessState
			res.survivors = r.confirmGroupGone(pgid)
			return res
		}
	}
}

// leaderExited reports whether the leader pid of a running group has
// already exited: reaped (waited closed, or no such process any more), or a
// zombie not yet reaped. Without /proc a zombie reads as running.
func leaderExited(pid int, waited <-chan struct{}) bool {
	select {
	case <-waited:
		return true
	default:
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true // reaped between the two checks
	}
	state, _, err := procStat(pid)
	return err == nil && (state == 'Z' || state == 'X')
}

// confirmGroupGone waits, after the group's last SIGKILL, until no member
// of group pgid runs, for at most killConfirmWait, and reports the members
// still running then (nil: confirmed gone).
func (r *Runner) confirmGroupGone(pgid int) []int {
	deadline := time.NewTimer(killConfirmWait)
	defer deadline.Stop()
	tick := time.NewTicker(groupPollInterval)
	defer tick.Stop()
	for {
		live := r.cfg.liveMembers(pgid)
		if len(live) == 0 {
			return nil
		}
		select {
		case <-deadline.C:
			// One more SIGKILL will not hurt; the group is reported all the same.
			r.signalGroup(pgid, syscall.SIGKILL)
			return live
		case <-tick.C:
		}
	}
}

// liveGroupMembers reports the processes of group pgid that still run:
// every member but zombies, which run nothing (and which, without a reaping
// init, may never go away). Where /proc cannot be read it reports the group
// itself while any member, zombies included, remains.
func liveGroupMembers(pgid int) []int {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return nil // the cheap answer, and the usual one
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return []int{pgid}
	}
	var live []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		state, pgrp, err := procStat(pid)
		if err != nil || pgrp != pgid || state == 'Z' || state == 'X' {
			continue // gone meanwhile, another group's, or dead
		}
		live = append(live, pid)
	}
	return live
}

// procStat reads the state letter and the process group of pid from
// /proc/<pid>/stat.
func procStat(pid int) (state byte, pgrp int, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// "pid (comm) state ppid pgrp …"; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: too short", pid)
	}
	pgrp, err = strconv.Atoi(f[2])
	if err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: process group: %w", pid, err)
	}
	return f[0][0], pgrp, nil
}

// signalGroup sends sig to the process group pgid. A group already gone is
// not an error.
func (r *Runner) signalGroup(pgid int, sig syscall.Signal) {
	if err := syscall.Kill(-pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		r.log.Warn("cannot signal a process group", "pgid", pgid, "signal", signalName(sig), "error", err.Error())
	}
}

// awaitGroupGone returns once process group pgid has no members or deadline
// fires. Members that are unreaped zombies still count, so without a reaping
// init this waits for the deadline; it is bounded either way.
func awaitGroupGone(pgid int, deadline <-chan time.Time) {
	if deadline == nil {
		return
	}
	tick := time.NewTicker(groupPollInterval)
	defer tick.Stop()
	for {
		if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		select {
		case <-deadline:
			return
		case <-tick.C:
		}
	}
}

var signalNames = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT",
	syscall.SIGILL: "SIGILL", syscall.SIGTRAP: "SIGTRAP", syscall.SIGABRT: "SIGABRT",
	syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE", syscall.SIGKILL: "SIGKILL",
	syscall.SIGUSR1: "SIGUSR1", syscall.SIGSEGV: "SIGSEGV", syscall.SIGUSR2: "SIGUSR2",
	syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM",
	syscall.SIGXCPU: "SIGXCPU", syscall.SIGXFSZ: "SIGXFSZ", syscall.SIGSYS: "SIGSYS",
}

// signalName reports the conventional name of sig ("SIGKILL"), or
// "signal N" for one without a common name.
func signalName(sig syscall.Signal) string {
	if n, ok := signalNames[sig]; ok {
		return n
	}
	return "signal " + strconv.Itoa(int(sig))
}

// runDirs reports the run directory of inv under root and the directory the
// body works in. The invocation id must be one plain path element and
// run_config.workdir a local relative path: neither may reach outside.
func runDirs(root string, inv wire.RunInvocation) (dir, bodyDir string, err error) {
	id := inv.InvocationID
	if id == "" || id == "." || id == ".." || strings.ContainsAny(id, `/\`+"\x00") {
		return "", "", fmt.Errorf("invocation id %q is not a plain directory name", clipString(id, 200))
	}
	dir = filepath.Join(root, id, strconv.Itoa(inv.Attempt))
	sub := inv.RunConfig.Workdir
	if sub == "" {
		return dir, dir, nil
	}
	if filepath.IsAbs(sub) || !filepath.IsLocal(sub) || strings.ContainsRune(sub, 0) {
		return "", "", fmt.Errorf("run_config.workdir %q must be a relative path inside the run directory", clipString(sub, 200))
	}
	return dir, filepath.Join(dir, sub), nil
}

// createLog creates a run's log file. O_NOFOLLOW: a run directory that
// already existed (a restarted daemon re-running an attempt) may hold a
// symlink a body planted, and the daemon must not truncate its target.
func createLog(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", filepath.Base(path), err)
	}
	return f, nil
}

// bodyEnv is the environment of a run's processes: base, then the run
// config's env, then the invocation's, then the NYMPH_* variables, which
// nothing overrides.
func bodyEnv(base []string, inv wire.RunInvocation, workerID, dir string) []string {
	return mergeEnv(base, inv.RunConfig.Env, inv.Env, map[string]string{
		"NYMPH_INVOCATION_ID": inv.InvocationID,
		"NYMPH_ATTEMPT":       strconv.Itoa(inv.Attempt),
		"NYMPH_WORKER_ID":     workerID,
		"NYMPH_WORKDIR":       dir,
		"NYMPH_RESULT_FILE":   filepath.Join(dir, ResultFileName),
	})
}

// mergeEnv layers maps over base ("K=V" entries; ones without "=" are
// dropped), later winning, and reports the result sorted by key.
func mergeEnv(base []string, layers ...map[string]string) []string {
	m := make(map[string]string, len(base))
	for _, kv := range base {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			m[k] = v
		}
	}
	for _, layer := range layers {
		for k, v := range layer {
			m[k] = v
		}
	}
	keys := slices.Sorted(maps.Keys(m))
	env := make([]string, len(keys))
	for i, k := range keys {
		env[i] = k + "=" + m[k]
	}
	return env
}

// envValue reports the value of key in env ("K=V" entries; the last wins).
func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// lookPathIn finds file like a shell would, but in path (the body's PATH)
// rather than the daemon's. A name with a slash is used as given (relative to
// the body's directory). Empty and relative PATH entries are skipped: they
// would resolve against the daemon's working directory.
func lookPathIn(file, path string) (string, error) {
	if file == "" {
		return "", errors.New("argv[0] is empty")
	}
	if strings.Contains(file, "/") {
		return file, nil
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" || !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, file)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q not found in PATH %q", clipString(file, 200), clipString(path, 1000))
}

// readResultFile reads a result file. A missing file is (nil, nil); a file
// that is not a regular file, not valid UTF-8 JSON, or over
// wire.MaxResultBlobBytes in its canonical form is an error saying why.
func readResultFile(path string) (json.RawMessage, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("result file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("result file is not a regular file (%s)", fi.Mode().Type())
	}
	if fi.Size() > wire.MaxResultBlobBytes {
		return nil, fmt.Errorf("result file is %d bytes; the limit is %d", fi.Size(), wire.MaxResultBlobBytes)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("result file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, wire.MaxResultBlobBytes+1))
	if err != nil {
		return nil, fmt.Errorf("result file: %w", err)
	}
	if len(data) > wire.MaxResultBlobBytes {
		return nil, fmt.Errorf("result file is over the limit of %d bytes", wire.MaxResultBlobBytes)
	}
	if !utf8.Valid(data) {
		return nil, errors.New("result file is not valid UTF-8")
	}
	if !json.Valid(data) {
		return nil, errors.New("result file is not valid JSON")
	}
	// The canonical form is what json.Marshal sends: compact and
	// HTML-escaped. Checking its size keeps the control plane's limit.
	var compact, escaped bytes.Buffer
	if err := json.Compact(&compact, data); err != nil {
		return nil, fmt.Errorf("result file is not valid JSON: %w", err)
	}
	json.HTMLEscape(&escaped, compact.Bytes())
	if escaped.Len() > wire.MaxResultBlobBytes {
		return nil, fmt.Errorf("result file is %d bytes once compacted and escaped; the limit is %d", escaped.Len(), wire.MaxResultBlobBytes)
	}
	return json.RawMessage(escaped.Bytes()), nil
}

// fileTail reports the last limit bytes of f as tail text.
func fileTail(f *os.File, limit int) (string, error) {
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("stat %s: %w", filepath.Base(f.Name()), err)
	}
	off := max(fi.Size()-int64(limit), 0)
	buf := make([]byte, fi.Size()-off)
	n, err := f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read %s: %w", filepath.Base(f.Name()), err)
	}
	return tailText(buf[:n], off > 0, limit), nil
}

// tailText turns the last bytes of a stream into valid UTF-8 of at most limit
// bytes. cut says the stream went on before b: a rune split by the cut is
// dropped rather than shown as garbage. Invalid bytes become U+FFFD; if that
// grows the text past limit, whole runes are dropped from the front.
func tailText(b []byte, cut bool, limit int) string {
	if cut {
		for i := 0; i < utf8.UTFMax-1 && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
			b = b[1:]
		}
	}
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	if len(s) > limit {
		s = s[len(s)-limit:]
		for len(s) > 0 && !utf8.RuneStart(s[0]) {
			s = s[1:]
		}
	}
	return s
}

// tailBuffer is an io.Writer that keeps the last max bytes written.
type tailBuffer struct {
	max   int
	buf   []byte
	total int64
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.total += int64(len(p))
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

// String reports the tail as text (see tailText).
func (t *tailBuffer) String() string {
	b := t.buf
	if len(b) > t.max {
		b = b[len(b)-t.max:]
	}
	return tailText(b, t.total > int64(len(b)), t.max)
}

// clip shortens s to at most n bytes on a rune boundary, for quoting
// caller-supplied strings in messages.
func clipString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// clipMessage makes msg fit an ack's error message: valid UTF-8 of at most
// wire.MaxMessageBytes.
func clipMessage(msg string) string {
	msg = strings.ToValidUTF8(msg, "\uFFFD")
	if len(msg) <= wire.MaxMessageBytes {
		return msg
	}
	return clipString(msg, wire.MaxMessageBytes-len("…"))
}

// handOver makes a run directory the --run-as account's: dir and bodyDir
// (and what lies between) are chowned to it, and the daemon's directories
// above dir (the workdir root, the invocation's directory) become
// searchable by it but stay the daemon's, so it can reach its own run
// directory and nothing else.
func handOver(root, dir, bodyDir string, cred *syscall.Credential) error {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o711); err != nil {
			return err
		}
		if p == root || p == filepath.Dir(p) {
			break
		}
	}
	for p := bodyDir; ; p = filepath.Dir(p) {
		if err := os.Lchown(p, int(cred.Uid), int(cred.Gid)); err != nil {
			return err
		}
		if p == dir || p == filepath.Dir(p) {
			break
		}
	}
	return nil
}
