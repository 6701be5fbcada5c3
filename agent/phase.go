package agent

import (
	"log/slog"
	"strconv"

	"github.com/dreamlake/lakeshore/agent/internal/health"
	"github.com/dreamlake/lakeshore/agent/internal/notify"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The daemon's phase machine, in one place: the phase, which phase may
// follow which (transitions), the one write of the phase (enter), the
// steps that move it (startDrain, terminate, maybeReady, endDrain), the
// setup phase's sub-states (setupProgress), and the claim gate
// (claimGate). The loop turns events into these moves; the health record,
// the service manager's notices and the polls read the phase from here
// (phase.health, phase.leaving, phase.String), and the run views hear the
// drain when the loop sees the phase leaving (gracePeriod).

// phase is the daemon's phase, sent on every poll as its wire name
// (String). Its zero value is booting.
type phase uint8

const (
	// phaseBooting: before the loop (state dir, machine id, spooled acks,
	// hello). Never sent.
	phaseBooting phase = iota
	// phaseSetup: the host setup, then control-plane setup commands, one
	// at a time; heartbeats go on, nothing is claimed.
	phaseSetup
	// phaseReady: the daemon claims work, up to --capacity.
	phaseReady
	// phaseDraining: no more claims; heartbeats go on and in-flight work
	// has the grace to finish.
	phaseDraining
	// phaseTerminating: every body still running (and a setup command) is
	// killed; outcomes are acked, bye is said, Run returns.
	phaseTerminating
)

// phaseNames are the phases' wire spellings.
var phaseNames = [...]string{
	phaseBooting:     wire.PhaseBooting,
	phaseSetup:       wire.PhaseSetup,
	phaseReady:       wire.PhaseReady,
	phaseDraining:    wire.PhaseDraining,
	phaseTerminating: wire.PhaseTerminating,
}

// String reports the phase's wire name (a poll's phase field).
func (p phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return "phase(" + strconv.Itoa(int(p)) + ")"
}

// LogValue logs the phase by its wire name.
func (p phase) LogValue() slog.Value { return slog.StringValue(p.String()) }

// transitions says which phase may follow which, and why. enter refuses
// every other move; a phase never follows itself. Draining and
// terminating are one-way: nothing leads back from them.
var transitions = map[phase]map[phase]string{
	phaseBooting: {
		phaseSetup: "hello was answered: the loop starts with the host setup (none: straight on to the checks for ready)",
	},
	phaseSetup: {
		phaseReady:       "the host setup succeeded, no setup command runs or waits, and the workdir is writable (maybeReady)",
		phaseDraining:    "a signal, --keep-alive, a drain command or a spot notice (startDrain); keep-alive here means the daemon could not become ready",
		phaseTerminating: endedEarly,
	},
	phaseReady: {
		phaseSetup:       "a control-plane setup command runs (nextSetup), or the idle daemon takes up an adoption and runs its host setup (adoptCommand)",
		phaseDraining:    "a signal, --keep-alive idleness, a drain command or a spot notice (startDrain)",
		phaseTerminating: endedEarly,
	},
	phaseDraining: {
		phaseTerminating: "nothing runs any more (endDrain), the grace expired, a second signal, or the control plane let go of the worker (terminate)",
	},
	phaseTerminating: {}, // the end: finish says bye and Run returns
}

// endedEarly is why setup or ready may lead straight to terminating.
const endedEarly = "the worker ended before any drain: replaced by another process, its re-hello failed or a stop cut it short, or a second signal came first (terminate)"

// may reports whether the phase machine allows next to follow p.
func (p phase) may(next phase) bool {
	_, ok := transitions[p][next]
	return ok
}

// leaving reports whether the daemon has begun to leave: no more claims,
// the grace running or over. Draining and terminating only lead on to
// each other, so once true it stays true. A service manager hears
// STOPPING=1 at the first such phase.
func (p phase) leaving() bool { return p == phaseDraining || p == phaseTerminating }

// claims reports whether the daemon claims work in phase p: only ready.
func (p phase) claims() bool { return p == phaseReady }

// health is the phase as the health record reads it: its name for
// /status, and why it keeps the daemon from counting as ready. A phase that
// claims nothing does not serve the queue: setup reads setup, draining and
// terminating read draining. Booting gives no reason of its own: the
// registration comes first (not_started, registering).
func (p phase) health() health.Phase {
	hp := health.Phase{Name: p.String()}
	switch {
	case p == phaseSetup:
		hp.NotReady = health.ReasonSetup
	case p.leaving():
		hp.NotReady = health.ReasonDraining
	}
	return hp
}

// enter moves the daemon to phase next: the one write of st.phase. The
// move is logged, told to the service manager (STOPPING=1 on the first
// leaving phase) and to the health record. It reports whether the phase
// changed: entering the phase it is in changes nothing, and a move the
// transition table does not allow is refused (logged as an error).
func (a *Agent) enter(st *state, next phase) bool {
	if next == st.phase {
		return false
	}
	if !st.phase.may(next) {
		a.log.Error("phase machine: refused a move it does not allow", "from", st.phase, "to", next, "worker_id", st.sess.workerID)
		return false
	}
	st.phase = next
	a.log.Info("phase", "phase", next, "worker_id", st.sess.workerID)
	a.notify.Phase(notify.PhaseChange{Phase: next.String(), Stopping: next.leaving(), Reason: st.exitReason(),
		WorkerID: st.sess.workerID, Inflight: len(st.runs)})
	a.health.SetPhase(next.health())
	return true
}

// maybeReady moves setup → ready once host setup succeeded, no setup
// command runs or waits and the workdir is writable.
func (a *Agent) maybeReady(st *state) {
	if st.phase != phaseSetup || !st.hostSetupOK || st.setupBusy || len(st.setupQueue) > 0 {
		return
	}
	if err := writable(a.cfg.Workdir); err != nil {
		a.log.Error("workdir not writable; staying in setup", "workdir", a.cfg.Workdir, "error", err.Error())
		return
	}
	a.enter(st, phaseReady)
}

// startDrain enters draining: no more claims, heartbeats go on, in-flight
// work has the grace period to finish (the loop starts its timer). It
// reports whether it did: from a phase that may not drain (draining,
// terminating: the daemon is already leaving) it is a no-op, and the bye
// reason of the drain under way stands.
func (a *Agent) startDrain(st *state, reason string) bool {
	if !st.phase.may(phaseDraining) {
		return false
	}
	st.byeReason = reason
	a.enter(st, phaseDraining)
	a.health.SetRunState(health.RunDraining)
	return true
}

// terminate ends the drain: every body still running is killed
// (SIGTERM to its process group, then SIGKILL after --kill-after) and,
// unless it had ended on its own first, abandoned to the control plane,
// which hands it out again after bye (finish). A setup command still
// running is killed with them. From terminating it is a no-op.
func (a *Agent) terminate(st *state) {
	if !st.phase.may(phaseTerminating) {
		return
	}
	if st.byeReason == "" {
		st.byeReason = wire.ByeSignal
	}
	a.enter(st, phaseTerminating)
	for _, r := range st.runs {
		r.run.Kill()
	}
	if st.stopSetup != nil {
		st.stopSetup()
	}
}

// endDrain moves draining → terminating once nothing runs: the drain has
// nothing left to wait for. It reports whether it did.
func (a *Agent) endDrain(st *state) bool {
	if st.phase != phaseDraining || len(st.runs) > 0 {
		return false
	}
	a.terminate(st)
	return true
}

// claim is what the claim gate answers.
type claim uint8

const (
	claimNo   claim = iota // the phase claims nothing: booting, setup, draining, terminating
	claimFull              // ready, every slot (--capacity) taken
	claimRoom              // ready, a slot free, bodies running
	claimIdle              // ready, nothing running
)

// may reports whether a poll now may claim work.
func (c claim) may() bool { return c == claimRoom || c == claimIdle }

// claimGate is the one rule for claiming: only a ready daemon claims, and
// only into a free slot. A run command it answers no to is refused (handed
// straight back), and a wake for work is ignored. Only an idle daemon
// (ready, nothing running) has its polls held (holdFor), polls at the
// slower wake interval (pollInterval) and takes up an adoption
// (adoptCommand). The health record's readiness is its phase part
// (phase.health).
func (a *Agent) claimGate(st *state) claim {
	switch {
	case !st.phase.claims():
		return claimNo
	case len(st.runs) >= a.cfg.Capacity:
		return claimFull
	case len(st.runs) == 0:
		return claimIdle
	}
	return claimRoom
}

// setupProgress is the setup phase's sub-states: what setup is doing and
// what must hold before ready may follow (maybeReady). Its fields are
// written only by the methods below, as the setup commands start and end.
type setupProgress struct {
	// setupBusy: a setup command (host or control-plane) runs. Only in
	// setup, or once the drain began (terminate kills it); maybeReady
	// waits for it. setupRunning names it as the log does.
	setupBusy    bool
	setupRunning string
	// hostSetupOK: every host setup command succeeded (or there is none);
	// maybeReady waits for it.
	hostSetupOK bool
	// hostSetupErr: a --host-setup command failed and is not being rerun.
	// The daemon stays in setup (never claims) but runs control-plane setup
	// commands, so an operator can repair the host; after one succeeds
	// (hostSetupRerun) the host setup reruns from hostSetupNext, the
	// command that failed. hostSetupFailure is what failed, reported again
	// to a new worker after a re-hello.
	hostSetupErr     bool
	hostSetupNext    int
	hostSetupFailure wire.SetupResult
	hostSetupRerun   bool
	// adopting: the host key whose adoption's host setup runs ("": none).
	// The idle ready daemon entered setup for it (adopt.go); a failed
	// command leaves it generic and ready may follow again.
	adopting string
}

// noHostSetup records that there is no host setup to run.
func (s *setupProgress) noHostSetup() { s.hostSetupOK = true }

// hostSetupStarted records the host setup running (again), from the
// command named running.
func (s *setupProgress) hostSetupStarted(running string) {
	s.setupBusy, s.setupRunning = true, running
	s.hostSetupErr, s.hostSetupRerun = false, false
}

// hostSetupNextCommand records the next host setup command running.
func (s *setupProgress) hostSetupNextCommand(running string) { s.setupRunning = running }

// hostSetupSucceeded records every host setup command succeeded.
func (s *setupProgress) hostSetupSucceeded() { s.setupBusy, s.hostSetupOK = false, true }

// hostSetupFailed records host setup command index failing with res: the
// daemon waits in setup for a repair.
func (s *setupProgress) hostSetupFailed(index int, res wire.SetupResult) {
	s.setupBusy = false
	s.hostSetupErr, s.hostSetupNext, s.hostSetupFailure = true, index, res
}

// commandStarted records a control-plane setup command running, named as
// the log names it.
func (s *setupProgress) commandStarted(running string) { s.setupBusy, s.setupRunning = true, running }

// commandEnded records a control-plane setup command's end: one that
// succeeded after a host setup failure lets the host setup rerun.
func (s *setupProgress) commandEnded(succeeded bool) {
	s.setupBusy = false
	if s.hostSetupErr && succeeded {
		s.hostSetupRerun = true
	}
}

// adoptionStarted records the adoption of key: its host setup must
// succeed before ready may follow.
func (s *setupProgress) adoptionStarted(key string) { s.adopting, s.hostSetupOK = key, false }

// adoptionEnded ends the adoption under way and reports its key: after a
// failed command the daemon stays generic, and ready may follow again.
func (s *setupProgress) adoptionEnded(failed bool) (key string) {
	key, s.adopting = s.adopting, ""
	if failed {
		s.setupBusy, s.hostSetupOK = false, true
	}
	return key
}
