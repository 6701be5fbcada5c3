package agent

import (
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// newFakeTimeAgent builds an agent for use inside a synctest bubble: the
// control plane (real router, real store) runs outside it on loopback; the
// agent's timers — poll interval, keep-alive, grace — run on the bubble's
// fake clock, which jumps whenever every goroutine in it waits on time.
func newFakeTimeAgent(t *testing.T, p *apitest.Plane, machine string, mod func(*Config)) *Agent {
	t.Helper()
	dir := t.TempDir()
	cfg := Config{
		ControlPlane: p.URL, EnrollToken: apitest.EnrollToken, Queue: "q",
		Workdir: filepath.Join(dir, "work"), StateDir: filepath.Join(dir, "state"),
		MachineID: machine, IntrospectAddr: "off", Grace: DefaultGrace, KillAfter: time.Second,
		Logger: slog.New(slog.DiscardHandler),
		HTTP:   noKeepAlive(),
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// noKeepAlive is an HTTP client for use inside a bubble: an idle keep-alive
// connection's read loop waits on the network, which a bubble never counts
// as durably blocked, so fake time would stop advancing.
func noKeepAlive() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: requestTimeout}
}

// operator returns an operator client safe to use inside a bubble.
func operator(p *apitest.Plane) *client.Client {
	return client.New(p.URL, apitest.OperatorToken, client.WithHTTPClient(noKeepAlive()))
}

func workerOf(t *testing.T, p *apitest.Plane, machine string) wire.Worker {
	t.Helper()
	op := operator(p)
	ws, err := op.ListWorkers(context.Background(), 100, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws.Workers {
		if w.MachineID == machine {
			return w
		}
	}
	t.Fatalf("no worker for machine %s", machine)
	return wire.Worker{}
}

// TestPhasesKeepAliveOnFakeTime: setup → ready → (an hour of fake idle
// time, 720 real polls) → draining → terminating → bye{idle}, exit nil.
func TestPhasesKeepAliveOnFakeTime(t *testing.T) {
	p := apitest.New(t)
	var took time.Duration
	synctest.Test(t, func(t *testing.T) {
		a := newFakeTimeAgent(t, p, "idle", func(c *Config) { c.KeepAlive = time.Hour })
		start := time.Now()
		if err := a.Run(context.Background()); err != nil {
			t.Fatalf("Run: %v", err)
		}
		took = time.Since(start)
	})
	if took < time.Hour || took > time.Hour+time.Minute {
		t.Fatalf("fake time until exit %s; want just over the 1 h keep-alive", took)
	}
	if w := workerOf(t, p, "idle"); w.State != "gone" || w.RetiredWhy != "bye: idle" {
		t.Fatalf("worker after keep-alive: %+v", w)
	}
}

// TestPhasesDrainWaitsForWorkOnFakeTime: a signal while a body runs starts
// the drain; the daemon keeps heartbeating (phase draining) until the body
// ends, acks it, and only then says bye. The 10 min grace, on the fake
// clock, never expires: fake time stands still while a real process runs,
// which is why grace expiry itself is tested in real time
// (tests/TestAgentGraceExpiry).
func TestPhasesDrainWaitsForWorkOnFakeTime(t *testing.T) {
	p := apitest.New(t)
	op := operator(p)
	inv, _, err := op.Submit(context.Background(), wire.SubmitRequest{Queue: "q", Argv: []string{"sleep", "1"}})
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		a := newFakeTimeAgent(t, p, "graceful", func(c *Config) { c.Grace = 10 * time.Minute })
		a.testHookRunStarted = func(string) { a.Stop() } // the signal arrives as the body starts
		if err := a.Run(context.Background()); err != nil {
			t.Fatalf("Run: %v", err)
		}
	})
	got, err := op.GetInvocation(context.Background(), inv.InvocationID)
	if err != nil || got.State != wire.StateSucceeded {
		t.Fatalf("invocation after a drain within the grace: %+v %v", got, err)
	}
	if w := workerOf(t, p, "graceful"); w.State != "gone" || w.RetiredWhy != "bye: signal" {
		t.Fatalf("worker: %+v", w)
	}
}

// TestPhasesSetupCommandOnFakeTime: ready → setup (a control-plane setup
// command; no claims meanwhile) → ready → claims.
func TestPhasesSetupCommandOnFakeTime(t *testing.T) {
	p := apitest.New(t)
	op := operator(p)
	ctx := context.Background()
	synctest.Test(t, func(t *testing.T) {
		a := newFakeTimeAgent(t, p, "setup", func(c *Config) { c.KeepAlive = 10 * time.Minute })
		var phases []string
		a.testHookRunStarted = func(string) { phases = append(phases, a.Health().Snapshot().Phase) }
		done := make(chan error)
		go func() { done <- a.Run(ctx) }()
		time.Sleep(time.Minute) // fake: a dozen polls in ready
		w := workerOf(t, p, "setup")
		if _, err := op.AddSetup(ctx, w.WorkerID, []string{"true"}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil { // keep-alive ends it once idle again
			t.Fatalf("Run: %v", err)
		}
		if len(phases) != 1 || phases[0] != wire.PhaseReady {
			t.Fatalf("bodies started in phases %v; want one, in ready", phases)
		}
	})
	w := workerOf(t, p, "setup")
	r, err := op.SetupResults(ctx, w.WorkerID)
	if err != nil || len(r.SetupResults) != 1 || r.SetupResults[0].Status != wire.SetupSucceeded {
		t.Fatalf("setup results %+v %v", r, err)
	}
	if inv, _ := op.ListInvocations(ctx, client.ListInvocationsParams{Queue: "q", State: wire.StateSucceeded}); len(inv.Invocations) != 1 {
		t.Fatalf("the work submitted with the setup command did not run after it: %+v", inv)
	}
}

// TestPhasesGoneSaysHelloAgainOnFakeTime: the control plane lets go of the
// agent's worker; its next poll gets 410 and it says hello again as a new
// worker, then carries on until its keep-alive.
func TestPhasesGoneSaysHelloAgainOnFakeTime(t *testing.T) {
	p := apitest.New(t)
	ctx := context.Background()
	var first, second string
	synctest.Test(t, func(t *testing.T) {
		a := newFakeTimeAgent(t, p, "twice", func(c *Config) { c.KeepAlive = 10 * time.Minute })
		done := make(chan error)
		go func() { done <- a.Run(ctx) }()
		time.Sleep(time.Minute)
		first = a.Health().Snapshot().WorkerID
		letGo(t, p, first)
		time.Sleep(time.Minute)
		second = a.Health().Snapshot().WorkerID
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	})
	if first == "" || second == "" || first == second {
		t.Fatalf("worker before %q and after %q the 410; want two different workers", first, second)
	}
	ws, _ := operator(p).ListWorkers(ctx, 10, "")
	states := map[string]string{}
	for _, w := range ws.Workers {
		states[w.WorkerID] = w.State + "/" + w.RetiredWhy
	}
	if states[first] != "gone/let go by the test" || states[second] != "gone/bye: idle" || len(states) != 2 {
		t.Fatalf("workers: %v", states)
	}
}
