package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/health"
	"github.com/dreamlake/lakeshore/agent/internal/sigv4"
	"github.com/dreamlake/lakeshore/agent/internal/wakeclient"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// loop runs the daemon from hello to bye: it turns each event into the
// phase machine's moves (phase.go: setup → ready → draining → terminating).
func (a *Agent) loop(ctx context.Context, st *state, hello wire.HelloRequest) (err error) {
	cfg := a.cfg
	a.setupc = make(chan setupDone, 1)
	st.setupCtx, st.stopSetup = context.WithCancel(ctx)
	st.loopDone = make(chan struct{})
	defer func() {
		a.endSetups(st)
		// Leaving by keep-alive without being ready is not a clean exit:
		// the service manager and the operator must see it (exit 4).
		if err == nil && st.byeReason == wire.ByeIdle && st.notReady != "" {
			if !st.hostSetupOK {
				err = fmt.Errorf("%w: %s", ErrHostSetupFailed, st.notReady)
			} else {
				err = fmt.Errorf("%w: %s", ErrNotReady, st.notReady)
			}
		}
	}()
	runDone := make(chan *running, cfg.Capacity+1)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	pollNow := make(chan struct{}, 1)
	kick := func() {
		select {
		case pollNow <- struct{}{}:
		default:
		}
	}
	a.enter(st, phaseSetup)
	a.health.PollerRunning(true)
	st.hostSetup, st.hostKey = cfg.HostSetup, hello.HostKey
	if len(st.hostSetup) > 0 {
		a.startHostSetup(st, 0)
	} else {
		st.noHostSetup()
	}

	// The wake socket: "poll now" when work or news arrives, so an idle
	// daemon need not poll often to be quick (docs/dispatch.md).
	wctx, stopWake := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWake()
	st.wake = wakeclient.New(wakeclient.Options{Logger: a.log,
		HTTPFor: func(url string) *http.Client { return sigv4.WakeClient(cfg.HTTP, url) }})
	go st.wake.Run(wctx)
	a.useWake(st)

	timer := time.NewTimer(0)
	defer timer.Stop()
	var g gracePeriod
	stopc, hurryc, ctxDone, spotc := a.stopc, a.hurryc, ctx.Done(), a.spotc
	for {
		select {
		case <-timer.C:
			wait := a.poll(ctx, st, hello, runDone)
			if st.phase == phaseTerminating {
				return a.finish(st)
			}
			timer.Reset(wait)
		case <-st.wake.Work():
			if a.claimGate(st).may() {
				a.log.Debug("woken: work may be waiting")
				kick()
			}
		case <-st.wake.News():
			a.log.Debug("woken: news for this worker")
			kick()
		case <-pollNow:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(0)
		case ev := <-a.setupc:
			a.setupFinished(st, ev)
			kick()
		case r := <-runDone:
			a.runFinished(ctx, st, r)
			kick()
		case <-tick.C:
			a.health.Tick()
			a.health.SetInflight(len(st.runs))
			a.runner.ExpireWarm()
			a.health.SetWarm(a.runner.WarmProcesses())
			// Keep-alive counts whenever no invocation runs, whatever the
			// phase: a worker that cannot become ready (a failed or hung
			// setup, a workdir it cannot write) must not burn its instance
			// for ever. Each setup command's start and end restart the count.
			if cfg.KeepAlive > 0 && !st.phase.leaving() && len(st.runs) == 0 && a.cfg.Clock.Since(st.idleSince) >= cfg.KeepAlive {
				a.keepAliveExpired(st)
				kick()
			}
		case <-stopc:
			stopc = nil
			if a.startDrain(st, wire.ByeSignal) {
				a.log.Info("signal: draining", "grace", cfg.Grace, "inflight", len(st.runs))
				kick()
			}
		case <-ctxDone:
			ctxDone = nil
			a.startDrain(st, wire.ByeSignal)
			kick()
		case <-hurryc:
			hurryc = nil
			a.log.Info("second signal: skipping the grace period")
			a.terminate(st)
			kick()
		case n, ok := <-spotc: // spot
			if !ok {
				spotc = nil
				break
			}
			a.spotNotice(st, n)
			kick()
		case <-g.expired:
			g.expired = nil
			a.log.Warn("grace expired with work still running; terminating", "inflight", len(st.runs))
			a.terminate(st)
			kick()
		}
		// After every event: the drain's grace, then draining → terminating
		// once nothing runs.
		if g.update(cfg, st, a.now()) {
			a.drainNotice(st, g.end)
		}
		if a.endDrain(st) {
			kick()
		}
		a.useWake(st)
	}
}

// useWake points the wake socket at the current worker's channel, or
// closes it once the worker drains (it claims nothing more).
func (a *Agent) useWake(st *state) {
	if st.phase.leaving() {
		st.wake.Use("", "")
		return
	}
	st.wake.Use(st.sess.wakeURL, st.sess.token)
}

// gracePeriod is the drain's one grace period, whatever started the drain
// (signal, idle, drain command, spot notice): it starts with the drain, and
// a spot reclaim sooner than its end shortens it (spotGrace). expired
// fires when it ends.
type gracePeriod struct {
	started bool
	end     time.Time
	expired <-chan time.Time
}

// update reports whether the grace's end was set or moved: the bodies are
// told (drainNotice).
func (g *gracePeriod) update(cfg Config, st *state, now time.Time) bool {
	switch {
	case !st.phase.leaving():
	case !g.started:
		g.started = true
		grace := spotGrace(cfg.Grace, cfg.KillAfter, st.spotReclaim, now)
		g.end, g.expired = now.Add(grace), time.After(grace)
		return true
	case st.phase == phaseDraining && !st.spotReclaim.IsZero():
		if grace := spotGrace(cfg.Grace, cfg.KillAfter, st.spotReclaim, now); now.Add(grace).Before(g.end) {
			g.end, g.expired = now.Add(grace), time.After(grace)
			return true
		}
	}
	return false
}

// keepAliveExpired drains a daemon that ran no invocation for --keep-alive.
// Ready, that is idleness (exit 0). In setup it could not become ready: a
// host setup that failed and was not repaired, a setup command still
// running after --keep-alive (taken for hung: terminate kills it, SIGTERM
// to its process group, --kill-after, SIGKILL), or a workdir it cannot
// write; st.notReady says which, and Run answers ErrNotReady (exit 4).
func (a *Agent) keepAliveExpired(st *state) {
	ka := a.cfg.KeepAlive
	switch {
	case st.phase != phaseSetup:
		a.log.Info("idle for keep-alive; draining", "keep_alive", ka)
	case st.hostSetupErr:
		st.notReady = "the host setup failed and was not repaired"
		a.log.Error("host setup failed and was not repaired within keep-alive; draining", "keep_alive", ka)
	case st.setupBusy:
		st.notReady = "a setup command was still running after keep-alive (" + st.setupRunning + ")"
		a.log.Error("a setup command has run for longer than keep-alive: taking it for hung; draining, which kills it",
			"command", st.setupRunning, "keep_alive", ka)
	default:
		st.notReady = "the workdir is not writable"
		a.log.Error("not ready within keep-alive: the workdir is not writable; draining", "workdir", a.cfg.Workdir, "keep_alive", ka)
	}
	a.startDrain(st, wire.ByeIdle)
}

// ErrLoopPanicked is returned by Run when its loop panicked (failed:runtime).
var ErrLoopPanicked = errors.New("the agent's loop panicked")

// runLoop runs the loop. A panic in it is a runtime failure: it is logged
// with its stack, health reads failed:runtime, and salvage stops what runs.
func (a *Agent) runLoop(ctx context.Context, st *state, hello wire.HelloRequest) (err error) {
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		a.health.Failed(health.FailedRuntime)
		a.log.Error("the agent's loop panicked; stopping every body and exiting", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		err = fmt.Errorf("%w: %v", ErrLoopPanicked, p)
		a.salvage(st)
	}()
	return a.loop(ctx, st, hello)
}
