package agent

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/health"
	"github.com/dreamlake/lakeshore/agent/internal/process"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// finish waits for the bodies terminate killed (bounded), acks every
// outcome that is known, flushes the acks within the bye budget and then
// says bye once, with inflight_abandoned counting only the runs whose
// outcome is not known.
func (a *Agent) finish(st *state) error {
	a.reap(st)
	a.flushAcks()
	a.flushLogs()
	if !st.machineConflict {
		// A replaced worker says no bye: the hello that replaced it
		// retired it and handed its work back, and its poll recorded the
		// conflict, so a bye could change nothing, and it would have to
		// name a reason that is not why the daemon stops.
		a.bye(st, st.abandoned)
	}
	a.health.PollerRunning(false)
	a.health.Stopped()
	a.log.Info("exit", "reason", st.exitReason(), "inflight_abandoned", st.abandoned)
	if st.machineConflict {
		return ErrMachineConflict
	}
	if st.byeReason == wire.ByeHelloFailed {
		if st.helloErr != nil {
			return st.helloErr // a refusal matches ErrHelloRefused too (exit 3)
		}
		return ErrHelloFailed
	}
	return nil
}

// reap settles every run still in st.runs: first those already over (their
// acks go out at once), then each of the others once it is over, until
// --kill-after plus the finish slack has passed. A body still running then
// could not be confirmed dead: that fails the shutdown (failed:shutdown)
// and it is handed back, counted in inflight_abandoned.
func (a *Agent) reap(st *state) {
	wait := terminateWithin(a.cfg.KillAfter, a.finishSlack)
	deadline, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ids := slices.Sorted(maps.Keys(st.runs))
	for _, id := range ids {
		if r := st.runs[id]; isDone(r.run) {
			delete(st.runs, id)
			a.settle(context.Background(), st, r)
		}
	}
	for _, id := range ids {
		r, ok := st.runs[id]
		if !ok {
			continue
		}
		delete(st.runs, id)
		select {
		case <-r.run.Done():
			a.settle(context.Background(), st, r)
			continue
		case <-deadline.Done():
		}
		r.closeView()
		st.abandoned++
		if st.phase == phaseTerminating {
			a.health.Failed(health.FailedShutdown)
		}
		pid := r.run.Pid()
		a.log.Error("cleanup not confirmed: the run was still going at the shutdown deadline; handing it back (counted in inflight_abandoned) although its processes may still be running",
			"invocation_id", id, "attempt", r.run.Attempt(), "pid", pid, "pgid", pid, "waited", wait)
	}
	a.health.SetInflight(0)
}

// settle closes the books on a run whose outcome is final. A known outcome
// is acked, even one that came in while the daemon terminated: it is never
// handed back as abandoned work. An abandoned one (killed before it ended)
// is counted for bye, which hands it back. A process group of the run that
// outlived its SIGKILL is logged as an error and, at shutdown, fails it
// (failed:shutdown).
func (a *Agent) settle(ctx context.Context, st *state, r *running) {
	o := r.run.Outcome()
	id, attempt := r.run.InvocationID(), r.run.Attempt()
	if why := handBackAsked(st, r, o); why != "" {
		// Its body asked to be handed back: the ack queues it again.
		a.log.Info("handing back at its body's request", "invocation_id", id, "attempt", attempt, "why", why)
		o = requeuedOutcome(o, why)
	}
	r.closeView()
	a.logs.Finish(id, attempt) // its files are complete: the rest of its output goes
	if pgid, pids := r.run.Unconfirmed(); pgid != 0 {
		if st.phase == phaseTerminating {
			a.health.Failed(health.FailedShutdown)
		}
		msg := "cleanup not confirmed: processes of a finished run outlived SIGKILL; its outcome is acked"
		if o.Abandoned {
			msg = "cleanup not confirmed: processes of the run outlived SIGKILL; handing it back (counted in inflight_abandoned) although they may still be running"
		}
		a.log.Error(msg, "invocation_id", id, "attempt", attempt, "pid", r.run.Pid(), "pgid", pgid, "pids", pids)
	}
	if o.Abandoned && o.Error != nil && o.Error.Type == process.ErrorTypeProcessLost {
		// Its warm process died under it, as a worker may: no ack; the next
		// poll leaves it out, and the control plane hands it out again
		// (attempt + 1), as it does a lost worker's (docs/warm.md).
		a.retention.Release(id, attempt)
		a.log.Warn("the warm process died while the body ran; the next poll hands the invocation back",
			"invocation_id", id, "attempt", attempt, "error", o.Error.Message)
		return
	}
	if o.Abandoned {
		// No ack will come for it: the next attempt runs elsewhere, or here
		// in a directory of its own.
		a.retention.Release(id, attempt)
		st.abandoned++
		a.log.Info("abandoned: killed before it ended; bye hands it back to the queue (counted in inflight_abandoned)",
			"invocation_id", id, "attempt", attempt)
		return
	}
	a.submitAck(ctx, r, o, st.phase)
}

// flushAcks waits, within the bye budget, for every ack in flight to be
// answered, so an outcome that is known reaches the control plane before
// bye hands the worker's work back.
func (a *Agent) flushAcks() {
	ctx, cancel := context.WithTimeout(context.Background(), byeTimeout)
	defer cancel()
	if a.testHookFlushing != nil {
		a.testHookFlushing()
	}
	if left := a.acker.Flush(ctx); left > 0 {
		a.log.Warn("acks still unanswered at bye; they stay spooled and the next start sends them again (the first outcome counts), but bye may hand their invocations out again meanwhile",
			"pending", left, "invocation_ids", a.acker.Pending())
	}
}

// logFlushTimeout bounds the last shipping of output at exit.
const logFlushTimeout = 5 * time.Second

// flushLogs ships, within logFlushTimeout, the rest of every finished run's
// output, so `lakeshore logs` has it whole once the daemon is gone.
func (a *Agent) flushLogs() {
	if a.logs == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), logFlushTimeout)
	defer cancel()
	if err := a.logs.Flush(ctx); err != nil {
		a.log.Warn("run output not all shipped at exit; the rest stays in the run directories", "runs", a.logs.Pending(), "error", err.Error())
	}
}

// salvage ends a daemon whose loop panicked, without trusting the loop's
// state machine: every body is killed and waited for (bounded), known
// outcomes are acked and flushed. There is no bye — none of its reasons
// says "crashed" — so the control plane treats the worker as any crashed
// one and hands its work back once it is stale (or as soon as the
// restarted daemon says hello, from a new boot id). A panic here is logged
// and ends it.
func (a *Agent) salvage(st *state) {
	defer func() {
		if p := recover(); p != nil {
			a.log.Error("panicked again while stopping after a panic; bodies may outlive the daemon", "panic", fmt.Sprint(p))
		}
		a.health.PollerRunning(false)
		a.health.Stopped()
	}()
	for _, r := range st.runs {
		r.run.Kill()
	}
	a.reap(st)
	a.flushAcks()
	a.flushLogs()
	a.log.Error("exit after a panic, without bye", "inflight_abandoned", st.abandoned)
}

func isDone(r body) bool {
	select {
	case <-r.Done():
		return true
	default:
		return false
	}
}

// bye is sent once, after the drain, with a 2 s timeout; a failure is logged
// and ignored: bye is a latency mechanism, never a reliability one.
func (a *Agent) bye(st *state, abandoned int) {
	ctx, cancel := context.WithTimeout(context.Background(), byeTimeout)
	defer cancel()
	done := a.health.RequestStarted(health.RoleBye)
	err := st.sess.api.Bye(ctx, wire.ByeRequest{WorkerID: st.sess.workerID, Reason: st.byeReason, InflightAbandoned: abandoned})
	done(err == nil)
	if err != nil {
		a.log.Debug("bye failed", "error", err.Error())
	}
}
