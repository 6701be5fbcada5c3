package domain

import (
	"errors"
	"testing"
	"time"
)

// TestPollTransitionProjectionTable has one case per row of the seed's
// "Projection onto Worker.state" table, plus the flips it must never widen.
func TestPollTransitionProjectionTable(t *testing.T) {
	cases := []struct {
		name  string
		cur   WorkerState
		phase Phase
		want  WorkerState
	}{
		// The seed's table, row by row.
		{"absent: joining becomes active on the first poll", WorkerJoining, "", WorkerActive},
		{"absent: pending becomes active", WorkerPending, "", WorkerActive},
		{"absent: active stays active", WorkerActive, "", WorkerActive},
		{"setup writes setting_up", WorkerJoining, PhaseSetup, WorkerSettingUp},
		{"ready writes active", WorkerSettingUp, PhaseReady, WorkerActive},
		{"draining writes draining", WorkerActive, PhaseDraining, WorkerDraining},
		{"terminating writes draining", WorkerActive, PhaseTerminating, WorkerDraining},
		// Moves the existing rules allow.
		{"a setup command moves active back to setting_up", WorkerActive, PhaseSetup, WorkerSettingUp},
		{"absent keeps setting_up", WorkerSettingUp, "", WorkerSettingUp},
		// Never widened: draining is one-way.
		{"draining never returns to active", WorkerDraining, PhaseReady, WorkerDraining},
		{"draining never returns to setting_up", WorkerDraining, PhaseSetup, WorkerDraining},
		{"draining with no phase stays draining", WorkerDraining, "", WorkerDraining},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := PollTransition(c.cur, c.phase)
			if err != nil {
				t.Fatalf("PollTransition(%q, %q): %v", c.cur, c.phase, err)
			}
			if got != c.want {
				t.Fatalf("PollTransition(%q, %q) = %q, want %q", c.cur, c.phase, got, c.want)
			}
		})
	}
}

func TestPollTransitionNeverRevivesGone(t *testing.T) {
	for _, phase := range []Phase{"", PhaseSetup, PhaseReady, PhaseDraining, PhaseTerminating} {
		if _, err := PollTransition(WorkerGone, phase); !errors.Is(err, ErrGone) {
			t.Fatalf("phase %q revived a gone worker: err = %v", phase, err)
		}
	}
	for _, cur := range []WorkerState{WorkerActive, WorkerDraining} {
		if _, err := PollTransition(cur, "booting"); !errors.Is(err, ErrInvalid) {
			t.Fatalf("phase booting accepted on %s: %v", cur, err)
		}
	}
}

// TestProject has one case per rule of "computed on read".
func TestProject(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	const stale = 60 * time.Second
	fresh := now.Add(-10 * time.Second)
	old := now.Add(-61 * time.Second)
	cases := []struct {
		name string
		w    Worker
		want WorkerState
	}{
		{"stored state stands while heard from", Worker{State: WorkerActive, LastSeenAt: fresh}, WorkerActive},
		{"silence past stale_after reads stale", Worker{State: WorkerActive, LastSeenAt: old}, WorkerStale},
		{"exactly stale_after is not yet stale", Worker{State: WorkerActive, LastSeenAt: now.Add(-stale)}, WorkerActive},
		{"draining goes stale too", Worker{State: WorkerDraining, LastSeenAt: old}, WorkerStale},
		{"gone is never relabelled stale", Worker{State: WorkerGone, LastSeenAt: old}, WorkerGone},
		{"gone is never relabelled by a running host", Worker{State: WorkerGone, HostStatus: HostRunning, LastSeenAt: fresh}, WorkerGone},
		{"host stopped reads gone", Worker{State: WorkerActive, HostStatus: HostStopped, LastSeenAt: fresh}, WorkerGone},
		{"host terminated reads gone", Worker{State: WorkerActive, HostStatus: HostTerminated, LastSeenAt: fresh}, WorkerGone},
		{"host terminated beats stale", Worker{State: WorkerActive, HostStatus: HostTerminated, LastSeenAt: old}, WorkerGone},
		{"host pending keeps stored state", Worker{State: WorkerJoining, HostStatus: HostPending, LastSeenAt: fresh}, WorkerJoining},
		{"never seen pending row stays pending", Worker{State: WorkerPending}, WorkerPending},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Project(c.w, now, stale); got != c.want {
				t.Fatalf("Project = %q, want %q", got, c.want)
			}
		})
	}
}

func TestAcceptsWork(t *testing.T) {
	ready := Worker{State: WorkerActive, Phase: PhaseReady, MaxConcurrency: 2, CurrentInvocations: 1}
	cases := []struct {
		name  string
		w     Worker
		setup bool
		want  bool
	}{
		{"active and ready with room", ready, false, true},
		{"old daemon without phase", Worker{State: WorkerActive, MaxConcurrency: 1}, false, true},
		{"phase setup", with(ready, func(w *Worker) { w.Phase = PhaseSetup; w.State = WorkerSettingUp }), false, false},
		// The gate reads phase and state apart (defence in depth): a row
		// that says active while its daemon reports setup must not claim.
		{"state active, phase setup", with(ready, func(w *Worker) { w.Phase = PhaseSetup }), false, false},
		{"phase draining", with(ready, func(w *Worker) { w.Phase = PhaseDraining }), false, false},
		{"phase terminating", with(ready, func(w *Worker) { w.Phase = PhaseTerminating }), false, false},
		{"drain requested", with(ready, func(w *Worker) { w.State = WorkerDraining }), false, false},
		{"setup FIFO non-empty", ready, true, false},
		{"at capacity", with(ready, func(w *Worker) { w.CurrentInvocations = 2 }), false, false},
		{"over capacity", with(ready, func(w *Worker) { w.CurrentInvocations = 3 }), false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, why := AcceptsWork(c.w, c.setup)
			if got != c.want {
				t.Fatalf("AcceptsWork = %v (%s), want %v", got, why, c.want)
			}
			if !got && why == "" {
				t.Fatal("refusal without a reason")
			}
		})
	}
}

func with(w Worker, f func(*Worker)) Worker { f(&w); return w }

func TestHeldBy(t *testing.T) {
	inv := Invocation{Attempts: []Attempt{{Attempt: 1, WorkerID: "a"}, {Attempt: 2, WorkerID: "b"}}}
	if !inv.HeldBy("a", 1) || !inv.HeldBy("b", 2) || inv.HeldBy("a", 2) || inv.HeldBy("a", 3) {
		t.Fatal("HeldBy wrong")
	}
}

// TestRetiredHost: a worker whose host is stopped or terminated reads gone;
// it must also be treated as gone where the rules act — no claims, and its
// poll refused — not only where an operator reads it.
func TestRetiredHost(t *testing.T) {
	for _, host := range []HostStatus{HostStopped, HostTerminated} {
		w := Worker{State: WorkerActive, Phase: PhaseReady, HostStatus: host, MaxConcurrency: 1}
		if !Retired(w) {
			t.Errorf("host %s: not retired", host)
		}
		if ok, _ := AcceptsWork(w, false); ok {
			t.Errorf("host %s: accepts work", host)
		}
	}
	for _, w := range []Worker{{State: WorkerActive, HostStatus: HostRunning}, {State: WorkerActive}} {
		if Retired(w) {
			t.Errorf("%+v: retired", w)
		}
	}
	if !Retired(Worker{State: WorkerGone}) {
		t.Error("stored gone: not retired")
	}
}

// TestAckRecords: every state × attempt relation × outcome. Attempt 1 ran
// on a (superseded), attempt 2 runs on b (current).
func TestAckRecords(t *testing.T) {
	base := Invocation{State: StateRunning, Attempt: 2, WorkerID: "b",
		Attempts: []Attempt{{Attempt: 1, WorkerID: "a"}, {Attempt: 2, WorkerID: "b"}}}
	queued := base
	queued.State, queued.WorkerID = StateQueued, ""
	cancelAsked := base
	cancelAsked.CancelRequested = true
	done := base
	done.State = StateSucceeded
	cases := []struct {
		name     string
		inv      Invocation
		worker   string
		attempt  int
		state    InvocationState
		recorded bool
	}{
		{"current attempt succeeded", base, "b", 2, StateSucceeded, true},
		{"current attempt failed", base, "b", 2, StateFailed, true},
		{"current attempt cancelled, nobody asked", base, "b", 2, StateCancelled, false},
		{"current attempt cancelled, operator asked", cancelAsked, "b", 2, StateCancelled, true},
		{"superseded attempt succeeded first", base, "a", 1, StateSucceeded, true},
		{"superseded attempt failed first", base, "a", 1, StateFailed, true},
		{"superseded attempt cancelled", base, "a", 1, StateCancelled, false},
		{"superseded attempt cancelled, operator asked", cancelAsked, "a", 1, StateCancelled, false},
		{"requeued: late succeeded", queued, "b", 2, StateSucceeded, true},
		{"requeued: late cancelled", queued, "b", 2, StateCancelled, false},
		{"terminal: second outcome", done, "b", 2, StateFailed, false},
		{"terminal: cancelled", done, "b", 2, StateCancelled, false},
		{"another worker's attempt", base, "a", 2, StateSucceeded, false},
		{"an attempt that never ran", base, "b", 3, StateSucceeded, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.inv.AckRecords(c.worker, c.attempt, c.state); got != c.recorded {
				t.Fatalf("AckRecords = %v, want %v", got, c.recorded)
			}
		})
	}
}

func TestCancelReason(t *testing.T) {
	base := Invocation{State: StateRunning, Attempt: 2, WorkerID: "b"}
	asked := base
	asked.CancelRequested = true
	done := asked
	done.State = StateCancelled
	for _, c := range []struct {
		name, worker, want string
		inv                Invocation
	}{
		{"runs here", "b", "", base},
		{"operator cancel", "b", CancelOperator, asked},
		{"handed to another worker", "a", CancelSuperseded, base},
		{"operator cancel of another worker's attempt", "a", CancelSuperseded, asked},
		{"already terminal", "b", CancelSuperseded, done},
	} {
		if got := c.inv.CancelReason(c.worker); got != c.want {
			t.Errorf("%s: CancelReason = %q, want %q", c.name, got, c.want)
		}
	}
}
