package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/lifecycle"
	"github.com/dreamlake/lakeshore/agent/internal/process"
	"github.com/dreamlake/lakeshore/agent/internal/publish"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// What nymph tells bodies of its lifecycle (docs/lifecycle.md): each run
// reads its own view at NYMPH_LIFECYCLE_URL, hears the drain there (and
// by run_config.drain_signal) at the start of the grace window, and may
// ask to be handed back instead of recorded.

// EnvLifecycleURL names the variable that gives a body its view's URL.
const EnvLifecycleURL = "NYMPH_LIFECYCLE_URL"

// startViews starts the lifecycle endpoint (--lifecycle-addr) and reports
// how to stop it. A
// daemon that cannot listen runs on without it: its bodies get no
// NYMPH_LIFECYCLE_URL, and hear a drain only by their drain_signal.
func (a *Agent) startViews() (stop func()) {
	if a.cfg.LifecycleAddr == "" || a.cfg.LifecycleAddr == "off" {
		return func() {}
	}
	s, err := lifecycle.Listen(a.cfg.LifecycleAddr, lifecycle.Config{Logger: a.log, Members: process.GroupMembers})
	if err != nil {
		a.log.Warn("no lifecycle endpoint: bodies get no NYMPH_LIFECYCLE_URL", "error", err.Error())
		return func() {}
	}
	a.views = s
	// A packed directory waits in the state directory, which no body
	// sees; what a killed daemon left there is of no use.
	tmp := filepath.Join(a.cfg.StateDir, "publish")
	if err := os.RemoveAll(tmp); err != nil {
		a.log.Warn("cannot clear the directory of packed artifacts", "error", err.Error())
	}
	if a.publisher, err = publish.New(publish.Config{TempDir: tmp, Logger: a.log}); err != nil {
		a.log.Warn("bodies cannot publish artifacts", "error", err.Error())
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = s.Close(ctx)
	}
}

// openView registers run inv's view and reports the variables that name
// it to the body (none without an endpoint).
func (a *Agent) openView(st *state, inv wire.RunInvocation) (*lifecycle.Handle, map[string]string) {
	if a.views == nil {
		return nil, nil
	}
	h, err := a.views.Add(lifecycle.Run{HostKey: st.hostKey, WorkerID: st.sess.workerID, InvocationID: inv.InvocationID, Attempt: inv.Attempt})
	if err != nil {
		a.log.Warn("no lifecycle view for this run", "invocation_id", inv.InvocationID, "attempt", inv.Attempt, "error", err.Error())
		return nil, nil
	}
	return h, map[string]string{EnvLifecycleURL: h.URL()}
}

// attachView ties r's view to its processes: a request is answered only
// to them, a requeue ends the run (its outcome is then settled as
// requeued, whatever it was), and a publish records an artifact of its
// attempt from its run directory, with the worker token of the session
// that claimed it.
func (a *Agent) attachView(r *running, run *process.Run) {
	if r.view == nil {
		return
	}
	r.view.Attach(run.Started(), run.Group, run.Kill)
	dir, bodyDir, err := run.Dirs()
	if a.publisher == nil || err != nil {
		return
	}
	t := publish.Target{API: r.session.api, WorkerID: r.session.workerID, InvocationID: run.InvocationID(), Attempt: run.Attempt(),
		RunDir: dir, BodyDir: bodyDir}
	if a.runAs != nil {
		uid := a.runAs.Cred.Uid
		t.Owner = &uid
	}
	r.view.AttachPublish(func(ctx context.Context, req lifecycle.PublishRequest) (wire.Artifact, error) {
		return a.publisher.Publish(ctx, t, req.Path, req.Name)
	})
}

// closeView forgets r's view: its URL answers 404 from now on.
func (r *running) closeView() {
	if r.view != nil {
		r.view.Close()
	}
}

// drainNotice tells every run the drain's grace ends at deadline: their
// views read draining (a wait returns), and on the first notice each run
// with a run_config.drain_signal gets it, inside the grace window.
func (a *Agent) drainNotice(st *state, deadline time.Time) {
	if a.views != nil {
		a.views.Drain(deadline)
	}
	a.runner.DrainWarm()
	for id, r := range st.runs {
		sig := drainSignalOf(r.drainSignal)
		if sig == 0 || r.signalled {
			continue
		}
		r.signalled = true
		// sent is false when no process of the run was running: the run
		// keeps the signal for the next one it starts (process.Run.Signal).
		sent := r.run.Signal(sig)
		a.log.Info("drain signal", "invocation_id", id, "attempt", r.run.Attempt(), "signal", r.drainSignal, "sent", sent, "deadline", deadline)
	}
}

// drainSignalOf reads run_config.drain_signal: one of wire.DrainSignals
// (validated at submit); anything else, from a newer control plane, sends
// none.
func drainSignalOf(name string) syscall.Signal {
	if !slices.Contains(wire.DrainSignals, name) {
		return 0
	}
	sig, _ := process.SignalNamed(name)
	return sig
}

// handBackAsked reports why r's body asked to be handed back, or "": it
// asked on its lifecycle endpoint, or it ended during the drain with one
// of run_config.requeue_exit_codes (not when an operator cancelled it, or
// it timed out: those outcomes stand).
func handBackAsked(st *state, r *running, o process.Outcome) string {
	switch {
	case r.view != nil && r.view.Requeued():
		return "asked on its lifecycle endpoint"
	case !st.phase.leaving() || o.ExitCode == nil || o.State == wire.StateCancelled:
		return ""
	case o.Error != nil && o.Error.Type == process.ErrorTypeTimeout:
		return ""
	case slices.Contains(r.requeueExitCodes, *o.ExitCode):
		return fmt.Sprintf("exited with status %d, one of run_config.requeue_exit_codes", *o.ExitCode)
	}
	return ""
}

// requeuedOutcome is o reported as a hand-back: the ack asks the control
// plane to queue the invocation again (attempt + 1), so it is neither
// recorded nor abandoned.
func requeuedOutcome(o process.Outcome, why string) process.Outcome {
	o.State = wire.AckRequeued
	o.Abandoned = false
	o.ResultBlob = nil
	o.Error = &wire.ErrorInfo{Type: wire.AckRequeued, Message: why}
	return o
}
