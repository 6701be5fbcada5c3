package agent

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/imds/imdstest"
	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// newSpotAgent builds a real-time agent whose spot watcher polls the fake.
func newSpotAgent(t *testing.T, p *apitest.Plane, f *imdstest.Server, machine string, grace time.Duration, mods ...func(*Config)) *Agent {
	t.Helper()
	a := newFakeTimeAgent(t, p, machine, func(c *Config) {
		c.IMDSEndpoint = f.URL
		c.Grace = grace
		c.PollInterval = 100 * time.Millisecond
		for _, m := range mods {
			m(c)
		}
	})
	a.spotInterval = 50 * time.Millisecond
	return a
}

// spotRig is a control plane, the fake IMDS and one invocation submitted
// for the spot agent to run.
type spotRig struct {
	p   *apitest.Plane
	f   *imdstest.Server
	inv wire.Invocation
}

func newSpotRig(t *testing.T, argv ...string) spotRig {
	t.Helper()
	p := apitest.New(t)
	inv, _, err := operator(p).Submit(context.Background(), wire.SubmitRequest{Queue: "q", Argv: argv})
	if err != nil {
		t.Fatal(err)
	}
	return spotRig{p: p, f: imdstest.New(t, imdstest.State{}), inv: inv}
}

// wantEnd requires machine's worker gone by bye (its reason) and the
// invocation in state.
func (r spotRig) wantEnd(t *testing.T, machine, bye, state string) {
	t.Helper()
	if w := workerOf(t, r.p, machine); w.State != "gone" || w.RetiredWhy != "bye: "+bye {
		t.Fatalf("worker %s at the end: %+v; want gone by bye %s", machine, w, bye)
	}
	got, err := operator(r.p).GetInvocation(context.Background(), r.inv.InvocationID)
	if err != nil || got.State != state {
		t.Fatalf("invocation at the end: %+v %v; want %s", got, err, state)
	}
}

// TestSpotAgentHandsBackBeforeReclaim: a body runs for a minute; the
// interruption notice says the reclaim is 3 s away, less than kill-after +
// 5 s, so the 20 s grace shrinks to nothing: the body is terminated at
// once and handed back (queued again) by bye{spot_interruption}, all before
// the reclaim.
func TestSpotAgentHandsBackBeforeReclaim(t *testing.T) {
	r := newSpotRig(t, "sleep", "60")
	p, f := r.p, r.f
	a := newSpotAgent(t, p, f, "spot-reclaim", 20*time.Second)
	var reclaim time.Time
	a.testHookRunStarted = func(string) {
		reclaim = time.Now().Add(3 * time.Second)
		f.Set(func(s *imdstest.State) { s.Action, s.At = "terminate", reclaim })
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	exited := time.Now()
	if reclaim.IsZero() {
		t.Fatal("the body never started")
	}
	// The notice's time has whole seconds; the reclaim is its truncation.
	if exited.After(reclaim.Truncate(time.Second)) {
		t.Fatalf("exited %s after the reclaim", exited.Sub(reclaim.Truncate(time.Second)))
	}
	r.wantEnd(t, "spot-reclaim", wire.ByeSpotInterruption, wire.StateQueued) // handed back
}

// TestSpotAgentFinishesWithinGrace: the reclaim is two minutes away, so a
// short body finishes (and is acked) within the grace before the daemon
// says bye{spot_interruption}.
func TestSpotAgentFinishesWithinGrace(t *testing.T) {
	r := newSpotRig(t, "sleep", "1")
	p, f := r.p, r.f
	a := newSpotAgent(t, p, f, "spot-finish", 10*time.Minute)
	var reclaim time.Time
	a.testHookRunStarted = func(string) {
		reclaim = time.Now().Add(2 * time.Minute)
		f.Set(func(s *imdstest.State) { s.Action, s.At = "stop", reclaim })
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if reclaim.IsZero() || time.Now().After(reclaim.Truncate(time.Second)) {
		t.Fatalf("exited after the reclaim (or the body never started)")
	}
	r.wantEnd(t, "spot-finish", wire.ByeSpotInterruption, wire.StateSucceeded)
}

// TestSpotAgentShortensSignalGrace: a signal starts the drain (20 s grace)
// and an interruption notice with the reclaim 3 s away then shortens that
// same grace: the body is handed back at once; the bye keeps the signal's
// reason.
func TestSpotAgentShortensSignalGrace(t *testing.T) {
	r := newSpotRig(t, "sleep", "60")
	p, f := r.p, r.f
	a := newSpotAgent(t, p, f, "spot-signal", 20*time.Second)
	var reclaim time.Time
	a.testHookRunStarted = func(string) {
		a.Stop()
		reclaim = time.Now().Add(3 * time.Second)
		f.Set(func(s *imdstest.State) { s.Action, s.At = "terminate", reclaim })
	}
	if err := a.Run(context.Background()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if reclaim.IsZero() || time.Now().After(reclaim.Truncate(time.Second)) {
		t.Fatalf("exited after the reclaim (or the body never started)")
	}
	r.wantEnd(t, "spot-signal", wire.ByeSignal, wire.StateQueued) // handed back
}

// TestSpotAgentRebalanceDrains: with --on-rebalance drain, a rebalance
// recommendation that appears while a body runs starts the drain: the body
// finishes within the grace and is acked, and the daemon says bye{drain}.
func TestSpotAgentRebalanceDrains(t *testing.T) {
	r := newSpotRig(t, "sleep", "1")
	p, f := r.p, r.f
	a := newSpotAgent(t, p, f, "spot-rebalance", 10*time.Minute, func(c *Config) { c.OnRebalance = OnRebalanceDrain })
	a.testHookRunStarted = func(string) { f.Set(func(s *imdstest.State) { s.Rebalance = time.Now() }) }
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the daemon ran until the test's deadline: the rebalance recommendation did not drain it")
	}
	r.wantEnd(t, "spot-rebalance", wire.ByeDrain, wire.StateSucceeded)
}

// TestSpotAgentRebalanceLogs: by default (--on-rebalance log) a rebalance
// recommendation is logged and changes nothing: the daemon drains only
// when the signal comes, and says bye{signal}.
func TestSpotAgentRebalanceLogs(t *testing.T) {
	p := apitest.New(t)
	f := imdstest.New(t, imdstest.State{})
	f.Set(func(s *imdstest.State) { s.Rebalance = time.Now() })
	logs := newLogRecorder()
	a := newSpotAgent(t, p, f, "spot-rebalance-log", 10*time.Minute, func(c *Config) { c.Logger = logs.logger() })
	if a.cfg.OnRebalance != OnRebalanceLog {
		t.Fatalf("OnRebalance defaulted to %q; want %q", a.cfg.OnRebalance, OnRebalanceLog)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	rec := logs.wait(t, "the rebalance recommendation logged", func(r logRecord) bool {
		return strings.HasPrefix(r.Msg, "EC2 rebalance recommendation")
	})
	if rec.Level != slog.LevelWarn || !strings.Contains(rec.Msg, "--on-rebalance log") {
		t.Errorf("rebalance logged as %s %q", rec.Level, rec.Msg)
	}
	a.Stop() // handled by the loop after the notice
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after the signal")
	}
	if w := workerOf(t, p, "spot-rebalance-log"); w.State != "gone" || w.RetiredWhy != "bye: signal" {
		t.Fatalf("worker: %+v; want bye signal (the recommendation alone must not drain)", w)
	}
}

func TestSpotOnRebalanceConfig(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"", OnRebalanceLog, true},
		{"log", OnRebalanceLog, true},
		{"drain", OnRebalanceDrain, true},
		{"Drain", "", false},
		{"terminate", "", false},
	} {
		cfg := Config{
			ControlPlane: "http://127.0.0.1:1", EnrollToken: "t", Queue: "q",
			Workdir: t.TempDir(), StateDir: t.TempDir(), IntrospectAddr: "off",
			Logger: slog.New(slog.DiscardHandler), OnRebalance: tc.in,
		}
		got, err := cfg.withDefaults()
		switch {
		case tc.ok && (err != nil || got.OnRebalance != tc.want):
			t.Errorf("OnRebalance %q: %q, %v; want %q", tc.in, got.OnRebalance, err, tc.want)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), "--on-rebalance")):
			t.Errorf("OnRebalance %q: error %v; want one naming --on-rebalance", tc.in, err)
		}
	}
}

func TestSpotGrace(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		reclaim time.Time
		want    time.Duration
	}{
		{time.Time{}, 30 * time.Second},                                // no notice: the configured grace
		{now.Add(2 * time.Minute), 30 * time.Second},                   // reclaim far off: the configured grace
		{now.Add(30 * time.Second), 15 * time.Second},                  // 30 s − kill-after 10 s − 5 s
		{now.Add(12 * time.Second), 0},                                 // too close: terminate at once
		{now.Add(-time.Minute), 0},                                     // already past
		{now.Add(45*time.Second + time.Millisecond), 30 * time.Second}, // exactly enough
	} {
		if got := spotGrace(30*time.Second, 10*time.Second, tc.reclaim, now); got != tc.want {
			t.Errorf("spotGrace(reclaim %v) = %s; want %s", tc.reclaim.Sub(now), got, tc.want)
		}
	}
}
