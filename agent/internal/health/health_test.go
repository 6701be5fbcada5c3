package health

import (
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

var healthEpoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// healthServing brings h to the steady state: registered, phase ready, polling,
// poller running, loop ticking, one successful poll.
func healthServing(h *Tracker) {
	h.SetRunState(RunStarting)
	h.RequestStarted(RoleHello)(true)
	h.Registered("wrk_01JD2K0000000000000000000A", "hk1_abc", "gpu")
	h.SetPhase(Phase{Name: wire.PhaseReady})
	h.PollerRunning(true)
	h.SetRunState(RunPolling)
	h.Tick()
	h.RequestStarted(RolePoll)(true)
}

// healthAdvance moves the clock by d in one-second steps with the loop
// ticking, as a healthy main loop does.
func healthAdvance(h *Tracker, c *clock.Fake, d time.Duration) {
	for ; d > 0; d -= time.Second {
		c.Advance(min(time.Second, d))
		h.Tick()
	}
}

func TestHealthReasons(t *testing.T) {
	tests := []struct {
		name        string
		opts        Options
		do          func(h *Tracker, c *clock.Fake)
		ready       bool
		readyReason string
		live        bool
		liveReason  string
	}{
		{
			name:        "not started: constructed, loop not running",
			do:          func(h *Tracker, c *clock.Fake) {},
			readyReason: ReasonNotStarted, liveReason: ReasonNotStarted,
		},
		{
			name: "registering: hello outstanding",
			do: func(h *Tracker, c *clock.Fake) {
				h.SetRunState(RunStarting)
				h.RequestStarted(RoleHello)
				c.Advance(5 * time.Second)
			},
			readyReason: ReasonRegistering, live: true, liveReason: ReasonLive,
		},
		{
			name: "registering: hello failed and is being retried",
			do: func(h *Tracker, c *clock.Fake) {
				h.SetRunState(RunStarting)
				h.RequestStarted(RoleHello)(false)
			},
			readyReason: ReasonRegistering, live: true, liveReason: ReasonLive,
		},
		{
			name: "registering: a slow start-up before the first tick is not a stall",
			do: func(h *Tracker, c *clock.Fake) {
				h.SetRunState(RunStarting)
				c.Advance(time.Minute)
			},
			readyReason: ReasonRegistering, live: true, liveReason: ReasonLive,
		},
		{
			name: "registering: unregistered after a 410",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.Unregistered()
				h.RequestStarted(RoleHello)
			},
			readyReason: ReasonRegistering, live: true, liveReason: ReasonLive,
		},
		{
			name: "setup: heartbeats yes, claims no",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.SetPhase(Phase{Name: wire.PhaseSetup, NotReady: ReasonSetup})
			},
			readyReason: ReasonSetup, live: true, liveReason: ReasonLive,
		},
		{
			name: "draining: phase",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.SetPhase(Phase{Name: wire.PhaseDraining, NotReady: ReasonDraining})
			},
			readyReason: ReasonDraining, live: true, liveReason: ReasonLive,
		},
		{
			name: "draining: run state",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.SetRunState(RunDraining)
			},
			readyReason: ReasonDraining, live: true, liveReason: ReasonLive,
		},
		{
			name: "draining: terminating",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.SetPhase(Phase{Name: wire.PhaseTerminating, NotReady: ReasonDraining})
				h.PollerRunning(false)
			},
			readyReason: ReasonDraining, live: true, liveReason: ReasonLive,
		},
		{
			name: "server unavailable: the latest poll failed, and live stays true",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				for range 10 {
					healthAdvance(h, c, 10*time.Second)
					h.RequestStarted(RolePoll)(false)
				}
				h.SetRunState(RunBackoff)
			},
			readyReason: ReasonServerUnavailable + RolePoll, live: true, liveReason: ReasonLive,
		},
		{
			name: "server unavailable: still, while the retry is outstanding",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.RequestStarted(RolePoll)(false)
				h.RequestStarted(RolePoll)
			},
			readyReason: ReasonServerUnavailable + RolePoll, live: true, liveReason: ReasonLive,
		},
		{
			name: "server unavailable: ack",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.RequestStarted(RoleAck)(false)
			},
			readyReason: ReasonServerUnavailable + RoleAck, live: true, liveReason: ReasonLive,
		},
		{
			name: "ready again after a later exchange of the failed role succeeds",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.RequestStarted(RolePoll)(false)
				h.RequestStarted(RoleAck)(false)
				healthAdvance(h, c, 5*time.Second)
				h.RequestStarted(RolePoll)(true)
				h.RequestStarted(RoleAck)(true)
			},
			ready: true, readyReason: ReasonReady, live: true, liveReason: ReasonLive,
		},
		{
			name: "ready: an idle long poll inside the overdue bound",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.RequestStarted(RolePoll)
				healthAdvance(h, c, 30*time.Second)
			},
			ready: true, readyReason: ReasonReady, live: true, liveReason: ReasonLive,
		},
		{
			name: "server unavailable: a poll unanswered past the overdue bound, while the client still retries",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.RequestStarted(RolePoll)
				healthAdvance(h, c, 31*time.Second)
			},
			readyReason: ReasonServerUnavailable + RolePoll, live: true, liveReason: ReasonLive,
		},
		{
			name: "server unavailable: overdue, the oldest of two concurrent acks",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.RequestStarted(RoleAck)
				healthAdvance(h, c, 20*time.Second)
				h.RequestStarted(RoleAck)
				healthAdvance(h, c, 11*time.Second)
			},
			readyReason: ReasonServerUnavailable + RoleAck, live: true, liveReason: ReasonLive,
		},
		{
			name: "server unavailable: overdue bound from options",
			opts: Options{RequestOverdue: 5 * time.Second},
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.RequestStarted(RolePoll)
				healthAdvance(h, c, 6*time.Second)
			},
			readyReason: ReasonServerUnavailable + RolePoll, live: true, liveReason: ReasonLive,
		},
		{
			name: "server unavailable: overdue although the role's last exchange succeeded",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.RequestStarted(RoleBye)(true)
				h.RequestStarted(RoleBye)
				healthAdvance(h, c, 31*time.Second)
			},
			readyReason: ReasonServerUnavailable + RoleBye, live: true, liveReason: ReasonLive,
		},
		{
			name: "request stalled (live) wins over server unavailable (ready)",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.RequestStarted(RoleAck)(false)
				h.RequestStarted(RoleAck)
				healthAdvance(h, c, 121*time.Second)
			},
			readyReason: ReasonRequestStalled + RoleAck, liveReason: ReasonRequestStalled + RoleAck,
		},
		{
			name: "poller stopped",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.PollerRunning(false)
			},
			readyReason: ReasonPollerStopped, live: true, liveReason: ReasonLive,
		},
		{
			name:  "ready",
			do:    func(h *Tracker, c *clock.Fake) { healthServing(h) },
			ready: true, readyReason: ReasonReady, live: true, liveReason: ReasonLive,
		},
		{
			name: "ready: long-running work never affects either signal",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.SetInflight(3)
				for range 60 {
					healthAdvance(h, c, 5*time.Second)
					h.RequestStarted(RolePoll)(true)
				}
			},
			ready: true, readyReason: ReasonReady, live: true, liveReason: ReasonLive,
		},
		{
			name: "event loop stalled: no tick for longer than LoopStall",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				c.Advance(31 * time.Second)
			},
			readyReason: ReasonEventLoopStalled, liveReason: ReasonEventLoopStalled,
		},
		{
			name: "live: a tick exactly LoopStall old",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				c.Advance(30 * time.Second)
			},
			ready: true, readyReason: ReasonReady, live: true, liveReason: ReasonLive,
		},
		{
			name: "event loop stalled: bound from options",
			opts: Options{LoopStall: 3 * time.Second},
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				c.Advance(4 * time.Second)
			},
			readyReason: ReasonEventLoopStalled, liveReason: ReasonEventLoopStalled,
		},
		{
			name: "request stalled: poll outlived every retry window",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.RequestStarted(RolePoll)
				healthAdvance(h, c, 121*time.Second)
			},
			readyReason: ReasonRequestStalled + RolePoll, liveReason: ReasonRequestStalled + RolePoll,
		},
		{
			name: "request stalled: hello, before the loop ticks",
			do: func(h *Tracker, c *clock.Fake) {
				h.SetRunState(RunStarting)
				h.RequestStarted(RoleHello)
				c.Advance(121 * time.Second)
			},
			readyReason: ReasonRequestStalled + RoleHello, liveReason: ReasonRequestStalled + RoleHello,
		},
		{
			name: "failed: registration",
			do: func(h *Tracker, c *clock.Fake) {
				h.SetRunState(RunStarting)
				h.RequestStarted(RoleHello)(false)
				h.Failed(FailedRegistration)
			},
			readyReason: FailedRegistration, liveReason: FailedRegistration,
		},
		{
			name: "failed: runtime, bare suffix",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.Failed("runtime")
			},
			readyReason: FailedRuntime, liveReason: FailedRuntime,
		},
		{
			name: "failed: shutdown, kept through Stopped",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.Failed(FailedShutdown)
				h.Stopped()
			},
			readyReason: FailedShutdown, liveReason: FailedShutdown,
		},
		{
			name: "failed: the first failure is kept",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.Failed(FailedRegistration)
				h.Failed(FailedShutdown)
			},
			readyReason: FailedRegistration, liveReason: FailedRegistration,
		},
		{
			name: "failed: a token reason outside the seed's three is kept",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.Failed("failed:host_setup")
			},
			readyReason: "failed:host_setup", liveReason: "failed:host_setup",
		},
		{
			name: "failed: free text never reaches the snapshot",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.Failed("failed: dial tcp 10.0.0.7:443: token=sekrit refused")
			},
			readyReason: FailedRuntime, liveReason: FailedRuntime,
		},
		{
			name: "stopped",
			do: func(h *Tracker, c *clock.Fake) {
				healthServing(h)
				h.SetPhase(Phase{Name: wire.PhaseTerminating, NotReady: ReasonDraining})
				h.RequestStarted(RoleBye)(true)
				h.Stopped()
			},
			readyReason: ReasonStopped, liveReason: ReasonStopped,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := clock.NewFake(healthEpoch)
			h := New(clock.Of(c.Now), tt.opts)
			tt.do(h, c)
			s := h.Snapshot()
			if s.Ready != tt.ready || s.ReadyReason != tt.readyReason {
				t.Errorf("ready = %v %q, want %v %q", s.Ready, s.ReadyReason, tt.ready, tt.readyReason)
			}
			if s.Live != tt.live || s.LiveReason != tt.liveReason {
				t.Errorf("live = %v %q, want %v %q", s.Live, s.LiveReason, tt.live, tt.liveReason)
			}
		})
	}
}

func TestHealthSnapshotAges(t *testing.T) {
	c := clock.NewFake(healthEpoch)
	h := New(clock.Of(c.Now), Options{})
	if s := h.Snapshot(); s.Phase != wire.PhaseBooting || s.SinceLastTickS != nil || s.SinceLastPollOKS != nil || len(s.Roles) != 0 {
		t.Fatalf("fresh snapshot = %+v, want booting with no ages and no roles", s)
	}
	c.Advance(2 * time.Second)
	healthServing(h) // tick and poll ok at t=2s
	h.SetInflight(2)
	h.SetWarm(1)
	c.Advance(3 * time.Second)
	h.RequestStarted(RoleAck) // outstanding since t=5s
	c.Advance(4 * time.Second)
	doneA := h.RequestStarted(RoleAck) // since t=9s
	doneP := h.RequestStarted(RolePoll)
	c.Advance(1 * time.Second) // t=10s
	doneP(false)
	doneP(true) // ignored: only the first answer counts

	s := h.Snapshot()
	if s.WorkerID != "wrk_01JD2K0000000000000000000A" || s.HostKey != "hk1_abc" || s.Queue != "gpu" ||
		s.Phase != wire.PhaseReady || s.RunState != RunPolling || s.Inflight != 2 || s.WarmProcesses != 1 || !s.PollerRunning {
		t.Errorf("identity and state = %+v", s)
	}
	if s.UptimeS != 10 {
		t.Errorf("uptime_s = %v, want 10", s.UptimeS)
	}
	if s.SinceLastTickS == nil || *s.SinceLastTickS != 8 {
		t.Errorf("since_last_tick_s = %v, want 8", s.SinceLastTickS)
	}
	if s.SinceLastPollOKS == nil || *s.SinceLastPollOKS != 8 {
		t.Errorf("since_last_poll_ok_s = %v, want 8", s.SinceLastPollOKS)
	}
	poll := s.Roles[RolePoll]
	if poll.LastResult != "error" || poll.Outstanding != 0 || poll.OutstandingAgeS != nil || *poll.LastOKAgeS != 8 {
		t.Errorf("poll = %+v", poll)
	}
	ack := s.Roles[RoleAck]
	if ack.LastResult != "" || ack.Outstanding != 2 || ack.OutstandingAgeS == nil || *ack.OutstandingAgeS != 5 || ack.LastOKAgeS != nil {
		t.Errorf("ack = %+v", ack)
	}
	doneA(true)
	ack = h.Snapshot().Roles[RoleAck]
	if ack.LastResult != "ok" || ack.Outstanding != 1 || *ack.OutstandingAgeS != 5 || *ack.LastOKAgeS != 0 {
		t.Errorf("ack after one answer = %+v", ack)
	}
}

// TestHealthSnapshotFields pins the snapshot's JSON keys: identity, states,
// reasons, counts and ages — nothing that could carry a payload, a token,
// argv, env or an error message.
func TestHealthSnapshotFields(t *testing.T) {
	c := clock.NewFake(healthEpoch)
	h := New(clock.Of(c.Now), Options{})
	healthServing(h)
	h.RequestStarted(RoleAck)
	b, err := json.Marshal(h.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"worker_id", "queue", "host_key", "phase", "run_state",
		"ready", "ready_reason", "live", "live_reason", "inflight", "warm_processes", "poller_running",
		"uptime_s", "since_last_tick_s", "since_last_poll_ok_s", "roles",
	}
	if got := healthSortedKeys(top); !slices.Equal(got, healthSorted(want)) {
		t.Errorf("snapshot keys = %v, want %v", got, healthSorted(want))
	}
	var roles map[string]map[string]json.RawMessage
	if err := json.Unmarshal(top["roles"], &roles); err != nil {
		t.Fatal(err)
	}
	wantRole := healthSorted([]string{"last_result", "last_ok_age_s", "outstanding", "outstanding_age_s"})
	for name, r := range roles {
		if got := healthSortedKeys(r); !slices.Equal(got, wantRole) {
			t.Errorf("role %s keys = %v, want %v", name, got, wantRole)
		}
	}
}

func healthSortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return healthSorted(keys)
}

func healthSorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestHealthConcurrent exercises every recorder against Snapshot for -race.
func TestHealthConcurrent(t *testing.T) {
	h := New(clock.Clock{}, Options{})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 200 {
				h.Tick()
				h.SetInflight(j)
				h.PollerRunning(j%2 == 0)
				h.SetRunState(RunPolling)
				h.SetPhase(Phase{Name: wire.PhaseReady})
				h.Registered("wrk_x", "hk", "q")
				done := h.RequestStarted([]string{RoleHello, RolePoll, RoleAck, RoleBye}[(i+j)%4])
				_ = h.Snapshot()
				done(j%3 != 0)
			}
		})
	}
	wg.Wait()
	s := h.Snapshot()
	for name, r := range s.Roles {
		if r.Outstanding != 0 {
			t.Errorf("role %s: %d requests still outstanding", name, r.Outstanding)
		}
	}
}
