package process

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// groupPollInterval is how often a terminating group is checked for
// members once its leader has exited.
const groupPollInterval = 20 * time.Millisecond

// killConfirmWait bounds how long the runner waits, after the last SIGKILL
// of a group, for the kernel to confirm every member dead. Only a process
// that cannot die (stuck in uninterruptible sleep, say) outlasts it; the run
// then ends with its cleanup not confirmed (Run.Unconfirmed).
const killConfirmWait = 2 * time.Second

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
//
// The leader gets SIGKILL if the daemon dies (PR_SET_PDEATHSIG), so a
// SIGKILLed or crashed nymph does not leave it running. The kernel sends
// that signal when the thread that forked the leader exits, not the
// process, and Go ends a thread whenever a goroutine locked to it returns:
// runGroup locks its goroutine to its thread from the fork until the
// leader is reaped, so no other goroutine can run there and end it. Only
// the leader has it (a fork clears it): the rest of the group, orphaned,
// is what the daemon's next start kills from the ledger (Ledger.Sweep).
func (r *Runner) runGroup(cmd *exec.Cmd, stop <-chan struct{}, onStart func(pid int)) groupResult {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// A session of its own, hence a process group of its own (pgid = pid)
	// that no process outside it can join.
	cmd.SysProcAttr.Setsid = true
	// Set after the credentials change (--run-as), which would clear it;
	// the syscall package orders it so.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		return groupResult{startErr: err}
	}
	pgid := cmd.Process.Pid
	if onStart != nil {
		onStart(pgid)
	}
	waited := make(chan struct{})
	go func() {
		if r.cfg.Hooks.BeforeWait != nil {
			r.cfg.Hooks.BeforeWait(pgid)
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
				if r.cfg.Hooks.StopHandled != nil {
					r.cfg.Hooks.StopHandled(pgid, false)
				}
				continue
			}
			res.terminated = true
			r.signalGroup(pgid, syscall.SIGTERM)
			grace = time.NewTimer(r.cfg.KillAfter)
			graceC = grace.C
			if r.cfg.Hooks.StopHandled != nil {
				r.cfg.Hooks.StopHandled(pgid, true)
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
		live := r.cfg.LiveMembers(pgid)
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

// GroupMembers reports the live processes of process group pgid (zombies
// excluded), as the runner reads them to confirm a group gone.
func GroupMembers(pgid int) []int { return liveGroupMembers(pgid) }

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
	info, err := readProcInfo(pid)
	return info.state, info.pgrp, err
}

// procInfo is what the runner reads of a process in /proc/<pid>/stat.
type procInfo struct {
	state byte   // field 3: R, S, D, Z, X…
	pgrp  int    // field 5: the process group
	start uint64 // field 22: when it started, in clock ticks after boot
}

// readProcInfo reads /proc/<pid>/stat. A pid that is not there reads as an
// error matching fs.ErrNotExist.
func readProcInfo(pid int) (procInfo, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procInfo{}, err
	}
	// "pid (comm) state ppid pgrp …"; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procInfo{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	// f[0] is field 3 (state), so field n is f[n-3].
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return procInfo{}, fmt.Errorf("/proc/%d/stat: too short", pid)
	}
	pgrp, err := strconv.Atoi(f[2])
	if err != nil {
		return procInfo{}, fmt.Errorf("/proc/%d/stat: process group: %w", pid, err)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procInfo{}, fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	return procInfo{state: f[0][0], pgrp: pgrp, start: start}, nil
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

// SignalNamed reports the signal of a conventional name ("SIGUSR1").
func SignalNamed(name string) (syscall.Signal, bool) {
	for sig, n := range signalNames {
		if n == name {
			return sig, true
		}
	}
	return 0, false
}

// signalName reports the conventional name of sig ("SIGKILL"), or
// "signal N" for one without a common name.
func signalName(sig syscall.Signal) string {
	if n, ok := signalNames[sig]; ok {
		return n
	}
	return "signal " + strconv.Itoa(int(sig))
}
