package process

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

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
	end := r.ended // the one reading of the clock at the end, if run stamped it
	if end.IsZero() {
		end = r.runner.cfg.Clock.Now()
	}
	o.Duration = end.Sub(r.begin)
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
	if len(r.inv.Input) > 0 {
		var cred *syscall.Credential
		if cfg.RunAs != nil {
			cred = cfg.RunAs.Cred
		}
		if err := writeInput(filepath.Join(dir, InputFileName), r.inv.Input, cred); err != nil {
			return failedOutcome(ErrorTypeWorkdirFailed, err.Error(), nil)
		}
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
	r.forgetGroups()
	r.ended = cfg.Clock.Now()
	stampFinished(stdout, r.ended)
	o.StdoutTail = r.logTail(stdout)
	o.StderrTail = r.logTail(stderr)
	return o
}

// recordGroup notes a process group the run just started in the ledger.
// A record that cannot be written leaves Pdeathsig as the only guard.
func (r *Run) recordGroup(pid int) {
	r.setGroup(pid)
	if err := r.runner.cfg.Ledger.record(r.inv.InvocationID, r.inv.Attempt, pid); err != nil {
		r.log.Warn("cannot record the run's process group; a daemon killed meanwhile would leave it running", "pid", pid, "error", err.Error())
	}
}

// setGroup notes the process group the run has running now (0: none),
// and sends it a Signal that found none running.
func (r *Run) setGroup(pgid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.group = pgid
	if pgid != 0 && r.pending != 0 {
		_ = syscall.Kill(-pgid, r.pending)
		r.pending = 0
	}
}

// forgetGroups removes the run's ledger record once its groups are gone.
// A group whose cleanup was not confirmed keeps it, so the next start
// tries again.
func (r *Run) forgetGroups() {
	if pgid, _ := r.Unconfirmed(); pgid != 0 {
		return
	}
	if err := r.runner.cfg.Ledger.forget(r.inv.InvocationID, r.inv.Attempt); err != nil {
		r.log.Warn("cannot remove the run's ledger record", "error", err.Error())
	}
}

// stampFinished sets the modification time of the run's stdout.log, through
// the daemon's own descriptor, to when the run ended: run-directory
// retention reads a run's finish time there (Retention), even for a body
// that printed nothing. A failure only makes the directory look older or
// younger than it is.
func stampFinished(f *os.File, at time.Time) {
	tv := syscall.NsecToTimeval(at.UnixNano())
	_ = syscall.Futimes(int(f.Fd()), []syscall.Timeval{tv, tv})
}

// supervised runs setup and body with the log files open and reports the
// outcome without tails.
func (r *Run) supervised(workerID, dir, bodyDir string, stdout, stderr *os.File) Outcome {
	cfg := r.runner.cfg
	env := mergeEnv(bodyEnv(cfg.BaseEnv, r.inv, workerID, dir), r.extraEnv)
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
		res := r.runner.runGroup(cmd, r.stopc, r.recordGroup)
		r.setGroup(0)
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
	if r.inv.RunConfig.Resident {
		return r.serveResident(workerID, dir, bodyDir, stdout, stderr, timeout)
	}
	path, err := lookPathIn(r.inv.Argv[0], envValue(env, "PATH"))
	if err != nil {
		r.seal()
		return failedOutcome(ErrorTypeStartFailed, err.Error(), nil)
	}
	cmd := &exec.Cmd{Path: path, Args: r.inv.Argv, Dir: bodyDir, Env: env, Stdout: stdout, Stderr: stderr, SysProcAttr: sys}
	res := r.runner.runGroup(cmd, r.stopc, func(pid int) {
		r.recordGroup(pid)
		r.log.Info("body started", "pid", pid)
		r.mu.Lock()
		r.pid = pid
		r.mu.Unlock()
		r.markStarted()
	})
	r.setGroup(0)
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
