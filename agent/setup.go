package agent

import (
	"context"
	"strings"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/process"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// startHostSetup runs the host setup commands (st.hostSetup) from index
// from on (0 at start; the one that failed on a rerun), off the loop's
// goroutine.
func (a *Agent) startHostSetup(st *state, from int) {
	st.idleSince = a.now()
	st.hostSetupStarted(hostSetupText(st.hostSetup[from]))
	cmds := st.hostSetup
	a.goSetup(st, func(ctx context.Context, report func(setupDone) bool) {
		a.runHostSetup(ctx, cmds, from, report)
	})
}

// runHostSetup runs host setup cmds in order from index from, each with sh
// -c, and reports each. A failing command stops the rest: the worker stays
// in setup (heartbeating, never claiming) until a control-plane setup
// command repairs the host, or its keep-alive runs out; an adopted host
// setup that fails leaves the worker generic instead (adopt.go).
func (a *Agent) runHostSetup(ctx context.Context, cmds []string, from int, report func(setupDone) bool) {
	for i := from; i < len(cmds); i++ {
		cmd := cmds[i]
		res := setupResult(a.runner.Exec(ctx, []string{"/bin/sh", "-c", cmd}, a.cfg.Workdir))
		res.Command = hostSetupText(cmd)
		if !report(setupDone{result: res, host: true, index: i}) || res.Status == wire.SetupFailed {
			return
		}
	}
}

// goSetup runs one setup job under st.setupCtx on its own goroutine; report
// hands a result to the loop, or answers false once the loop has returned.
func (a *Agent) goSetup(st *state, job func(ctx context.Context, report func(setupDone) bool)) {
	ctx, setupc, loopDone := st.setupCtx, a.setupc, st.loopDone
	st.setupWG.Add(1)
	go func() {
		defer st.setupWG.Done()
		job(ctx, func(ev setupDone) bool {
			select {
			case setupc <- ev:
				return true
			case <-loopDone:
				return false
			}
		})
	}()
}

// endSetups kills any setup command still running and waits (bounded) until
// it is gone, so none outlives the daemon in its own process group.
func (a *Agent) endSetups(st *state) {
	st.stopSetup()
	close(st.loopDone)
	ended := make(chan struct{})
	go func() {
		st.setupWG.Wait()
		close(ended)
	}()
	t := time.NewTimer(terminateWithin(a.cfg.KillAfter, 0) + process.ExecDrainWait)
	defer t.Stop()
	select {
	case <-ended:
	case <-t.C:
		a.log.Warn("a setup command did not end after it was killed")
	}
}

// setupResult is what one setup command's Exec came to. A command that
// could not start has no output of its own: the reason goes in its place.
func setupResult(code int, tail string, dur time.Duration, err error) wire.SetupResult {
	res := wire.SetupResult{Status: wire.SetupSucceeded, ExitCode: code, DurationMS: dur.Milliseconds(), OutputTail: tail}
	if err != nil || code != 0 {
		res.Status = wire.SetupFailed
	}
	if err != nil && tail == "" {
		res.OutputTail = process.ClipString(strings.ToValidUTF8(err.Error(), "\uFFFD"), wire.MaxTailBytes-len("…"))
	}
	return res
}

// hostSetupText is a --host-setup command as a setup result names it:
// valid UTF-8 within wire.MaxSetupTextBytes.
func hostSetupText(cmd string) string {
	cmd = strings.ToValidUTF8(cmd, "\uFFFD")
	if len(cmd) <= wire.MaxSetupTextBytes {
		return cmd
	}
	return process.ClipString(cmd, wire.MaxSetupTextBytes-len("…"))
}

// isHostSetupResult reports whether r is a --host-setup command's result
// (the control plane never queued it, so it has no command id).
func isHostSetupResult(r wire.SetupResult) bool { return r.CommandID == "" }

func (a *Agent) setupFinished(st *state, ev setupDone) {
	// Keep-alive counts from each setup command's start and end: one that
	// runs longer than --keep-alive is taken for hung.
	st.idleSince = a.now()
	st.setupResults = append(st.setupResults, ev.result)
	if ev.host {
		a.log.Info("host setup", "index", ev.index, "status", ev.result.Status, "exit_code", ev.result.ExitCode,
			"duration_ms", ev.result.DurationMS)
		switch {
		case ev.result.Status == wire.SetupFailed && st.adopting != "":
			a.adoptionFailed(st, ev)
		case ev.result.Status == wire.SetupFailed:
			st.hostSetupFailed(ev.index, ev.result)
			a.log.Error("host setup failed; staying in setup without claiming until a setup command repairs the host",
				"index", ev.index, "command", process.ClipString(ev.result.Command, 200), "exit_code", ev.result.ExitCode,
				"keep_alive", a.cfg.KeepAlive)
		case ev.index == len(st.hostSetup)-1:
			st.hostSetupSucceeded()
			a.adopted(st)
		default:
			st.hostSetupNextCommand(hostSetupText(st.hostSetup[ev.index+1]))
		}
	} else {
		st.commandEnded(ev.result.Status == wire.SetupSucceeded)
		a.log.Info("setup command", "command_id", ev.result.CommandID, "status", ev.result.Status, "exit_code", ev.result.ExitCode)
	}
	a.nextSetup(st)
}

// nextSetup starts the next control-plane setup command, if one waits and
// none runs, switching the phase to setup (heartbeat yes, claim no). They
// run after the host setup, and also after it failed: they are how an
// operator repairs the host. Once the queue is empty and one of them
// succeeded since the failure, the host setup reruns from the command that
// failed.
func (a *Agent) nextSetup(st *state) {
	if st.setupBusy || st.phase.leaving() {
		return
	}
	if len(st.setupQueue) == 0 {
		if st.hostSetupErr && st.hostSetupRerun {
			a.log.Info("a setup command succeeded; rerunning the host setup", "from_index", st.hostSetupNext)
			a.startHostSetup(st, st.hostSetupNext)
		}
		return
	}
	c := st.setupQueue[0]
	st.setupQueue = st.setupQueue[1:]
	st.idleSince = a.now()
	st.commandStarted("command_id " + c.CommandID)
	a.enter(st, phaseSetup)
	a.goSetup(st, func(ctx context.Context, report func(setupDone) bool) {
		res := setupResult(a.runner.Exec(ctx, c.Argv, a.cfg.Workdir))
		res.CommandID = c.CommandID
		report(setupDone{result: res})
	})
}
