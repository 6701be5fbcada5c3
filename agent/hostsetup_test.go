package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// runBounded runs a until Run returns, or until limit passes (on the
// bubble's fake clock inside synctest); then it reports the failure and
// stops a (two signals) so the test ends either way.
func runBounded(t *testing.T, a *Agent, limit time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		t.Errorf("Run still going after %s; stopping it", limit)
		a.Stop()
		a.Stop()
		return <-done
	}
}

// lastSetupResult reads a worker's last_setup_result as the operator API
// shows it. Hooks call it on the agent's goroutine, where t.Fatal is out.
func lastSetupResult(ctx context.Context, op *client.Client, workerID string) (*wire.SetupResult, error) {
	w, err := op.GetWorker(ctx, workerID)
	if err != nil {
		return nil, fmt.Errorf("get worker %s: %w", workerID, err)
	}
	return w.LastSetupResult, nil
}

// hostResult finds the result of the --host-setup command cmd in a poll.
func hostResult(req wire.PollRequest, cmd string) (wire.SetupResult, bool) {
	i := slices.IndexFunc(req.SetupResults, func(r wire.SetupResult) bool { return r.CommandID == "" && r.Command == cmd })
	if i < 0 {
		return wire.SetupResult{}, false
	}
	return req.SetupResults[i], true
}

// TestHostSetupFailedLeavesOnFakeTime: a failing --host-setup is reported
// on the very next poll (the worker's last_setup_result, with the command's
// text), the worker claims nothing, and when nobody repairs it the
// keep-alive counts in setup: it drains, says bye{idle}, and Run answers
// ErrHostSetupFailed (exit 4).
func TestHostSetupFailedLeavesOnFakeTime(t *testing.T) {
	p := apitest.New(t)
	op := operator(p)
	ctx := context.Background()
	const cmd = "echo no disk >&2; exit 3"
	inv, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}, RunConfig: wire.RunConfig{HostSetup: []string{cmd}}})
	if err != nil {
		t.Fatal(err)
	}
	var (
		polls, reportedAt int
		reportedPhase     string
		shown             *wire.SetupResult // the control plane's view right after that poll
		showErr           error
		runErr            error
		took              time.Duration
	)
	synctest.Test(t, func(t *testing.T) {
		a := newFakeTimeAgent(t, p, "broken", func(c *Config) {
			c.HostSetup = []string{cmd}
			c.KeepAlive = 10 * time.Minute
		})
		a.testHookRunStarted = func(id string) { t.Errorf("a worker whose host setup failed started %s", id) }
		a.testHookPolled = func(req wire.PollRequest) {
			polls++
			if _, ok := hostResult(req, cmd); ok && reportedAt == 0 {
				reportedAt, reportedPhase = polls, req.Phase
				shown, showErr = lastSetupResult(ctx, operator(p), req.WorkerID)
			}
		}
		start := time.Now()
		runErr = runBounded(t, a, 2*time.Hour)
		took = time.Since(start)
	})
	if !errors.Is(runErr, ErrHostSetupFailed) || ExitCode(runErr) != ExitHostSetupFailed {
		t.Errorf("Run = %v (exit %d), want ErrHostSetupFailed (exit %d)", runErr, ExitCode(runErr), ExitHostSetupFailed)
	}
	// The first poll may go out while the command still runs; the one after
	// its failure carries it.
	if reportedAt == 0 || reportedAt > 2 || reportedPhase != wire.PhaseSetup {
		t.Fatalf("the failure went out on poll %d (of %d) in phase %q; want poll 1 or 2, in setup", reportedAt, polls, reportedPhase)
	}
	if showErr != nil || shown == nil || shown.Command != cmd || shown.CommandID != "" || shown.Status != wire.SetupFailed ||
		shown.ExitCode != 3 || !strings.Contains(shown.OutputTail, "no disk") {
		t.Fatalf("last_setup_result right after the poll that reported it: %+v (%v)", shown, showErr)
	}
	if took < 10*time.Minute || took > 11*time.Minute {
		t.Errorf("fake time until exit %s; want just over the 10 min keep-alive", took)
	}
	w := workerOf(t, p, "broken")
	if w.State != "gone" || w.RetiredWhy != "bye: idle" || w.LastSetupResult == nil || w.LastSetupResult.Status != wire.SetupFailed {
		t.Errorf("worker after keep-alive: %+v", w)
	}
	if got, err := op.GetInvocation(ctx, inv.InvocationID); err != nil || got.State != wire.StateQueued || got.Attempt != 0 {
		t.Errorf("work for the broken host: %+v %v; want never claimed", got, err)
	}
}

// TestHostSetupRepairedOnFakeTime: while the host setup has failed, a
// control-plane setup command still runs; once it succeeded, the host setup
// reruns from the command that failed (not the ones before it), succeeds,
// and the worker becomes ready and runs work. Idle afterwards, it leaves by
// keep-alive with a clean exit.
func TestHostSetupRepairedOnFakeTime(t *testing.T) {
	p := apitest.New(t)
	op := operator(p)
	ctx := context.Background()
	dir := t.TempDir()
	fixed, first := filepath.Join(dir, "fixed"), filepath.Join(dir, "first")
	hostSetup := []string{"echo ran >> '" + first + "'", "test -f '" + fixed + "'"}
	inv, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}, RunConfig: wire.RunConfig{HostSetup: hostSetup}})
	if err != nil {
		t.Fatal(err)
	}
	var (
		repairErr  error
		repairSent bool
		runPhases  []string
		runErr     error
	)
	synctest.Test(t, func(t *testing.T) {
		a := newFakeTimeAgent(t, p, "repaired", func(c *Config) {
			c.HostSetup = hostSetup
			c.KeepAlive = 10 * time.Minute
		})
		a.testHookRunStarted = func(string) { runPhases = append(runPhases, a.Health().Snapshot().Phase) }
		a.testHookPolled = func(req wire.PollRequest) {
			if r, ok := hostResult(req, hostSetup[1]); ok && r.Status == wire.SetupFailed && !repairSent {
				repairSent = true // the operator repairs the host
				_, repairErr = operator(p).AddSetup(ctx, req.WorkerID, []string{"touch", fixed})
			}
		}
		runErr = runBounded(t, a, 2*time.Hour)
	})
	if runErr != nil || repairErr != nil {
		t.Fatalf("Run = %v (repair: %v); want a clean exit after the repair", runErr, repairErr)
	}
	if !repairSent {
		t.Fatal("the host setup's failure was never reported")
	}
	got, err := op.GetInvocation(ctx, inv.InvocationID)
	if err != nil || got.State != wire.StateSucceeded {
		t.Fatalf("work after the repair: %+v %v; want succeeded", got, err)
	}
	if len(runPhases) != 1 || runPhases[0] != wire.PhaseReady {
		t.Errorf("bodies started in phases %v; want one, in ready", runPhases)
	}
	if b, err := os.ReadFile(first); err != nil || strings.Count(string(b), "ran") != 1 {
		t.Errorf("the host setup's first command ran %q (%v); want once: the rerun starts at the one that failed", b, err)
	}
	w := workerOf(t, p, "repaired")
	if lr := w.LastSetupResult; lr == nil || lr.Command != hostSetup[1] || lr.Status != wire.SetupSucceeded {
		t.Errorf("last_setup_result %+v; want the host setup's successful rerun", lr)
	}
	if w.State != "gone" || w.RetiredWhy != "bye: idle" {
		t.Errorf("worker: %+v", w)
	}
	r, err := op.SetupResults(ctx, w.WorkerID)
	if err != nil || len(r.SetupResults) != 1 || r.SetupResults[0].Status != wire.SetupSucceeded {
		t.Errorf("control-plane setup commands %+v %v; want the repair, succeeded", r, err)
	}
}

// TestHostSetupFailedStopsOnFakeTime: a signal and a drain command both end
// a worker stuck on a failed host setup, with their own bye and a clean
// exit (only an unrepaired keep-alive exit is a failure).
func TestHostSetupFailedStopsOnFakeTime(t *testing.T) {
	for _, how := range []string{"signal", "drain"} {
		t.Run(how, func(t *testing.T) {
			p := apitest.New(t)
			ctx := context.Background()
			var stopErr error
			var runErr error
			synctest.Test(t, func(t *testing.T) {
				a := newFakeTimeAgent(t, p, "stuck", func(c *Config) {
					c.HostSetup = []string{"exit 3"}
					c.KeepAlive = time.Hour
				})
				stopped := false
				a.testHookPolled = func(req wire.PollRequest) {
					if _, ok := hostResult(req, "exit 3"); !ok || stopped {
						return
					}
					stopped = true
					if how == "signal" {
						a.Stop()
					} else {
						_, stopErr = operator(p).DrainWorker(ctx, req.WorkerID)
					}
				}
				start := time.Now()
				runErr = runBounded(t, a, 2*time.Hour)
				if took := time.Since(start); took > time.Minute {
					t.Errorf("took %s of fake time to stop; want well within the 1 h keep-alive", took)
				}
			})
			if runErr != nil || stopErr != nil {
				t.Fatalf("Run = %v (%v); want a clean exit", runErr, stopErr)
			}
			if w := workerOf(t, p, "stuck"); w.State != "gone" || w.RetiredWhy != "bye: "+how {
				t.Errorf("worker: %+v", w)
			}
		})
	}
}

// TestHostSetupKilledOnStop: a host setup command still running when the
// daemon stops (a signal, or a drain command) is killed, and Run does not
// return while it lives: it must not outlive nymph in its own process
// group. Real time: fake time stands still while a real process runs.
func TestHostSetupKilledOnStop(t *testing.T) {
	for _, how := range []string{"signal", "drain"} {
		t.Run(how, func(t *testing.T) {
			p := apitest.New(t)
			ctx := context.Background()
			fifo := filepath.Join(t.TempDir(), "pid")
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			a := newFakeTimeAgent(t, p, "hung", func(c *Config) {
				// The command says its pid through the fifo (which blocks until
				// the test reads), then becomes a sleep that ignores SIGTERM,
				// so only --kill-after's SIGKILL ends it.
				c.HostSetup = []string{"echo $$ > '" + fifo + "'; trap '' TERM; exec sleep 600"}
				c.PollInterval = 200 * time.Millisecond
				c.KillAfter = 500 * time.Millisecond
			})
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx) }()
			var once sync.Once
			stopAgent := func() { once.Do(func() { a.Stop(); a.Stop() }) }
			t.Cleanup(func() { stopAgent(); <-done })

			pidc := make(chan string, 1)
			go func() {
				b, err := os.ReadFile(fifo) // blocks until the command writes
				if err != nil {
					b = []byte(err.Error())
				}
				pidc <- strings.TrimSpace(string(b))
			}()
			var pid int
			select {
			case s := <-pidc:
				n, err := strconv.Atoi(s)
				if err != nil {
					t.Fatalf("pid from the host setup: %q", s)
				}
				pid = n
			case <-time.After(30 * time.Second):
				t.Fatal("the host setup command did not start within 30 s")
			}
			if how == "signal" {
				a.Stop()
			} else if _, err := operator(p).DrainWorker(ctx, a.Health().Snapshot().WorkerID); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				done <- err // for the cleanup
				if err != nil {
					t.Fatalf("Run = %v; want a clean exit", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return within 30 s of the stop")
			}
			if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("the host setup command (pid %d) outlived Run: kill(0) = %v", pid, err)
			}
			if w := workerOf(t, p, "hung"); w.State != "gone" || w.RetiredWhy != "bye: "+how {
				t.Errorf("worker: %+v", w)
			}
		})
	}
}

// TestHostSetupFailureFollowsRehelloOnFakeTime: when the control plane lets
// go of a worker stuck on a failed host setup (410 after a newer hello from
// its machine), the daemon's new worker reports the failure again, so it
// too shows why it claims nothing.
func TestHostSetupFailureFollowsRehelloOnFakeTime(t *testing.T) {
	p := apitest.New(t)
	ctx := context.Background()
	var first, second string
	var helloErr, runErr error
	synctest.Test(t, func(t *testing.T) {
		a := newFakeTimeAgent(t, p, "reborn", func(c *Config) {
			c.HostSetup = []string{"exit 3"}
			c.KeepAlive = 10 * time.Minute
		})
		a.testHookPolled = func(req wire.PollRequest) {
			if _, ok := hostResult(req, "exit 3"); ok && first == "" {
				first = req.WorkerID
				letGo(t, p, req.WorkerID)
			}
		}
		runErr = runBounded(t, a, 2*time.Hour)
		second = a.Health().Snapshot().WorkerID
	})
	if helloErr != nil || !errors.Is(runErr, ErrHostSetupFailed) {
		t.Fatalf("Run = %v (letting the worker go: %v); want ErrHostSetupFailed", runErr, helloErr)
	}
	if first == "" || second == "" || first == second {
		t.Fatalf("workers %q then %q; want a new one after the 410", first, second)
	}
	w, err := operator(p).GetWorker(ctx, second)
	if err != nil || w.LastSetupResult == nil || w.LastSetupResult.Command != "exit 3" || w.LastSetupResult.Status != wire.SetupFailed ||
		w.RetiredWhy != "bye: idle" {
		t.Fatalf("the new worker: %+v %v; want the host setup's failure shown, gone by keep-alive", w, err)
	}
}

// TestHostSetupText: a host-setup command is reported as valid UTF-8 within
// the wire limit, whatever its length or bytes.
func TestHostSetupText(t *testing.T) {
	for _, cmd := range []string{"exit 3", strings.Repeat("é", wire.MaxSetupTextBytes), "echo \xff" + strings.Repeat("x", wire.MaxSetupTextBytes)} {
		got := hostSetupText(cmd)
		if len(got) > wire.MaxSetupTextBytes || !utf8.ValidString(got) || (len(cmd) <= wire.MaxSetupTextBytes && got != cmd) {
			t.Errorf("hostSetupText(%d bytes) = %d bytes, valid %v", len(cmd), len(got), utf8.ValidString(got))
		}
		req := wire.PollRequest{WorkerID: "wrk_01JGZ5D6KQ5V6Y0Z5XNC3M4P7R", SetupResults: []wire.SetupResult{{Command: got, Status: wire.SetupFailed}}}
		if err := req.Validate(); err != nil {
			t.Errorf("a poll carrying it: %v", err)
		}
	}
}

// TestHostSetupHungLeavesByKeepAlive: a --host-setup command that never
// exits (and ignores SIGTERM) does not make a zombie worker: keep-alive
// counts while it runs, the daemon leaves with bye{idle} and exit 4, and
// the command is killed as it leaves (SIGTERM to its process group,
// --kill-after, SIGKILL): Run does not return while it lives. Real time:
// fake time stands still while a real process runs.
func TestHostSetupHungLeavesByKeepAlive(t *testing.T) {
	p := apitest.New(t)
	fifo := filepath.Join(t.TempDir(), "pid")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	const keepAlive = 2 * time.Second
	a := newFakeTimeAgent(t, p, "hung-setup", func(c *Config) {
		c.HostSetup = []string{"echo $$ > '" + fifo + "'; trap '' TERM; exec sleep 600"}
		c.PollInterval = 200 * time.Millisecond
		c.KillAfter = 500 * time.Millisecond
		c.KeepAlive = keepAlive
	})
	a.testHookRunStarted = func(id string) { t.Errorf("a worker whose host setup hangs started %s", id) }
	pidc := make(chan int, 1)
	go func() {
		b, err := os.ReadFile(fifo) // blocks until the command writes
		n, aerr := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || aerr != nil {
			n = 0
		}
		pidc <- n
	}()
	start := time.Now()
	runErr := runBounded(t, a, time.Minute)
	took := time.Since(start)
	var pid int
	select {
	case pid = <-pidc:
	case <-time.After(30 * time.Second):
		t.Fatal("the host setup command never said its pid")
	}
	if pid <= 0 {
		t.Fatal("the host setup command's pid could not be read")
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("the hung host setup command (pid %d) outlived Run: kill(0) = %v", pid, err)
	}
	if !errors.Is(runErr, ErrHostSetupFailed) || ExitCode(runErr) != ExitHostSetupFailed {
		t.Errorf("Run = %v (exit %d), want ErrHostSetupFailed (exit %d)", runErr, ExitCode(runErr), ExitHostSetupFailed)
	}
	if took < keepAlive {
		t.Errorf("left after %s; want no sooner than the %s keep-alive", took, keepAlive)
	}
	if w := workerOf(t, p, "hung-setup"); w.State != "gone" || w.RetiredWhy != "bye: idle" {
		t.Errorf("worker after keep-alive: %+v", w)
	}
	if a.Health().Snapshot().Phase == wire.PhaseReady {
		t.Error("health reads ready")
	}
}

// TestWorkdirNotWritableLeavesOnFakeTime: a daemon whose workdir it cannot
// write never becomes ready (it claims nothing), and keep-alive counts in
// setup all the same: it leaves with bye{idle} and exit 4 (ErrNotReady),
// not a host-setup failure, once the keep-alive has passed.
func TestWorkdirNotWritableLeavesOnFakeTime(t *testing.T) {
	const workdir = "/proc" // exists, and nobody (not even root) creates files in it
	if writable(workdir) == nil {
		t.Skipf("%s is writable here", workdir)
	}
	p := apitest.New(t)
	op := operator(p)
	ctx := context.Background()
	inv, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	var (
		phases []string
		runErr error
		took   time.Duration
	)
	synctest.Test(t, func(t *testing.T) {
		a := newFakeTimeAgent(t, p, "readonly", func(c *Config) {
			c.Workdir = workdir
			c.KeepAlive = 10 * time.Minute
		})
		a.testHookRunStarted = func(id string) { t.Errorf("a worker with an unwritable workdir started %s", id) }
		a.testHookPolled = func(req wire.PollRequest) {
			if len(phases) == 0 || phases[len(phases)-1] != req.Phase {
				phases = append(phases, req.Phase)
			}
		}
		start := time.Now()
		runErr = runBounded(t, a, 2*time.Hour)
		took = time.Since(start)
	})
	if !errors.Is(runErr, ErrNotReady) || errors.Is(runErr, ErrHostSetupFailed) || ExitCode(runErr) != ExitHostSetupFailed {
		t.Errorf("Run = %v (exit %d), want ErrNotReady, not ErrHostSetupFailed (exit %d)", runErr, ExitCode(runErr), ExitHostSetupFailed)
	}
	if took < 10*time.Minute || took > 11*time.Minute {
		t.Errorf("fake time until exit %s; want just over the 10 min keep-alive", took)
	}
	if slices.Contains(phases, wire.PhaseReady) {
		t.Errorf("phases polled %v; want never ready", phases)
	}
	if w := workerOf(t, p, "readonly"); w.State != "gone" || w.RetiredWhy != "bye: idle" {
		t.Errorf("worker after keep-alive: %+v", w)
	}
	if got, err := op.GetInvocation(ctx, inv.InvocationID); err != nil || got.State != wire.StateQueued || got.Attempt != 0 {
		t.Errorf("work for the worker that never got ready: %+v %v; want never claimed", got, err)
	}
}
