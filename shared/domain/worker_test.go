package domain

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestHostStatusMoves(t *testing.T) {
	for _, tc := range []struct {
		from, to HostStatus
		want     bool
	}{
		{"", "running", true},
		{"", "pending", true},
		{"pending", "running", true},
		{"running", "pending", true},
		{"running", "running", false},
		{"running", "stopped", true},
		{"running", "terminated", true},
		{"stopped", "terminated", true},
		{"stopped", "running", false},
		{"stopped", "pending", false},
		{"terminated", "stopped", false},
		{"terminated", "running", false},
		{"running", "", false},
		{"running", "exploded", false},
	} {
		if got := HostStatusMoves(tc.from, tc.to); got != tc.want {
			t.Errorf("HostStatusMoves(%q, %q) = %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
}

// TestWorkerTransitions: every stored worker state (and a retired host) ×
// every event, the illegal ones included.
func TestWorkerTransitions(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	base := Worker{ID: "wrk_1", Lanes: []string{"q"}, MaxConcurrency: 2, CurrentInvocations: 1, LastSeenAt: now.Add(-time.Second)}
	states := map[WorkerState]Worker{}
	for _, s := range []WorkerState{WorkerPending, WorkerJoining, WorkerActive, WorkerSettingUp, WorkerDraining, WorkerGone} {
		w := base
		w.State = s
		states[s] = w
	}
	stopped := base
	stopped.State, stopped.HostStatus = WorkerActive, HostStopped
	states["active on a stopped host"] = stopped

	type got struct {
		code    Kind
		changed bool
		state   WorkerState
	}
	events := map[string]func(Worker) (Worker, got){
		"poll ready": func(w Worker) (Worker, got) {
			next, err := w.Heartbeat(Poll{Phase: PhaseReady, Queue: "q"}, now)
			return next, got{KindOf(err), err == nil, next.State}
		},
		"poll setup": func(w Worker) (Worker, got) {
			next, err := w.Heartbeat(Poll{Phase: PhaseSetup}, now)
			return next, got{KindOf(err), err == nil, next.State}
		},
		"poll another queue": func(w Worker) (Worker, got) {
			next, err := w.Heartbeat(Poll{Phase: PhaseReady, Queue: "other"}, now)
			return next, got{KindOf(err), err == nil, next.State}
		},
		"leave": func(w Worker) (Worker, got) {
			next, changed := w.Leave("bye: signal", now)
			return next, got{0, changed, next.State}
		},
		"drain": func(w Worker) (Worker, got) {
			next, changed, err := w.Drain()
			return next, got{KindOf(err), changed, next.State}
		},
		"host terminated": func(w Worker) (Worker, got) {
			next, changed := w.SetHostStatus(HostTerminated, now)
			return next, got{0, changed, next.State}
		},
	}
	gone, invalid, conflict := KindGone, KindInvalid, KindConflict
	A, S, D, G := WorkerActive, WorkerSettingUp, WorkerDraining, WorkerGone
	want := map[WorkerState]map[string]got{
		WorkerPending:   {"poll ready": {0, true, A}, "poll setup": {0, true, S}, "poll another queue": {invalid, false, WorkerPending}, "leave": {0, true, G}, "drain": {0, true, D}, "host terminated": {0, true, WorkerPending}},
		WorkerJoining:   {"poll ready": {0, true, A}, "poll setup": {0, true, S}, "poll another queue": {invalid, false, WorkerJoining}, "leave": {0, true, G}, "drain": {0, true, D}, "host terminated": {0, true, WorkerJoining}},
		WorkerActive:    {"poll ready": {0, true, A}, "poll setup": {0, true, S}, "poll another queue": {invalid, false, A}, "leave": {0, true, G}, "drain": {0, true, D}, "host terminated": {0, true, A}},
		WorkerSettingUp: {"poll ready": {0, true, A}, "poll setup": {0, true, S}, "poll another queue": {invalid, false, S}, "leave": {0, true, G}, "drain": {0, true, D}, "host terminated": {0, true, S}},
		WorkerDraining:  {"poll ready": {0, true, D}, "poll setup": {0, true, D}, "poll another queue": {invalid, false, D}, "leave": {0, true, G}, "drain": {0, false, D}, "host terminated": {0, true, D}},
		WorkerGone:      {"poll ready": {gone, false, G}, "poll setup": {gone, false, G}, "poll another queue": {gone, false, G}, "leave": {0, false, G}, "drain": {conflict, false, G}, "host terminated": {0, false, G}},
		"active on a stopped host": {"poll ready": {gone, false, A}, "poll setup": {gone, false, A}, "poll another queue": {gone, false, A},
			"leave": {0, true, G}, "drain": {conflict, false, A}, "host terminated": {0, true, A}},
	}
	for sname, w := range states {
		for ename, ev := range events {
			t.Run(string(sname)+"/"+ename, func(t *testing.T) {
				before := fmt.Sprintf("%+v", w)
				next, g := ev(w)
				if g != want[sname][ename] {
					t.Fatalf("got %+v, want %+v", g, want[sname][ename])
				}
				if fmt.Sprintf("%+v", w) != before {
					t.Fatal("the transition changed its receiver")
				}
				if next.Version != w.Version {
					t.Fatal("the transition moved the version (the store's job)")
				}
			})
		}
	}
	if len(want) != len(states) {
		t.Fatalf("%d states, %d rows", len(states), len(want))
	}
}

func TestWorkerTransitionDetails(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	w := Worker{ID: "wrk_1", State: WorkerActive, MaxConcurrency: 2, CurrentInvocations: 2, HostKey: "hk1_a", LastSeenAt: now.Add(-time.Minute)}

	two, four := 2, 4
	hb, _ := w.Heartbeat(Poll{Phase: PhaseReady, HostKey: "hk1_b", Capabilities: true, MaxConcurrency: &four, CurrentInvocations: &two}, now)
	if !hb.LastSeenAt.Equal(now) || hb.Phase != PhaseReady || hb.HostKey != "hk1_b" || hb.MaxConcurrency != 4 || hb.CurrentInvocations != 2 {
		t.Errorf("heartbeat with capabilities: %+v", hb)
	}
	old, _ := w.Heartbeat(Poll{Inflight: []string{"inv_1"}}, now)
	if old.CurrentInvocations != 1 || old.HostKey != "hk1_a" || old.MaxConcurrency != 2 {
		t.Errorf("heartbeat of an old daemon (no capabilities, one listed): %+v", old)
	}

	left, _ := w.Leave("bye: idle", now)
	if left.CurrentInvocations != 0 || left.GoneWhy != "bye: idle" || !left.GoneAt.Equal(now) || !left.LastSeenAt.Equal(now) {
		t.Errorf("leave: %+v", left)
	}

	st, _ := w.SetHostStatus(HostStopped, now)
	if st.HostStatus != HostStopped || !st.GoneAt.Equal(now) || Project(st, now, time.Hour) != WorkerGone {
		t.Errorf("host stopped: %+v reads %s", st, Project(st, now, time.Hour))
	}
	later, changed := st.SetHostStatus(HostTerminated, now.Add(time.Minute))
	if !changed || !later.GoneAt.Equal(now) {
		t.Errorf("stopped → terminated keeps when it went gone: %+v", later)
	}
	if _, changed := st.SetHostStatus(HostRunning, now); changed {
		t.Error("a stopped host came back to running")
	}

	reboot, _ := w.Retire(EndGone, "a new boot", now.Add(time.Minute))
	if reboot.State != WorkerGone || !reboot.LastSeenAt.Equal(w.LastSeenAt) || !reboot.GoneAt.Equal(now.Add(time.Minute)) {
		t.Errorf("retire: %+v; want gone, last seen when it was last heard, retired now", reboot)
	}
	r, changed := left.Reap()
	if !changed || !r.Reaped {
		t.Errorf("reap: %+v", r)
	}
	if _, changed := r.Reap(); changed {
		t.Error("reaped twice")
	}

	for _, c := range []struct {
		name string
		w    Worker
		lost bool
		why  Loss
	}{
		{"fresh", w, false, Loss{}},
		{"stale", Worker{State: WorkerActive, LastSeenAt: now.Add(-2 * time.Minute)}, true, Loss{EndStale, "worker stale: silent for 2m0s"}},
		{"bye", left, true, Loss{EndBye, "worker gone: bye: idle"}},
		{"new boot", reboot, true, Loss{EndGone, "worker gone: a new boot"}},
		{"gone, reason unknown", Worker{State: WorkerGone}, true, Loss{EndGone, "worker gone"}},
		{"host stopped", st, true, Loss{EndGone, "worker gone: host stopped"}},
		{"reaped", r, false, Loss{}},
	} {
		why, lost := c.w.LostWhy(now, time.Minute)
		if lost != c.lost || why != c.why {
			t.Errorf("%s: LostWhy = %+v %v, want %+v %v", c.name, why, lost, c.why, c.lost)
		}
	}
}

// TestStateWhy: a stale or gone worker's view says since when and why.
func TestStateWhy(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	seen := now.Add(-80 * time.Second)
	for _, c := range []struct {
		name  string
		w     Worker
		since time.Time
		why   string
	}{
		{"active", Worker{State: WorkerActive, LastSeenAt: now}, time.Time{}, ""},
		{"stale", Worker{State: WorkerActive, LastSeenAt: seen}, seen, "silent for 1m20s; stale after 1m0s"},
		{"retired", Worker{State: WorkerGone, LastSeenAt: seen, GoneAt: now, GoneWhy: "machine m said hello from a new boot"}, now, "machine m said hello from a new boot"},
		{"host stopped", Worker{State: WorkerActive, LastSeenAt: now, GoneAt: now, HostStatus: HostStopped}, now, "its host is stopped"},
		{"gone, no reason", Worker{State: WorkerGone, LastSeenAt: seen}, seen, "gone"},
	} {
		since, why := StateWhy(c.w, now, time.Minute)
		if !since.Equal(c.since) || why != c.why {
			t.Errorf("%s: StateWhy = %v %q, want %v %q", c.name, since, why, c.since, c.why)
		}
	}
}

func TestRegistration(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	four := 4
	r := Registration{MachineID: "m1", BootID: "b1", Label: "l", Lanes: []string{"q"}, HostKey: "hk1_a", MaxConcurrency: &four}
	w := NewWorker("wrk_1", r, "h1", now)
	if w.State != WorkerJoining || w.MaxConcurrency != 4 || w.CurrentInvocations != 0 || w.TokenHash != "h1" ||
		!w.CreatedAt.Equal(now) || !w.LastSeenAt.Equal(now) || w.MachineID != "m1" || w.HostKey != "hk1_a" || w.Version != 0 {
		t.Errorf("NewWorker = %+v", w)
	}
	if d := NewWorker("wrk_2", Registration{MachineID: "m2", BootID: "b"}, "h", now); d.MaxConcurrency != 1 {
		t.Errorf("no capabilities: capacity %d, want 1", d.MaxConcurrency)
	}
	active := w
	active.State = WorkerActive
	later := now.Add(time.Minute)
	again := active.Register(Registration{MachineID: "m1", BootID: "b1", Label: "l2"}, "h2", later)
	if again.State != WorkerActive || again.TokenHash != "h2" || again.Label != "l2" || !again.LastSeenAt.Equal(later) ||
		!again.CreatedAt.Equal(now) || again.MaxConcurrency != 1 {
		t.Errorf("Register (a retried hello) = %+v", again)
	}
	if _, err := active.AddSetup("cmd_1", []string{"true"}, now); err != nil {
		t.Errorf("AddSetup to an active worker: %v", err)
	}
	gone, _ := active.Leave("bye", now)
	if _, err := gone.AddSetup("cmd_1", []string{"true"}, now); !errors.Is(err, ErrConflict) {
		t.Errorf("AddSetup to a gone worker: %v, want a conflict", err)
	}
}

func TestWorkerSmallRules(t *testing.T) {
	for _, c := range []struct {
		w      Worker
		ask    bool
		phases map[Phase]bool // phase → owes a drain
	}{
		{Worker{State: WorkerActive}, true, map[Phase]bool{"": false, PhaseReady: false}},
		{Worker{State: WorkerDraining}, true, map[Phase]bool{"": true, PhaseReady: true, PhaseSetup: true, PhaseDraining: false, PhaseTerminating: false}},
		{Worker{State: WorkerGone}, false, map[Phase]bool{PhaseReady: false}},
		{Worker{State: WorkerActive, HostStatus: HostStopped}, true, map[Phase]bool{PhaseReady: false}},
		{Worker{State: WorkerActive, HostStatus: HostTerminated}, false, map[Phase]bool{PhaseReady: false}},
	} {
		if got := c.w.HostStatusMayChange(); got != c.ask {
			t.Errorf("%+v: HostStatusMayChange = %v, want %v", c.w, got, c.ask)
		}
		for phase, want := range c.phases {
			if got := c.w.OwesDrain(phase); got != want {
				t.Errorf("%+v: OwesDrain(%q) = %v, want %v", c.w, phase, got, want)
			}
		}
	}
}

// TestReplacedWorker: a worker replaced by another boot of its machine is
// refused with reason replaced (never a re-hello), keeps its last_seen_at,
// and once it polls again the conflict is on record, once.
func TestReplacedWorker(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	w := Worker{ID: "w", MachineID: "m", State: WorkerActive, LastSeenAt: now.Add(-time.Second)}
	r, changed := w.Replace("boot-2", "machine m said hello from a new boot", now)
	if !changed || r.ReplacedBy != "boot-2" || r.State != WorkerGone || !r.LastSeenAt.Equal(w.LastSeenAt) {
		t.Fatalf("replace: %+v", r)
	}
	_, err := r.Heartbeat(Poll{}, now)
	var de *Error
	if !errors.As(err, &de) || de.Kind != KindGone || de.Reason != GoneReplaced || !strings.Contains(de.Message, "boot-2") {
		t.Fatalf("heartbeat of a replaced worker: %v", err)
	}
	c, changed := r.ReplacedAlive()
	if !changed || !c.MachineConflict || !strings.Contains(c.GoneWhy, "another process uses machine id m") {
		t.Fatalf("replaced alive: %+v", c)
	}
	if _, again := c.ReplacedAlive(); again {
		t.Error("the conflict was recorded twice")
	}
	if _, changed := w.ReplacedAlive(); changed {
		t.Error("a worker nobody replaced recorded a conflict")
	}
	// A plainly gone worker's refusal names why, never an empty field.
	left, _ := w.Leave("bye: idle", now)
	if _, err := left.Heartbeat(Poll{}, now); err == nil || err.Error() != "worker is gone (bye: idle); say hello again" {
		t.Errorf("heartbeat of a worker that left: %v", err)
	}
}

// TestLostWhyByRetirementKind: a retired worker's work is handed back as
// the kind it was retired as, whatever its reason says: a bye whose reason
// does not start with "bye" is a bye, and another retirement whose reason
// does is not.
func TestLostWhyByRetirementKind(t *testing.T) {
	now := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	w := Worker{ID: "w", State: WorkerActive, LastSeenAt: now, MaxConcurrency: 1}
	left, _ := w.Leave("signal", now)
	if loss, ok := left.LostWhy(now, time.Minute); !ok || loss.Kind != EndBye {
		t.Errorf("a bye with reason %q: %+v %v; want bye", left.GoneWhy, loss, ok)
	}
	retired, _ := w.Retire(EndGone, "bye-bye: the provisioner let its host go", now)
	if loss, ok := retired.LostWhy(now, time.Minute); !ok || loss.Kind != EndGone {
		t.Errorf("a retirement whose reason starts with bye: %+v %v; want gone", loss, ok)
	}
}

// TestMayHandBack: the one rule for a requeued ack. A worker stored
// draining, a retired one and an ack with no phase are accepted as they
// are; an ack saying draining or terminating is accepted and stores its
// worker draining in that phase; setup or ready from a worker not stored
// draining is a conflict; an unknown phase is invalid.
func TestMayHandBack(t *testing.T) {
	const refused, unchanged, drains = "refused", "unchanged", "drains"
	for _, c := range []struct {
		state WorkerState
		host  HostStatus
		phase Phase
		want  string
	}{
		{WorkerActive, "", "", unchanged},
		{WorkerActive, "", PhaseReady, refused},
		{WorkerActive, "", PhaseSetup, refused},
		{WorkerSettingUp, "", PhaseSetup, refused},
		{WorkerJoining, "", PhaseReady, refused},
		{WorkerActive, "", PhaseDraining, drains},
		{WorkerActive, "", PhaseTerminating, drains},
		{WorkerSettingUp, "", PhaseDraining, drains},
		{WorkerDraining, "", PhaseReady, unchanged},
		{WorkerDraining, "", "", unchanged},
		{WorkerDraining, "", PhaseDraining, unchanged},
		{WorkerGone, "", PhaseReady, unchanged},
		{WorkerGone, "", PhaseDraining, unchanged},
		{WorkerActive, HostTerminated, PhaseReady, unchanged},
		{WorkerActive, "", "sleeping", "invalid"},
	} {
		w := Worker{ID: "wrk_1", State: c.state, Phase: PhaseReady, HostStatus: c.host}
		next, changed, err := w.MayHandBack(c.phase)
		got := unchanged
		switch {
		case KindOf(err) == KindConflict:
			got = refused
		case KindOf(err) == KindInvalid:
			got = "invalid"
		case err != nil:
			got = err.Error()
		case changed:
			got = drains
			if next.State != WorkerDraining || next.Phase != c.phase {
				t.Errorf("%s/%s phase %q: stored %s in phase %q, want draining in phase %q", c.state, c.host, c.phase, next.State, next.Phase, c.phase)
			}
		}
		if got != c.want {
			t.Errorf("%s/%s phase %q: %s (%v), want %s", c.state, c.host, c.phase, got, err, c.want)
		}
		if !changed && next.State != w.State {
			t.Errorf("%s/%s phase %q: state %s without a change", c.state, c.host, c.phase, next.State)
		}
	}
}

// TestWorkerCloneSharesNothing: every map, slice and pointer of a Worker
// (and of what it points to) is copied by Clone, found by reflection so a
// field added later is held to it too.
func TestWorkerCloneSharesNothing(t *testing.T) {
	w := Worker{}
	fill(reflect.ValueOf(&w).Elem())
	c := w.Clone()
	if !reflect.DeepEqual(c, w) {
		t.Fatalf("clone differs:\n%+v\n%+v", c, w)
	}
	for _, p := range shared(reflect.ValueOf(w), reflect.ValueOf(c), "Worker") {
		t.Errorf("Clone shares %s with the original", p)
	}
}

// fill sets every field of v, and of what its pointers, maps and slices
// hold, to a non-zero value.
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i))
			}
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem())
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k)
		fill(e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0))
		v.Set(s)
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64, reflect.Int32:
		if v.Type() == reflect.TypeFor[time.Duration]() {
			v.SetInt(int64(time.Second))
		} else {
			v.SetInt(1)
		}
	}
}

// shared lists the paths at which a and b (equal values) hold the same
// map, slice or pointer.
func shared(a, b reflect.Value, path string) []string {
	var out []string
	switch a.Kind() {
	case reflect.Struct:
		for i := range a.NumField() {
			if a.Type().Field(i).IsExported() {
				out = append(out, shared(a.Field(i), b.Field(i), path+"."+a.Type().Field(i).Name)...)
			}
		}
	case reflect.Pointer, reflect.Map, reflect.Slice:
		if !a.IsNil() && a.UnsafePointer() == b.UnsafePointer() {
			out = append(out, path)
		}
		if a.Kind() == reflect.Pointer && !a.IsNil() {
			out = append(out, shared(a.Elem(), b.Elem(), path)...)
		}
	}
	return out
}
