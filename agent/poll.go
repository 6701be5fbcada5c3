package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/acks"
	"github.com/dreamlake/lakeshore/agent/internal/health"
	"github.com/dreamlake/lakeshore/agent/internal/process"
	"github.com/dreamlake/lakeshore/shared/cadence"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// poll sends one heartbeat, handles its commands and reports how long to
// wait before the next. An idle poll is a long poll where the control plane
// offers them (holdFor): it is answered the moment work arrives, and the
// next one goes out when the interval since this one began is over, so an
// idle daemon still makes one request per interval.
func (a *Agent) poll(ctx context.Context, st *state, hello wire.HelloRequest, runDone chan<- *running) time.Duration {
	a.maybeReady(st)
	hold, began := a.holdFor(st), a.now()
	// At most a poll's worth of setup results; the rest go with the next.
	sent := st.setupResults[:min(len(st.setupResults), wire.MaxSetupResults)]
	req := wire.PollRequest{
		WorkerID:            st.sess.workerID,
		Queue:               a.cfg.Queue,
		Invocations:         a.inflightIDs(st),
		Phase:               st.phase.String(),
		HostKey:             st.hostKey,
		AdoptFailed:         st.adoptFailed,
		UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: &a.cfg.Capacity, CurrentInvocations: ptr(len(st.runs))},
		SetupResults:        sent,
		TimeoutS:            hold.Seconds(),
	}
	pctx, cancel := context.WithTimeout(ctx, requestTimeout+hold)
	if ctx.Err() != nil { // shutting down: the last polls must still go out
		pctx, cancel = context.WithTimeout(context.Background(), requestTimeout)
	}
	if hold > 0 {
		// A stop cuts a held poll short, so the drain starts at once. The
		// poll waits for work, so nothing is lost: whatever the control
		// plane claimed as it was cut off goes back with the bye.
		go func() {
			select {
			case <-a.stopc:
				cancel()
			case <-pctx.Done():
			}
		}()
	}
	done := a.health.RequestStarted(health.RolePoll)
	resp, err := st.sess.api.Poll(pctx, req)
	cutByStop := hold > 0 && err != nil && errors.Is(pctx.Err(), context.Canceled) && a.stopping()
	cancel()
	done(err == nil || cutByStop)
	a.log.Debug("poll", "phase", req.Phase, "timeout_s", req.TimeoutS, "inflight", len(req.Invocations),
		"commands", len(resp.Commands), "took_ms", a.cfg.Clock.Since(began).Milliseconds(), "ok", err == nil)
	switch {
	case errors.Is(err, wire.ErrWorkerGone) || errors.Is(err, wire.ErrUnauthorized):
		// 410: the control plane retired this worker (its work is already
		// handed out again). 401: it no longer knows this worker's token (a
		// newer hello, or a control plane that lost its state). Either way
		// this worker is over: a draining daemon just finishes; any other
		// says hello again and carries on as a new worker.
		if st.phase.leaving() {
			a.log.Warn("the control plane let go of this worker while it drained", "worker_id", st.sess.workerID, "error", err.Error())
			a.terminate(st)
			return 0
		}
		if we := (*wire.Error)(nil); errors.As(err, &we) && we.Reason == wire.ReasonReplaced {
			// Another live process said hello with this machine id (this
			// process is alive, so that was no reboot). Saying hello again
			// would retire it in turn, and the two would take each
			// other's work back forever: stop instead. What this worker
			// held is already queued again.
			a.log.Error("machine id conflict: another nymph said hello with this machine id from another boot and replaced this worker; "+
				"stopping rather than replacing it in turn. Give each host its own machine id (--machine-id, or a fresh /etc/machine-id on a cloned image)",
				"worker_id", st.sess.workerID, "machine_id", hello.MachineID, "boot_id", hello.BootID, "error", err.Error())
			a.health.Failed(health.FailedRegistration)
			st.machineConflict = true
			a.terminate(st)
			return 0
		}
		a.log.Warn("the control plane let go of this worker; saying hello again", "worker_id", st.sess.workerID, "error", err.Error())
		a.health.Unregistered()
		hctx := st.stopCtx
		if hctx == nil { // a loop not started by Run (tests)
			hctx = ctx
		}
		hello.HostKey = st.hostKey // an adopted key is this daemon's now
		sess, herr := a.hello(hctx, hello)
		if herr != nil && hctx.Err() != nil {
			// Stopped while saying hello again: a clean end, as a stop
			// before the first hello was answered is. No worker is left
			// to say bye for.
			a.log.Info("stopped before the new hello was answered; no worker to say bye for")
			a.terminate(st)
			return 0
		}
		if herr != nil {
			a.health.Failed(health.FailedRegistration)
			st.byeReason = wire.ByeHelloFailed
			st.helloErr = herr // a refusal exits 3, not 1
			a.terminate(st)
			return 0
		}
		st.sess = sess
		if st.hostSetupErr {
			// The new worker must show why it claims nothing, too.
			st.setupResults = append(st.setupResults, st.hostSetupFailure)
		}
		return 0
	case cutByStop:
		a.log.Info("a stop cut the held poll short")
		return 0
	case errors.Is(err, wire.ErrInvalid) && slices.ContainsFunc(sent, isHostSetupResult):
		// A control plane older than host-setup reports refuses a result
		// without a command id, and would refuse every heartbeat carrying
		// it: drop those reports (the log has them) rather than go stale.
		a.log.Warn("the control plane refused host-setup results; not reporting them", "error", err.Error())
		st.setupResults = slices.DeleteFunc(st.setupResults, isHostSetupResult)
		return 0
	case err != nil:
		st.pollFailures++
		a.health.SetRunState(health.RunBackoff)
		wait := min(st.sess.interval*time.Duration(1<<min(st.pollFailures, 4)), cadence.Of(st.sess.staleAfter).MaxGap)
		a.log.Warn("poll failed", "error", err.Error(), "retry_in", wait)
		return jitter(max(wait, st.sess.interval))
	}
	st.pollFailures = 0
	// The control plane answers again: acks queued through an outage go
	// now, not when their backoff runs out.
	a.acker.RetryNow()
	st.setupResults = st.setupResults[len(sent):]
	if st.adoptFailed == req.AdoptFailed {
		st.adoptFailed = ""
	}
	if st.rewake && req.HostKey == st.hostKey && st.wake != nil {
		// The control plane knows the adopted key now: a new wake socket
		// listens for its work (a socket's keys are set as it connects).
		st.rewake = false
		st.wake.Use("", "")
		a.useWake(st)
	}
	if a.testHookPolled != nil {
		a.testHookPolled(req)
	}
	gotWork := false
	for _, c := range resp.Commands {
		switch c.Type {
		case wire.CommandRun:
			gotWork = a.startRun(ctx, st, c, runDone) || gotWork
		case wire.CommandSetup:
			if !st.setupSeen[c.CommandID] {
				st.setupSeen[c.CommandID] = true
				st.setupQueue = append(st.setupQueue, c)
			}
		case wire.CommandCancel:
			if r, ok := st.runs[c.InvocationID]; ok {
				// reason "superseded": this attempt no longer counts (its work
				// was handed out again, or an outcome won); its cancelled ack
				// is a no-op. "operator": somebody cancelled the invocation.
				// An old control plane sends none.
				a.log.Info("cancel", "invocation_id", c.InvocationID, "attempt", r.run.Attempt(), "reason", c.Reason)
				r.run.Cancel()
			}
		case wire.CommandAdopt:
			a.adoptCommand(st, c)
		case wire.CommandDrain:
			if a.startDrain(st, wire.ByeDrain) {
				a.log.Info("drain command: draining", "grace", a.cfg.Grace)
			}
		}
	}
	a.nextSetup(st)
	switch {
	case st.phase.leaving():
		a.health.SetRunState(health.RunDraining)
	case len(st.runs) == 0 && a.cfg.Clock.Since(st.idleSince) > st.sess.interval:
		a.health.SetRunState(health.RunHibernating)
	default:
		a.health.SetRunState(health.RunPolling)
	}
	if gotWork && len(st.runs) < a.cfg.Capacity {
		return 0 // room for more: ask again at once
	}
	interval := a.pollInterval(st)
	if hold > 0 {
		// Held until work came or the hold ran out: the rest of the
		// interval (none, after a full hold).
		return jitter(max(0, interval-a.cfg.Clock.Since(began)))
	}
	return jitter(interval)
}

// pollInterval is the wait between polls: the session's interval, or the
// slower wake interval while the daemon is idle and its wake socket is up
// (a wake, not the poll, then brings new work).
func (a *Agent) pollInterval(st *state) time.Duration {
	if st.wake != nil && st.wake.Up() && st.sess.wakeInterval > 0 && a.claimGate(st) == claimIdle {
		return st.sess.wakeInterval
	}
	return st.sess.interval
}

// holdFor reports how long this poll may ask to be held: the session's
// long poll when the claim gate finds the daemon idle, else 0. A poll is
// never held while bodies run (their outcomes are handled between polls),
// in setup, or once a drain began (its polls say so at once).
func (a *Agent) holdFor(st *state) time.Duration {
	if a.claimGate(st) != claimIdle {
		return 0
	}
	return st.sess.longPoll
}

func writable(dir string) error {
	f, err := os.CreateTemp(dir, ".nymph-probe-*")
	if err != nil {
		return err
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// inflightIDs lists what the poll must report: bodies running, and
// outcomes whose ack the control plane has not answered yet (so it does not
// hand them out again meanwhile). Never nil: an empty list is authoritative.
func (a *Agent) inflightIDs(st *state) []string {
	out := []string{}
	for id := range st.runs {
		out = append(out, id)
	}
	for _, id := range a.acker.Pending() {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

func (a *Agent) startRun(ctx context.Context, st *state, c wire.Command, runDone chan<- *running) bool {
	inv := c.Invocation
	if inv == nil {
		return false
	}
	if _, ok := st.runs[inv.InvocationID]; ok {
		return false
	}
	if !a.claimGate(st).may() {
		// Not ours to run now. Leaving it out of the next poll's list hands it
		// straight back to the queue.
		a.log.Warn("refusing a run command", "invocation_id", inv.InvocationID, "phase", st.phase, "inflight", len(st.runs))
		return false
	}
	// Held before its directory exists: retention never removes a run in
	// progress, nor one whose ack is not answered (ackAnswered releases it).
	a.retention.Hold(inv.InvocationID, inv.Attempt)
	view, env := a.openView(st, *inv)
	run := a.runner.Start(*inv, st.sess.workerID, env)
	r := &running{run: run, session: st.sess, view: view, requeueExitCodes: inv.RunConfig.RequeueExitCodes,
		drainSignal: inv.RunConfig.DrainSignal}
	a.attachView(r, run)
	stdout, stderr := r.run.LogFiles()
	a.logs.Track(st.sess.api, st.sess.workerID, inv.InvocationID, inv.Attempt, stdout, stderr)
	st.runs[inv.InvocationID] = r
	a.health.SetInflight(len(st.runs))
	a.log.Info("run", "invocation_id", inv.InvocationID, "attempt", inv.Attempt, "worker_id", st.sess.workerID)
	if a.testHookRunStarted != nil {
		a.testHookRunStarted(inv.InvocationID)
	}
	go func() {
		<-r.run.Done()
		runDone <- r
	}()
	return true
}

func (a *Agent) runFinished(ctx context.Context, st *state, r *running) {
	id := r.run.InvocationID()
	if st.runs[id] != r {
		return // already handled at termination
	}
	delete(st.runs, id)
	a.health.SetInflight(len(st.runs))
	if len(st.runs) == 0 {
		st.idleSince = a.now()
	}
	a.settle(ctx, st, r)
	a.retention.Kick() // its directory may put the total over --keep-runs-size
}

// ackAnswered records an ack's final answer in the health record: any
// answer, even a refusal, shows the control plane reachable. The run's
// directory is then retention's to remove.
func (a *Agent) ackAnswered(sa acks.SpooledAck, _ wire.AckResponse, err error) {
	a.retention.Release(sa.Ack.InvocationID, sa.Ack.Attempt)
	key := fmt.Sprintf("%s/%d", sa.Ack.InvocationID, sa.Ack.Attempt)
	a.ackMu.Lock()
	done := a.ackDone[key]
	delete(a.ackDone, key)
	a.ackMu.Unlock()
	if done != nil {
		done(err == nil || !client.Retryable(err))
	}
}

// submitAck spools and sends r's outcome o, with the daemon's phase p as
// the run's end is handled (a requeued ack is accepted only while the
// worker drains).
func (a *Agent) submitAck(ctx context.Context, r *running, o process.Outcome, p phase) {
	ack := acks.SpooledAck{
		ControlPlane: a.cfg.ControlPlane,
		WorkerID:     r.session.workerID,
		Token:        r.session.token,
		Ack:          o.Ack(r.session.workerID, r.run.InvocationID(), r.run.Attempt(), p.String()),
		SpooledAt:    a.now().UTC(),
	}
	a.ackMu.Lock()
	a.ackDone[fmt.Sprintf("%s/%d", ack.Ack.InvocationID, ack.Ack.Attempt)] = a.health.RequestStarted(health.RoleAck)
	a.ackMu.Unlock()
	if err := a.acker.Submit(context.WithoutCancel(ctx), ack); err != nil {
		a.log.Error("could not spool an ack; sending it unspooled", "invocation_id", ack.Ack.InvocationID, "error", err.Error())
	}
	a.log.Info("finished", "invocation_id", ack.Ack.InvocationID, "attempt", ack.Ack.Attempt, "state", o.State, "duration", o.Duration)
	a.health.RunFinished(o.State)
}
