package agent

// The router-level flows — hello → poll → ack → bye, the sweep and host
// status — with real daemons in process, against a control plane whose
// store reaches DynamoDB through a FaultyTransport: requests fail
// before they are sent, are applied and then answered 500, are applied and
// then lose their connection, or are held past the client's timeout and
// land later. The SDK retries as it does in production, the daemons retry as
// they do (acks until answered, polls with backoff, hello), operators resend
// a submit with its idempotency key, and the sweep and the host poller run
// as their Lambdas do. The counts must come out exact all the same.

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

const (
	sfQueue      = "q"
	sfStaleAfter = 3 * time.Second        // hello answers a 0.5 s poll interval
	sfPollEvery  = 200 * time.Millisecond // the daemons poll faster still (≤ stale_after / 3)
	// sfDefaultSeed is the fault seed without LAKESHORE_FAULT_SEED.
	sfDefaultSeed = 20261129
	// sfDefaultRate is the share of store requests that get a fault
	// without LAKESHORE_FAULT_RATE.
	sfDefaultRate = 0.1
)

// TestStoreFaultsRouterFlows runs three real daemons (capacities 2, 3 and
// 4) and a daemon that crashes after its first claim against a control
// plane whose every store request may meet a fault (storetest.Random, every
// kind). Operators submit 50 invocations, each with an idempotency key and
// resent after a 5xx; the reaper's sweep and the host-status poller run on a
// ticker; one instance's stop event retires its worker while it holds work,
// and its daemon gets SIGTERM; the others leave by SIGTERM → bye once the
// queue is drained. Then, with the faults off and every delayed write
// landed, the fault-free store must show: every invocation terminal, none
// cancelled, done_count and each per-state count equal to what the
// invocations say, one invocation per idempotency key, every daemon's
// workers gone (or, where a bye was lost, stale: the stale window is the
// backstop), nothing held — and faults of every kind injected.
//
// The seed (LAKESHORE_FAULT_SEED, logged) fixes the fault sequence by
// request order; with four daemons the order is not fixed, so a replay
// meets the same faults in roughly, not exactly, the same places.
// LAKESHORE_FAULT_RATE overrides the rate (default 0.1).
func TestStoreFaultsRouterFlows(t *testing.T) {
	seed, rate := sfSeed(t), sfRate(t)
	began := time.Now()
	tr := storetest.NewFaultyTransport(storetest.Random(seed, rate))
	tr.Hold = 300 * time.Millisecond
	p := newSFPlane(t, tr, 150*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ran := filepath.Join(t.TempDir(), "ran.log")
	const total, before = 50, 20
	submitted := &sfSubmitted{ids: map[string]string{}}
	submit := func(i int) {
		req := wire.SubmitRequest{
			Queue: sfQueue, MaxAttempts: 5, IdempotencyKey: fmt.Sprintf("sf-%d", i),
			Argv: []string{"/bin/sh", "-c", `echo "$NYMPH_INVOCATION_ID $NYMPH_ATTEMPT" >>` + ran + `; sleep 0.1`},
		}
		inv, tries, err := sfSubmit(ctx, p.op, req)
		if err != nil {
			t.Errorf("submit %s: %v (after %d tries)", req.IdempotencyKey, err, tries)
			return
		}
		submitted.add(req.IdempotencyKey, inv.InvocationID, tries)
	}

	// Some work before anyone polls, so the crashing daemon claims some.
	for i := range before {
		submit(i)
	}
	phantom := sfPhantom(t, ctx, p, "i-00000000000000fff", 3)
	t.Logf("a daemon claimed %v on its first poll and then went silent (a crash)", phantom.claimed)

	machines := []string{"i-00000000000000a01", "i-00000000000000a02", "i-00000000000000a03"}
	var agents []*sfAgent
	for i, m := range machines {
		agents = append(agents, startSFAgent(t, p, m, 2+i, nil))
	}
	var submitting sync.WaitGroup
	submitting.Go(func() {
		for i := before; i < total; i++ {
			submit(i)
		}
	})

	// The reaper and the host poller, as their schedules run them; EC2
	// stops agents[0]'s instance once its worker holds work (the event
	// path), and its daemon is told to stop as the OS shuts down.
	ec2fake := &sfEC2{states: map[string]ec2types.InstanceStateName{}}
	ops := &sfOps{p: p, ec2: ec2fake, log: slog.New(slog.DiscardHandler)}
	stopOps := make(chan struct{})
	var opsDone sync.WaitGroup
	var retired atomic.Value // string: the worker the stop event retired
	opsDone.Go(func() {
		tick := time.NewTicker(150 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopOps:
				return
			case <-tick.C:
			}
			ops.sweep(ctx)
			ops.poll(ctx)
			if retired.Load() != nil {
				continue
			}
			id, held := ops.holding(ctx, machines[0])
			if held == 0 && submitted.len() < total {
				continue
			}
			if held == 0 && !sfAllTerminal(ctx, p, submitted.len()) {
				continue
			}
			if err := ops.stopEvent(ctx, machines[0]); err != nil {
				t.Errorf("stop event for %s: %v", machines[0], err)
			}
			ec2fake.set(machines[0], ec2types.InstanceStateNameStopped)
			agents[0].a.Stop() // the OS shuts down: SIGTERM
			retired.Store(id)
			t.Logf("EC2 stopped %s while its worker %s held %d invocations; its daemon got SIGTERM", machines[0], id, held)
		}
	})

	submitting.Wait()
	if t.Failed() {
		close(stopOps)
		opsDone.Wait()
		t.FailNow()
	}
	waittest.UntilState(t, 60*time.Second, "every invocation terminal and the stop event sent", func() (bool, string) {
		n, state := sfTerminal(ctx, p)
		return n == total && retired.Load() != nil, state
	})
	drained := time.Since(began)
	close(stopOps)
	opsDone.Wait()

	// SIGTERM → drain → bye; each daemon must leave on its own.
	for _, ag := range agents {
		if err := ag.stop(t); err != nil {
			t.Errorf("daemon on %s: Run = %v", ag.machine, err)
		}
	}
	// One more sweep and host poll with the faults still on, retried as a
	// failed Lambda invocation is.
	for _, step := range []struct {
		name string
		fn   func(context.Context) error
	}{{"sweep", ops.sweep}, {"host poll", ops.poll}} {
		if _, err := sfRetry(10, func() error { return step.fn(ctx) }); err != nil {
			t.Errorf("final %s: %v", step.name, err)
		}
	}

	tr.SetSchedule(storetest.Never())
	tr.Settle()
	out := sfReadTruth(t, ctx, p)
	sfCheckCounts(t, out, submitted.invocationIDs())
	sfCheckRan(t, ran, out)

	// Workers: every one a daemon ran as is gone — unless its bye was
	// lost, when it must read stale once the window passes — and the
	// crashed daemon's reads stale; none holds anything.
	now := time.Now()
	byeLost := map[string]bool{}
	rehellos := map[string]int{}
	answered := map[string]map[string]bool{} // machine → worker ids its hellos were answered with
	for _, ag := range agents {
		answered[ag.machine] = map[string]bool{}
		for _, r := range ag.log.find(sfMsg("hello")) {
			answered[ag.machine][fmt.Sprint(r.Attrs["worker_id"])] = true
		}
		if len(ag.log.find(sfMsg("bye failed"))) > 0 {
			byeLost[ag.a.Health().Snapshot().WorkerID] = true
			t.Logf("the bye of %s was lost: the stale window is its backstop", ag.machine)
		}
		rehellos[ag.machine] = len(ag.log.find(sfMsg("the control plane let go of this worker; saying hello again")))
	}
	perMachine := map[string]int{}
	for _, w := range out.workers {
		perMachine[w.MachineID]++
		delete(answered[w.MachineID], w.ID)
		held, err := p.Truth.Held(ctx, w.ID)
		if err != nil || len(held) > 0 {
			t.Errorf("worker %s (%s) still holds %d invocations (%v)", w.ID, w.MachineID, len(held), err)
		}
		got := domain.Project(w, now, sfStaleAfter)
		switch {
		case w.MachineID == phantom.machine:
			if got != domain.WorkerStale {
				t.Errorf("the crashed daemon's worker %s reads %s, want stale", w.ID, got)
			}
		case byeLost[w.ID]:
			if later := domain.Project(w, now.Add(sfStaleAfter+time.Second), sfStaleAfter); later != domain.WorkerStale && later != domain.WorkerGone {
				t.Errorf("worker %s whose bye was lost reads %s after the stale window", w.ID, later)
			}
		case got != domain.WorkerGone:
			t.Errorf("worker %s (%s) reads %s after its daemon's bye: %+v", w.ID, w.MachineID, got, w)
		}
	}
	// One worker per hello at most (a retried hello whose answer was lost
	// lands on the worker its first try made), and every answered one is
	// there. A hello the stop cut short may have made none.
	for _, m := range machines {
		if perMachine[m] > 1+rehellos[m] {
			t.Errorf("machine %s has %d workers; its daemon said hello %d times (a lost hello answer must not make a second worker)",
				m, perMachine[m], 1+rehellos[m])
		}
		if len(answered[m]) > 0 {
			t.Errorf("machine %s: hellos answered workers %v that the store does not have", m, slices.Sorted(maps.Keys(answered[m])))
		}
	}
	if len(perMachine) != len(machines)+1 {
		t.Errorf("workers on machines %v; want %v and %s", slices.Sorted(maps.Keys(perMachine)), machines, phantom.machine)
	}
	for _, ag := range agents {
		for _, r := range ag.log.find(sfMsg("ack rejected by the control plane; dropped")) {
			t.Errorf("daemon on %s: %s", ag.machine, r)
		}
	}

	// The faults must have happened, every kind of them.
	inj := tr.Injected()
	kinds, perOp := map[storetest.Fault]int{}, map[string]int{}
	for _, in := range inj {
		kinds[in.Fault]++
		perOp[in.Op]++
	}
	t.Logf("faults injected: %d — by kind %v, by operation %v", len(inj), kinds, perOp)
	t.Logf("daemon retries: %s; operator submit retries: %d; %s; %s", sfDaemonRetries(agents), submitted.retries(),
		p.summary(), ops.summary())
	t.Logf("timings: drained in %s, all done in %s", drained.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
	if len(inj) < 40 {
		t.Errorf("only %d faults injected: the test proved little", len(inj))
	}
	for _, f := range []storetest.Fault{storetest.FailBefore, storetest.FailAfter, storetest.DropAfter, storetest.Delay} {
		if kinds[f] == 0 {
			t.Errorf("no %s fault injected", f)
		}
	}
}
