package control

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/wake"
	"github.com/dreamlake/lakeshore/shared/cadence"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// Poll is the heartbeat and the only way work reaches a daemon. In order:
// record the heartbeat (domain.Worker.Heartbeat: seen now, the state its
// phase projects to) and its setup results; tell a worker asked to drain;
// ask it again to adopt the host key it was asked for (until it advertises
// it, or says its host setup failed); hand out its pending setup commands;
// reconcile what it says it runs with what it holds (cancel what it must
// stop, with why; hand back what it never received); and, if the claim
// gate lets it (domain.AcceptsWork), claim up to its free capacity,
// waiting for work to arrive when the poll asks to and nothing else is to
// be said (news that an invocation it lists has finished rides with the
// eventual answer). auth checks the worker's token on every read of its
// row.
func (s *Service) Poll(ctx context.Context, p domain.Poll, auth store.Authorize) ([]domain.Command, error) {
	st := s.store
	w, priorListed, err := s.heartbeat(ctx, p, auth)
	if err != nil {
		return nil, err
	}
	if w, err = st.RecordSetupResults(ctx, w, p.SetupResults); err != nil {
		return nil, err
	}

	cmds := []domain.Command{}
	if w.OwesDrain(p.Phase) {
		cmds = append(cmds, domain.Command{Type: domain.CommandDrain})
	}
	if hk := w.Adopting(); hk != "" {
		cmds = append(cmds, domain.Command{Type: domain.CommandAdopt, HostKey: hk, HostSetup: w.Adoption.HostSetup})
	}
	var pending []domain.SetupCommand
	if w.MayHaveSetup() {
		if pending, err = st.SetupCommands(ctx, w.ID, true); err != nil {
			return nil, err
		}
	}
	// Unreported commands go out on every poll until reported: an answer
	// lost on the way must not leave the FIFO stuck. The daemon dedupes by id.
	for _, c := range pending {
		cmds = append(cmds, domain.Command{Type: domain.CommandSetup, CommandID: c.CommandID, Argv: c.Argv})
	}
	cancels, finished, err := s.reconcile(ctx, w, p.Inflight, priorListed)
	if err != nil {
		return nil, err
	}
	cmds = append(cmds, cancels...)

	queue := p.Queue
	if queue == "" && len(w.Lanes) > 0 {
		queue = w.Lanes[0]
	}
	ok, _ := domain.AcceptsWork(w, len(pending) > 0)
	if !ok || queue == "" {
		return append(cmds, finished...), nil
	}
	// Cancels of invocations that already finished are news the daemon can
	// hear when the poll answers: they do not cut a long poll short (a
	// daemon lists such an invocation while its own ack is on the way).
	runs, err := s.claim(ctx, w, queue, len(cmds) == 0, p.Wait)
	if err != nil {
		return nil, err
	}
	return append(append(cmds, finished...), runs...), nil
}

// reconcile compares what the daemon says it runs with what the control
// plane thinks it holds. An invocation the daemon runs but should stop gets
// a cancel command saying why: "operator" (an operator cancelled it) or
// "superseded" (an earlier attempt's ack won, or it was handed to another
// worker; the cancelled ack that follows is a no-op). An invocation the
// worker holds but the daemon's (present) list omits is handed out again:
// undelivered, without spending an attempt, when the worker's poll before
// this one did not list it either (priorListed: its run command was lost,
// domain.Invocation.Undelivered); omitted, as a lost worker's attempt, when
// that poll did (its body ran: its warm process died, or its ack was
// refused). Cancels of invocations that already finished come apart
// (finished): whatever the daemon still does for them no longer counts.
func (s *Service) reconcile(ctx context.Context, w domain.Worker, inflight, priorListed []string) (cancels, finished []domain.Command, err error) {
	if inflight == nil {
		return nil, nil, nil // an old daemon that sends no list: nothing to compare
	}
	st := s.store
	held, err := st.Held(ctx, w.ID)
	if err != nil {
		return nil, nil, err
	}
	for _, inv := range held {
		if !slices.Contains(inflight, inv.ID) {
			// Requeue re-reads the invocation and does nothing unless it still
			// runs this worker's attempt (the holder index may lag on AWS).
			loss := domain.Loss{Kind: domain.EndOmitted, Why: "omitted from its worker's poll"}
			if inv.Undelivered(priorListed) {
				loss = domain.Loss{Kind: domain.EndUndelivered, Why: "its worker never received it: no poll since its claim listed it"}
			}
			got, err := s.requeue(ctx, inv.ID, w.ID, loss)
			if err != nil {
				return nil, nil, err
			}
			s.log.Warn("redelivered an invocation its worker does not know", "worker_id", w.ID,
				"invocation_id", inv.ID, "attempt", inv.Attempt, "ended", loss.Kind, "state", got.State)
		}
	}
	for _, id := range inflight {
		i := slices.IndexFunc(held, func(inv domain.Invocation) bool { return inv.ID == id })
		// An invocation that is gone, or finished, runs no attempt: the
		// worker's, if it still runs one, no longer counts.
		over := domain.Command{Type: domain.CommandCancel, InvocationID: id, Reason: domain.CancelSuperseded}
		var inv domain.Invocation
		switch {
		case i >= 0:
			inv = held[i]
		case st.KnownFinished(id):
			// This process recorded it finished (an ack that raced this
			// poll) or read it so, and it stays finished: no need to read.
			finished = append(finished, over)
			continue
		default:
			// The holder index is eventually consistent on AWS: confirm on
			// the table before telling a worker to stop.
			inv, err = st.GetInvocation(ctx, id)
			if errors.Is(err, domain.ErrNotFound) {
				finished = append(finished, over)
				continue
			}
			if err != nil {
				return nil, nil, err
			}
		}
		why := inv.CancelReason(w.ID)
		switch {
		case why == "":
		case inv.State.Terminal():
			finished = append(finished, domain.Command{Type: domain.CommandCancel, InvocationID: id, Reason: why})
		default:
			cancels = append(cancels, domain.Command{Type: domain.CommandCancel, InvocationID: id, Reason: why})
		}
	}
	return cancels, finished, nil
}

// claim takes up to the worker's free capacity of queued work, waiting up to
// the poll's timeout (capped) for some to arrive when wait is set. A wait
// ends early when this process makes work the worker may claim (a submit,
// a hand-back: the wake hub), and re-checks the store on a backoff for work
// made elsewhere. News for the worker made in this process (a drain, a
// setup command, a newer hello, a retirement: its own wake key) ends the
// wait without a claim, and so does, without long polls, any change to the
// worker's row found at a re-check: the next poll sees it.
func (s *Service) claim(ctx context.Context, w domain.Worker, queue string, wait bool, timeout time.Duration) ([]domain.Command, error) {
	st := s.store
	free := w.MaxConcurrency - w.CurrentInvocations
	waitFor := min(timeout, s.maxWait, cadence.Of(s.staleAfter).MaxGap)
	if !wait {
		waitFor = 0
	}
	var waited time.Duration
	backoff, maxBackoff := pollBackoffMin, pollBackoffMax
	if s.longPoll {
		backoff, maxBackoff = wokenRecheck, wokenRecheck
	}
	for {
		// Registered before the look, so a wake between the look and the
		// wait is not lost.
		work, stopWork := s.wake.Wait(wake.Key(queue, ""), wake.Key(queue, w.HostKey))
		news, stopNews := s.wake.Wait(wake.WorkerKey(w.ID))
		res, err := st.Claim(ctx, w, queue, free)
		s.claimed(queue, res)
		if err != nil || len(res.Claimed) > 0 || waited >= waitFor {
			stopWork()
			stopNews()
			if err != nil || len(res.Claimed) == 0 {
				return nil, err
			}
			return s.handOut(ctx, w, res.Claimed)
		}
		d := min(backoff, waitFor-waited)
		slept, by, err := s.waitWake(ctx, work, news, d)
		stopWork()
		stopNews()
		if err != nil {
			return nil, nil // the client went away; nothing was claimed
		}
		waited += slept
		backoff = min(backoff*2, maxBackoff)
		switch {
		case by == wokenByNews:
			return nil, nil // the worker's row changed: the next poll carries it
		case s.longPoll:
			// This process makes the worker's news and wakes it: a wake for
			// work, or a re-check on the clock (for work another process
			// made), claims without reading the row, which the hand-out reads.
			// News another process made reaches the worker with its next poll.
			continue
		}
		cur, err := st.GetWorker(ctx, w.ID)
		if err != nil {
			return nil, err
		}
		if cur.Version != w.Version {
			return nil, nil
		}
	}
}

// What ended a wait (waitWake).
const (
	wokenByClock = iota // its time ran out
	wokenByWork         // work the worker may claim was made
	wokenByNews         // news for the worker was made
)

// waitWake sleeps d (Config.Sleep) or until woken by work or news,
// whichever is first, and reports how much of d it counts as waited (all
// of it after a full sleep, the time it really waited after a wake) and
// what ended it: news first when both came. An error ends the poll with
// nothing claimed: its client went away, or Sleep failed (which must not
// spin the wait).
func (s *Service) waitWake(ctx context.Context, work, news <-chan struct{}, d time.Duration) (time.Duration, int, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the goroutine below, woken or not
	go func() {
		select {
		case <-work:
			cancel()
		case <-news:
			cancel()
		case <-sctx.Done():
		}
	}()
	start := time.Now()
	err := s.sleep(sctx, d)
	if ctx.Err() == nil {
		select {
		case <-news:
			return min(d, time.Since(start)), wokenByNews, nil
		default:
		}
		select {
		case <-work:
			return min(d, time.Since(start)), wokenByWork, nil
		default:
		}
	}
	if err != nil {
		return 0, wokenByClock, err
	}
	return d, wokenByClock, nil
}

// handBackTimeout bounds the hand-back of a claim whose poll's client went
// away: it outlives the poll's own context, but not by much.
const handBackTimeout = 10 * time.Second

// handOut turns claimed invocations into run commands, unless the worker
// was retired while they were claimed, or the poll's client went away:
// then they go straight back to the queue, since nobody will run them.
func (s *Service) handOut(ctx context.Context, w domain.Worker, claimed []domain.Invocation) ([]domain.Command, error) {
	st := s.store
	if ctx.Err() != nil {
		// The poll's client went away as it claimed (it gave up waiting on
		// a busy control plane): no answer can reach the daemon, so the
		// work goes back now, undelivered, not at the worker's next poll.
		back, done := context.WithTimeout(context.WithoutCancel(ctx), handBackTimeout)
		defer done()
		for _, inv := range claimed {
			if _, err := s.requeue(back, inv.ID, w.ID, domain.Loss{Kind: domain.EndUndelivered, Why: "the poll that claimed it ended before it was answered"}); err != nil {
				return nil, err
			}
		}
		return nil, domain.Interrupted(ctx.Err())
	}
	cur, err := st.GetWorker(ctx, w.ID)
	if err != nil {
		return nil, err
	}
	if domain.Retired(cur) {
		for _, inv := range claimed {
			if _, err := s.requeue(ctx, inv.ID, w.ID, domain.Loss{Kind: domain.EndGone, Why: "its worker was retired as it claimed"}); err != nil {
				return nil, err
			}
		}
		return nil, domain.Errorf(domain.KindGone, "worker is gone; say hello again")
	}
	out := make([]domain.Command, 0, len(claimed))
	for _, inv := range claimed {
		s.log.Info("claimed", "worker_id", w.ID, "invocation_id", inv.ID, "attempt", inv.Attempt)
		out = append(out, domain.Command{Type: domain.CommandRun, Run: &inv})
	}
	return out, nil
}

// claimed reports a claim's result to the metrics: how many it took, the
// races it lost, and how long each one it took had waited for a worker.
func (s *Service) claimed(queue string, res store.ClaimResult) {
	if len(res.Claimed) == 0 && res.Conflicts == 0 {
		return
	}
	waited := make([]time.Duration, 0, len(res.Claimed))
	for _, inv := range res.Claimed {
		waited = append(waited, max(inv.StartedAt.Sub(inv.ClaimableSince()), 0))
	}
	s.metrics.Claimed(queue, len(res.Claimed), res.Conflicts, waited)
}
