package agent

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/health"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

var allPhases = []phase{phaseBooting, phaseSetup, phaseReady, phaseDraining, phaseTerminating}

// newPhaseAgent is an agent with just what the phase machine touches: a
// log, a health record and --capacity.
func newPhaseAgent(capacity int) *Agent {
	return &Agent{cfg: Config{Capacity: capacity}, log: slog.New(slog.DiscardHandler),
		health: health.New(clock.Clock{}, health.Options{})}
}

// stateIn is a loop state in phase p with n bodies running.
func stateIn(p phase, n int) *state {
	st := &state{phase: p, runs: map[string]*running{}}
	for i := range n {
		st.runs[fmt.Sprintf("inv_%d", i)] = &running{}
	}
	return st
}

// TestPhaseTransitions: every move the phase machine allows is taken (and
// the health record reads the new phase); every other is refused and
// changes nothing. The allowed moves are spelled out here, apart from the
// table they check.
func TestPhaseTransitions(t *testing.T) {
	allowed := map[[2]phase]bool{
		{phaseBooting, phaseSetup}:        true,
		{phaseSetup, phaseReady}:          true,
		{phaseSetup, phaseDraining}:       true,
		{phaseSetup, phaseTerminating}:    true,
		{phaseReady, phaseSetup}:          true,
		{phaseReady, phaseDraining}:       true,
		{phaseReady, phaseTerminating}:    true,
		{phaseDraining, phaseTerminating}: true,
	}
	for _, from := range allPhases {
		for _, to := range allPhases {
			a, st := newPhaseAgent(1), stateIn(from, 0)
			changed := a.enter(st, to)
			want := allowed[[2]phase{from, to}]
			if changed != want {
				t.Errorf("%s → %s: enter %v, want %v", from, to, changed, want)
			}
			if want && st.phase != to || !want && st.phase != from {
				t.Errorf("%s → %s: phase now %s", from, to, st.phase)
			}
			if got := a.health.Snapshot().Phase; want && got != to.String() {
				t.Errorf("%s → %s: health reads phase %q", from, to, got)
			}
			if why := transitions[from][to]; want && why == "" {
				t.Errorf("%s → %s: the table gives no reason", from, to)
			}
		}
	}
	for _, p := range allPhases {
		if p.String() == "" || p.String() != phaseNames[p] {
			t.Errorf("phase %d spells %q", p, p.String())
		}
	}
	if phaseSetup.String() != wire.PhaseSetup || phaseTerminating.String() != wire.PhaseTerminating {
		t.Errorf("phases do not spell their wire names")
	}
}

// TestStartDrainGuardsItself: a drain starts from setup or ready, with its
// bye reason; once the daemon is leaving a second start is a no-op and
// the first drain's reason stands — from terminating too.
func TestStartDrainGuardsItself(t *testing.T) {
	for _, from := range []phase{phaseSetup, phaseReady} {
		a, st := newPhaseAgent(1), stateIn(from, 0)
		if !a.startDrain(st, wire.ByeIdle) || st.phase != phaseDraining || st.byeReason != wire.ByeIdle {
			t.Errorf("startDrain from %s: phase %s, reason %q; want draining, idle", from, st.phase, st.byeReason)
		}
		if a.health.Snapshot().RunState != health.RunDraining {
			t.Errorf("startDrain from %s: run state %q", from, a.health.Snapshot().RunState)
		}
	}
	for _, from := range []phase{phaseDraining, phaseTerminating} {
		a, st := newPhaseAgent(1), stateIn(from, 0)
		st.byeReason = wire.ByeSignal
		if a.startDrain(st, wire.ByeDrain) || st.phase != from || st.byeReason != wire.ByeSignal {
			t.Errorf("startDrain from %s: phase %s, reason %q; want a no-op", from, st.phase, st.byeReason)
		}
	}
	a, st := newPhaseAgent(1), stateIn(phaseBooting, 0)
	if a.startDrain(st, wire.ByeSignal) || st.phase != phaseBooting || st.byeReason != "" {
		t.Errorf("startDrain from booting: phase %s, reason %q; want a no-op", st.phase, st.byeReason)
	}
}

// TestTerminateAndEndDrain: terminate leaves from setup, ready or
// draining (a bye reason of signal unless one was given) and is a no-op
// from terminating; the drain ends by itself only when nothing runs.
func TestTerminateAndEndDrain(t *testing.T) {
	for _, from := range []phase{phaseSetup, phaseReady, phaseDraining} {
		a, st := newPhaseAgent(1), stateIn(from, 0)
		a.terminate(st)
		if st.phase != phaseTerminating || st.byeReason != wire.ByeSignal {
			t.Errorf("terminate from %s: phase %s, reason %q", from, st.phase, st.byeReason)
		}
	}
	a, st := newPhaseAgent(1), stateIn(phaseTerminating, 0)
	st.byeReason = wire.ByeHelloFailed
	a.terminate(st)
	if st.phase != phaseTerminating || st.byeReason != wire.ByeHelloFailed {
		t.Errorf("terminate from terminating: phase %s, reason %q; want a no-op", st.phase, st.byeReason)
	}

	a, st = newPhaseAgent(2), stateIn(phaseDraining, 1)
	if a.endDrain(st) || st.phase != phaseDraining {
		t.Errorf("endDrain with a body running: phase %s; want draining", st.phase)
	}
	delete(st.runs, "inv_0")
	if !a.endDrain(st) || st.phase != phaseTerminating {
		t.Errorf("endDrain with nothing running: phase %s; want terminating", st.phase)
	}
	if a, st := newPhaseAgent(1), stateIn(phaseReady, 0); a.endDrain(st) || st.phase != phaseReady {
		t.Errorf("endDrain while ready: phase %s; want ready", st.phase)
	}
}

// TestClaimGate: each phase × how much runs (capacity 2): only a ready
// daemon claims, into a free slot; idle only when nothing runs. holdFor
// (a held poll) follows the gate's idle answer.
func TestClaimGate(t *testing.T) {
	for _, p := range allPhases {
		for _, running := range []int{0, 1, 2} {
			want := claimNo
			if p == phaseReady {
				want = []claim{claimIdle, claimRoom, claimFull}[running]
			}
			a, st := newPhaseAgent(2), stateIn(p, running)
			st.sess.longPoll = 5 * time.Second
			got := a.claimGate(st)
			if got != want {
				t.Errorf("%s, %d running: gate %d, want %d", p, running, got, want)
			}
			if mayWant := p == phaseReady && running < 2; got.may() != mayWant {
				t.Errorf("%s, %d running: may claim %v, want %v", p, running, got.may(), mayWant)
			}
			if hold := a.holdFor(st); (hold > 0) != (p == phaseReady && running == 0) {
				t.Errorf("%s, %d running: held for %s", p, running, hold)
			}
		}
	}
}

// TestPhaseHealth: the health record's readiness follows the phase
// machine: a daemon otherwise serving reads setup in setup, draining once
// it leaves, and ready only when ready.
func TestPhaseHealth(t *testing.T) {
	want := map[phase]string{
		phaseSetup:       health.ReasonSetup,
		phaseReady:       health.ReasonReady,
		phaseDraining:    health.ReasonDraining,
		phaseTerminating: health.ReasonDraining,
	}
	for p, reason := range want {
		h := health.New(clock.Clock{}, health.Options{})
		h.SetRunState(health.RunPolling)
		h.Registered("wrk_1", "", "q")
		h.PollerRunning(true)
		h.Tick()
		h.RequestStarted(health.RolePoll)(true)
		h.SetPhase(p.health())
		if s := h.Snapshot(); s.ReadyReason != reason || s.Phase != p.String() {
			t.Errorf("%s: ready reason %q, phase %q; want %q", p, s.ReadyReason, s.Phase, reason)
		}
	}
	if r := phaseBooting.health().NotReady; r != "" {
		t.Errorf("booting gives ready reason %q; want none (registration comes first)", r)
	}
}

// TestMaybeReady: setup → ready only once the host setup succeeded, no
// setup command runs or waits and the workdir is writable; the setup
// sub-states move as their commands start and end (a host setup failure
// waits for a repairing command; a failed adoption leaves the daemon
// generic, free to be ready again).
func TestMaybeReady(t *testing.T) {
	dir := t.TempDir()
	fresh := func() (*Agent, *state) {
		a, st := newPhaseAgent(1), stateIn(phaseSetup, 0)
		a.cfg.Workdir = dir
		return a, st
	}
	for _, c := range []struct {
		name  string
		setup func(a *Agent, st *state)
		ready bool
	}{
		{"no host setup", func(a *Agent, st *state) { st.noHostSetup() }, true},
		{"host setup running", func(a *Agent, st *state) { st.hostSetupStarted("true") }, false},
		{"host setup succeeded", func(a *Agent, st *state) { st.hostSetupStarted("true"); st.hostSetupSucceeded() }, true},
		{"host setup failed", func(a *Agent, st *state) {
			st.hostSetupStarted("false")
			st.hostSetupFailed(0, wire.SetupResult{Status: wire.SetupFailed})
		}, false},
		{"a setup command runs", func(a *Agent, st *state) { st.noHostSetup(); st.commandStarted("command_id c1") }, false},
		{"a setup command ended", func(a *Agent, st *state) {
			st.noHostSetup()
			st.commandStarted("command_id c1")
			st.commandEnded(false)
		}, true},
		{"a setup command waits", func(a *Agent, st *state) { st.noHostSetup(); st.setupQueue = []wire.Command{{CommandID: "c2"}} }, false},
		{"the workdir is not writable", func(a *Agent, st *state) {
			st.noHostSetup()
			a.cfg.Workdir = dir + "/missing"
		}, false},
		{"an adoption runs", func(a *Agent, st *state) { st.noHostSetup(); st.adoptionStarted("hk1_x"); st.hostSetupStarted("x") }, false},
		{"an adoption failed", func(a *Agent, st *state) {
			st.noHostSetup()
			st.adoptionStarted("hk1_x")
			st.hostSetupStarted("x")
			if key := st.adoptionEnded(true); key != "hk1_x" {
				t.Errorf("adoption ended with key %q", key)
			}
		}, true},
	} {
		a, st := fresh()
		c.setup(a, st)
		a.maybeReady(st)
		if (st.phase == phaseReady) != c.ready {
			t.Errorf("%s: phase %s, want ready %v", c.name, st.phase, c.ready)
		}
	}

	// A host setup failure reruns only after a control-plane command
	// succeeded.
	_, st := fresh()
	st.hostSetupStarted("false")
	st.hostSetupFailed(2, wire.SetupResult{Status: wire.SetupFailed})
	st.commandStarted("command_id c1")
	st.commandEnded(false)
	if st.hostSetupRerun {
		t.Error("a failed command lets the host setup rerun")
	}
	st.commandStarted("command_id c2")
	st.commandEnded(true)
	if !st.hostSetupRerun || st.hostSetupNext != 2 {
		t.Errorf("after a repair: rerun %v from %d; want a rerun from 2", st.hostSetupRerun, st.hostSetupNext)
	}
	st.hostSetupStarted("false")
	if st.hostSetupErr || st.hostSetupRerun || !st.setupBusy {
		t.Errorf("the rerun started: err %v, rerun %v, busy %v", st.hostSetupErr, st.hostSetupRerun, st.setupBusy)
	}
}
