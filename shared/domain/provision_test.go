package domain

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPlanLaunches(t *testing.T) {
	a := ProvisionKey{"q", "hk1_a"}
	b := ProvisionKey{"q", "hk1_b"}
	kc, kd, ke := ProvisionKey{"q", "hk1_c"}, ProvisionKey{"q", "hk1_d"}, ProvisionKey{"q", "hk1_e"}
	generic := ProvisionKey{"q", ""}
	lim := ProvisionLimits{MaxHosts: 100, SlotsPerHost: 4}
	for _, c := range []struct {
		name   string
		demand []Demand
		fleet  Fleet
		lim    ProvisionLimits
		want   map[ProvisionKey]int
	}{
		{"off", []Demand{{a, 20}}, Fleet{}, ProvisionLimits{SlotsPerHost: 4}, map[ProvisionKey]int{}},
		{"no work, no hosts", nil, Fleet{}, lim, map[ProvisionKey]int{}},
		{"20 for one key, 4 a host", []Demand{{a, 20}}, Fleet{}, lim, map[ProvisionKey]int{a: 5}},
		{"capped at 2", []Demand{{a, 20}}, Fleet{}, ProvisionLimits{MaxHosts: 2, SlotsPerHost: 4}, map[ProvisionKey]int{a: 2}},
		{"free slots count first", []Demand{{a, 20}}, Fleet{Free: map[ProvisionKey]int{a: 7}}, lim, map[ProvisionKey]int{a: 4}},
		{"pending hosts count", []Demand{{a, 20}}, Fleet{Pending: map[ProvisionKey]int{a: 3}, Hosts: map[ProvisionKey]int{a: 3}}, lim, map[ProvisionKey]int{a: 2}},
		{"all served", []Demand{{a, 8}}, Fleet{Pending: map[ProvisionKey]int{a: 2}, Hosts: map[ProvisionKey]int{a: 2}}, lim, map[ProvisionKey]int{}},
		{"the cap counts hosts alive", []Demand{{a, 40}}, Fleet{Hosts: map[ProvisionKey]int{b: 9}}, ProvisionLimits{MaxHosts: 10, SlotsPerHost: 4}, map[ProvisionKey]int{a: 1}},
		{"per-key cap", []Demand{{a, 40}, {b, 4}}, Fleet{}, ProvisionLimits{MaxHosts: 100, MaxHostsPerKey: 3, SlotsPerHost: 4}, map[ProvisionKey]int{a: 3, b: 1}},
		{"fair under the cap", []Demand{{a, 400}, {b, 400}, {generic, 4}}, Fleet{}, ProvisionLimits{MaxHosts: 5, SlotsPerHost: 4},
			map[ProvisionKey]int{generic: 1, a: 2, b: 2}},
		// A burst of 5 keys × 10 under caps of 10 / 4 a key, a first pass
		// having seen only 8 of a's: a's 2 hosts count, so the others
		// catch up first and the shares come out 2 each.
		{"fair across passes", []Demand{{a, 10}, {b, 10}, {kc, 10}, {kd, 10}, {ke, 10}},
			Fleet{Pending: map[ProvisionKey]int{a: 2}, Hosts: map[ProvisionKey]int{a: 2}},
			ProvisionLimits{MaxHosts: 10, MaxHostsPerKey: 4, SlotsPerHost: 4}, map[ProvisionKey]int{b: 2, kc: 2, kd: 2, ke: 2}},
		{"the fewest first", []Demand{{a, 40}, {b, 40}}, Fleet{Hosts: map[ProvisionKey]int{a: 3}},
			ProvisionLimits{MaxHosts: 7, SlotsPerHost: 4}, map[ProvisionKey]int{a: 1, b: 3}},
	} {
		if got := PlanLaunches(c.demand, c.fleet, c.lim); !maps.Equal(got, c.want) {
			t.Errorf("%s: plan %v, want %v", c.name, got, c.want)
		}
	}
}

// TestPlanLaunchesPerKeyCapCountsHostsAlive: MaxHostsPerKey caps the hosts
// a key has alive (pending or working) plus those planned, not only those
// one pass plans: a key already at its cap gets no more, however much of
// its work waits, and one below it gets only the difference.
func TestPlanLaunchesPerKeyCapCountsHostsAlive(t *testing.T) {
	a, b := ProvisionKey{"q", "hk1_a"}, ProvisionKey{"q", "hk1_b"}
	lim := ProvisionLimits{MaxHosts: 100, MaxHostsPerKey: 3, SlotsPerHost: 4}
	for _, c := range []struct {
		name  string
		fleet Fleet
		want  map[ProvisionKey]int
	}{
		{"two alive: one more", Fleet{Hosts: map[ProvisionKey]int{a: 2}}, map[ProvisionKey]int{a: 1, b: 3}},
		{"at the cap: none", Fleet{Hosts: map[ProvisionKey]int{a: 3}}, map[ProvisionKey]int{b: 3}},
		{"pending ones count", Fleet{Pending: map[ProvisionKey]int{a: 1}, Hosts: map[ProvisionKey]int{a: 3, b: 1}},
			map[ProvisionKey]int{b: 2}},
	} {
		// 40 queued each: 10 hosts' worth, far past the cap.
		got := PlanLaunches([]Demand{{a, 40}, {b, 40}}, c.fleet, lim)
		if !maps.Equal(got, c.want) {
			t.Errorf("%s: plan %v, want %v", c.name, got, c.want)
		}
	}
}

// adoptable is an idle generic worker of queue q that said hello with
// adopt_host_setup, seen at now.
func adoptable(id, q string, capacity int, now time.Time) Worker {
	return Worker{ID: id, MachineID: "m-" + id, BootID: "b", State: WorkerActive, Phase: PhaseReady, Lanes: []string{q},
		MaxConcurrency: capacity, AdoptHostSetup: true, LastSeenAt: now}
}

func TestPlanAdoptions(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	a, b := ProvisionKey{"q", "hk1_a"}, ProvisionKey{"q", "hk1_b"}
	busy := adoptable("w-busy", "q", 4, now)
	busy.CurrentInvocations = 1
	keyed := adoptable("w-keyed", "q", 4, now)
	keyed.HostKey = "hk1_c"
	stale := adoptable("w-stale", "q", 4, now.Add(-time.Hour))
	notAsked := adoptable("w-no", "q", 4, now)
	notAsked.AdoptHostSetup = false
	failedA := adoptable("w-failed", "q", 4, now)
	failedA.Adoption = &Adoption{HostKey: a.HostKey, Queue: "q", Failed: "its host setup failed"}
	other := adoptable("w-other", "other", 4, now)
	for _, c := range []struct {
		name    string
		demand  []Demand
		fleet   Fleet
		workers []Worker
		want    []AdoptionAsk
	}{
		{"no keyed work", []Demand{{ProvisionKey{"q", ""}, 0}}, Fleet{}, []Worker{adoptable("w1", "q", 4, now)}, nil},
		{"one worker covers 4", []Demand{{a, 3}}, Fleet{}, []Worker{adoptable("w1", "q", 4, now), adoptable("w2", "q", 4, now)},
			[]AdoptionAsk{{"w1", a}}},
		{"two for 6", []Demand{{a, 6}}, Fleet{}, []Worker{adoptable("w2", "q", 4, now), adoptable("w1", "q", 4, now)},
			[]AdoptionAsk{{"w1", a}, {"w2", a}}},
		{"round-robin across keys", []Demand{{b, 40}, {a, 40}}, Fleet{},
			[]Worker{adoptable("w1", "q", 4, now), adoptable("w2", "q", 4, now), adoptable("w3", "q", 4, now)},
			[]AdoptionAsk{{"w1", a}, {"w2", b}, {"w3", a}}},
		{"already served", []Demand{{a, 4}}, Fleet{Pending: map[ProvisionKey]int{a: 1}}, []Worker{adoptable("w1", "q", 4, now)}, nil},
		{"generic work keeps its workers", []Demand{{a, 4}, {ProvisionKey{"q", ""}, 1}}, Fleet{}, []Worker{adoptable("w1", "q", 4, now)}, nil},
		{"only those that may", []Demand{{a, 4}}, Fleet{},
			[]Worker{busy, keyed, stale, notAsked, failedA, other, adoptable("w-ok", "q", 4, now)}, []AdoptionAsk{{"w-ok", a}}},
		{"a failed key, another key", []Demand{{b, 4}}, Fleet{}, []Worker{failedA}, []AdoptionAsk{{"w-failed", b}}},
	} {
		got := PlanAdoptions(c.demand, c.fleet, c.workers, 4, now, time.Minute)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: asks %v, want %v", c.name, got, c.want)
		}
	}
}

// TestAdoptionLifecycle: asked, a worker claims nothing and is asked again
// by each poll until it advertises the key (the adoption is over) or says
// its host setup failed (kept, failed: never asked for that key again).
func TestAdoptionLifecycle(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	w := adoptable("w1", "q", 4, now)
	ask := Adoption{HostKey: "hk1_a", Queue: "q", HostSetup: []string{"echo warm"}}
	if _, _, err := w.AskToAdopt(Adoption{HostKey: "hk1_a", Queue: "other"}, now, time.Minute); err == nil {
		t.Fatal("asked to adopt for a queue it does not serve")
	}
	asked, write, err := w.AskToAdopt(ask, now, time.Minute)
	if err != nil || !write || asked.Adopting() != "hk1_a" || !asked.Adoption.AskedAt.Equal(now) {
		t.Fatalf("ask: %+v %v %v", asked.Adoption, write, err)
	}
	if _, _, err := asked.AskToAdopt(ask, now, time.Minute); err == nil {
		t.Fatal("asked twice")
	}
	if ok, why := AcceptsWork(asked, false); ok || !strings.Contains(why, "adopting") {
		t.Fatalf("an asked worker accepts work: %v %q", ok, why)
	}
	setup, err := asked.Heartbeat(Poll{Phase: PhaseSetup}, now)
	if err != nil || setup.Adopting() != "hk1_a" {
		t.Fatalf("in setup: %+v %v; want still adopting", setup.Adoption, err)
	}
	done, err := setup.Heartbeat(Poll{Phase: PhaseReady, HostKey: "hk1_a"}, now)
	if err != nil || done.Adoption != nil || done.HostKey != "hk1_a" || done.Adopting() != "" {
		t.Fatalf("advertising the key: %+v key %q %v; want the adoption over", done.Adoption, done.HostKey, err)
	}
	if ok, why := AcceptsWork(done, false); !ok {
		t.Fatalf("an adopted worker claims nothing: %s", why)
	}
	failed, err := setup.Heartbeat(Poll{Phase: PhaseReady, AdoptFailed: "hk1_a"}, now)
	if err != nil || failed.Adoption == nil || failed.Adoption.Failed == "" || failed.Adopting() != "" || failed.HostKey != "" {
		t.Fatalf("failed: %+v %v; want kept as failed, still generic", failed.Adoption, err)
	}
	if ok, why := AcceptsWork(failed, false); !ok {
		t.Fatalf("a worker whose adoption failed claims nothing: %s", why)
	}
	if failed.MayAdopt("q", "hk1_a", now, time.Minute) || !failed.MayAdopt("q", "hk1_b", now, time.Minute) {
		t.Fatal("after a failure: want never that key again, but another key")
	}
	// Only a generic hello may adopt.
	if reg := NewWorker("w2", Registration{HostKey: "hk1_x", AdoptHostSetup: true}, "h", now); reg.AdoptHostSetup {
		t.Fatal("a keyed worker's hello made it adoptable")
	}
}

func TestKeyHoldAfter(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	k, other := ProvisionKey{"q", "hk1_a"}, ProvisionKey{"q", "hk1_b"}
	pol := BackoffPolicy{Min: 30 * time.Second, Max: 10 * time.Minute, MaxFailures: 3, StopFor: 6 * time.Hour}
	ended := func(key ProvisionKey, at time.Duration, state LaunchState, failure string) Host {
		return Host{ID: "host_" + at.String(), Key: key, State: state, Failure: failure, EndedAt: t0.Add(at), Reason: failure}
	}
	setup := func(at time.Duration) Host { return ended(k, at, LaunchEnded, HostSetupFailed) }
	for _, c := range []struct {
		name     string
		hosts    []Host
		failures int
		until    time.Time
		stopped  bool
	}{
		{"none", nil, 0, time.Time{}, false},
		{"served", []Host{ended(k, 0, LaunchEnded, "")}, 0, time.Time{}, false},
		{"one setup failure", []Host{setup(0)}, 1, t0.Add(30 * time.Second), false},
		{"two: doubled", []Host{setup(0), ended(k, time.Minute, LaunchEnded, NoHello)}, 2, t0.Add(2 * time.Minute), false},
		{"three: stopped", []Host{setup(0), setup(time.Minute), ended(k, 2*time.Minute, LaunchFailed, "")}, 3, t0.Add(2*time.Minute + 6*time.Hour), true},
		{"a host that served resets", []Host{setup(0), setup(time.Minute), ended(k, 2*time.Minute, LaunchEnded, ""), setup(3 * time.Minute)},
			1, t0.Add(3*time.Minute + 30*time.Second), false},
		{"a probe that fails after the stop stops it again", []Host{setup(0), setup(time.Minute), setup(2 * time.Minute), setup(7 * time.Hour)},
			4, t0.Add(13 * time.Hour), true},
		{"alive hosts and other keys do not count", []Host{setup(0), {Key: k, State: LaunchRunning}, ended(other, time.Minute, LaunchEnded, NoHello)},
			1, t0.Add(30 * time.Second), false},
	} {
		h := KeyHold{Key: k}
		for _, host := range c.hosts {
			h = h.After(host, pol)
		}
		if h.Failures != c.failures || !h.Until.Equal(c.until) || h.Stopped != c.stopped {
			t.Errorf("%s: hold %d failures until %v stopped %v; want %d until %v stopped %v", c.name, h.Failures, h.Until, h.Stopped, c.failures, c.until, c.stopped)
		}
		if h.Waiting(c.until) || (c.failures > 0 && !h.Waiting(c.until.Add(-time.Second))) {
			t.Errorf("%s: Waiting wrong around %v", c.name, c.until)
		}
	}
}
