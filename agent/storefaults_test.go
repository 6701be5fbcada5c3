package agent

// The router-level flows — hello → poll → ack → bye, the sweep and host
// status — with real daemons in process, against a control plane whose
// store reaches DynamoDB through a FaultyTransport (issue 11): requests fail
// before they are sent, are applied and then answered 500, are applied and
// then lose their connection, or are held past the client's timeout and
// land later. The SDK retries as it does in production, the daemons retry as
// they do (acks until answered, polls with backoff, hello), operators resend
// a submit with its idempotency key, and the sweep and the host poller run
// as their Lambdas do. The counts must come out exact all the same.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/dreamlake/lakeshore/shared/api"
	"github.com/dreamlake/lakeshore/shared/api/apitest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/hoststatus"
	"github.com/dreamlake/lakeshore/shared/reaper"
	"github.com/dreamlake/lakeshore/shared/store"
	"github.com/dreamlake/lakeshore/shared/store/storetest"
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
	sfEventually(t, "every invocation terminal and the stop event sent", 60*time.Second, func() (bool, string) {
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

// TestStoreFaultsOneFault puts one fault (or one per SDK attempt of one
// call) on one request of a flow and checks its exact outcome: each
// subtest aims storetest.Nth at the next request of an operation from the
// point the flow has reached.
func TestStoreFaultsOneFault(t *testing.T) {
	const (
		TWI  = "TransactWriteItems"
		Put  = "PutItem"
		none = storetest.NoFault
	)
	fb, fa, drop, delay := storetest.FailBefore, storetest.FailAfter, storetest.DropAfter, storetest.Delay

	// The daemon's hello: its one transaction (worker and machine rows)
	// applied and answered 500. The SDK's retry is refused (the machine row
	// exists now), the hello reads the machine again and answers the same
	// worker: one worker, one hello, no retry by the daemon.
	t.Run("hello answer lost", func(t *testing.T) {
		t.Parallel()
		r := newSFRig(t)
		inv := r.submit(t, "k")
		r.tr.Next(TWI, fa)
		ag := startSFAgent(t, r.p, "hello-lost", 1, nil)
		r.waitDone(t, inv)
		r.stopAndCheck(t, ag, []string{inv}, []storetest.Fault{fa})
		if n := len(ag.log.find(sfMsg("hello failed; retrying"))); n != 0 {
			t.Errorf("the daemon retried hello %d times; the SDK's retry should have answered", n)
		}
		if got := r.invocation(t, inv); got.Attempt != 1 || got.State != wire.StateSucceeded {
			t.Errorf("invocation: %s attempt %d, want succeeded on attempt 1", got.State, got.Attempt)
		}
	})

	// Every SDK attempt of hello's transaction fails, the first one after
	// it was applied: the daemon says hello again and lands on the worker
	// the first one made.
	t.Run("hello lost on every try", func(t *testing.T) {
		t.Parallel()
		r := newSFRig(t)
		inv := r.submit(t, "k")
		r.tr.Next(TWI, fa, fb, fb)
		ag := startSFAgent(t, r.p, "hello-lost-thrice", 1, nil)
		r.waitDone(t, inv)
		r.stopAndCheck(t, ag, []string{inv}, []storetest.Fault{fa, fb, fb})
		if n := len(ag.log.find(sfMsg("hello failed; retrying"))); n != 1 {
			t.Errorf("the daemon retried hello %d times, want 1", n)
		}
	})

	// A claim applied but its answer lost (the connection dropped): the
	// SDK's retry loses its version check, so the poll hands out nothing;
	// the next poll's list omits the invocation, reconcile hands it back,
	// and it runs as attempt 2 — once, counted once.
	t.Run("claim answer lost", func(t *testing.T) {
		t.Parallel()
		r := newSFRig(t)
		var inv atomic.Value
		ag := startSFAgent(t, r.p, "claim-lost", 1, func(a *Agent) {
			var once sync.Once
			a.testHookPolled = func(wire.PollRequest) {
				once.Do(func() {
					// The next poll's heartbeat puts the worker row, then its
					// claim puts the invocation.
					r.tr.Next(Put, none, drop)
					inv.Store(r.submit(t, "k")) // a transaction, not a put
				})
			}
		})
		sfEventually(t, "the submit from the hook", 10*time.Second, func() (bool, string) { return inv.Load() != nil, "" })
		id := inv.Load().(string)
		r.waitDone(t, id)
		r.stopAndCheck(t, ag, []string{id}, []storetest.Fault{drop})
		got := r.invocation(t, id)
		w := ag.a.Health().Snapshot().WorkerID
		if got.State != wire.StateSucceeded || got.Attempt != 2 || len(got.Attempts) != 2 ||
			got.Attempts[0].WorkerID != w || got.Attempts[1].WorkerID != w {
			t.Errorf("invocation: %s attempt %d attempts %+v; want succeeded on attempt 2, both attempts by %s", got.State, got.Attempt, got.Attempts, w)
		}
		if n := len(r.log.find(sfMsg("redelivered an invocation its worker does not know"))); n != 1 {
			t.Errorf("reconcile handed the lost claim back %d times, want 1", n)
		}
		if runs := ag.log.find(sfMsg("run")); len(runs) != 1 || runs[0].Attrs["attempt"] != int64(2) {
			t.Errorf("the daemon ran %v; want attempt 2 only", runs)
		}
	})

	// The ack's transaction applied and answered 500: the SDK's retry is
	// refused (the invocation moved on), the ack reads the invocation again
	// and answers recorded:false with the state its own first try wrote.
	// (On AWS the retry's ClientRequestToken makes DynamoDB answer the
	// first try's success instead: recorded:true. minidyn ignores the
	// token.) Either way the daemon sends it once and it counts once.
	t.Run("ack answer lost", func(t *testing.T) {
		t.Parallel()
		r := newSFRig(t)
		inv := r.submit(t, "k")
		ag := startSFAgent(t, r.p, "ack-lost", 1, func(a *Agent) {
			var once sync.Once
			a.testHookRunStarted = func(string) { once.Do(func() { r.tr.Next(TWI, fa) }) }
		})
		r.waitDone(t, inv)
		ans := ag.log.wait(t, "ack answered", sfMsg("ack answered"))
		r.stopAndCheck(t, ag, []string{inv}, []storetest.Fault{fa})
		if ans.Attrs["recorded"] != false || ans.Attrs["state"] != wire.StateSucceeded || ans.Attrs["tries"] != int64(1) {
			t.Errorf("ack answer %s; want recorded=false state=succeeded after 1 try", ans)
		}
	})

	// Every SDK attempt of the ack's transaction fails, the first after it
	// was applied: the control plane answers 503, the daemon sends the ack
	// again and hears recorded:false — the invocation counted once.
	t.Run("ack lost on every try", func(t *testing.T) {
		t.Parallel()
		r := newSFRig(t)
		inv := r.submit(t, "k")
		ag := startSFAgent(t, r.p, "ack-lost-thrice", 1, func(a *Agent) {
			var once sync.Once
			a.testHookRunStarted = func(string) { once.Do(func() { r.tr.Next(TWI, fa, drop, fb) }) }
		})
		r.waitDone(t, inv)
		ans := ag.log.wait(t, "ack answered", sfMsg("ack answered"))
		r.stopAndCheck(t, ag, []string{inv}, []storetest.Fault{fa, drop, fb})
		if ans.Attrs["recorded"] != false || ans.Attrs["state"] != wire.StateSucceeded || ans.Attrs["tries"] != int64(2) {
			t.Errorf("ack answer %s; want recorded=false state=succeeded on the daemon's 2nd try", ans)
		}
	})

	// The ack's transaction held past the client's timeout while the SDK's
	// retries fail: 503, and the daemon's second try races the first write,
	// which lands later. Whichever lands first wins; the other is refused
	// by its version check; the invocation counts once.
	t.Run("ack delayed", func(t *testing.T) {
		t.Parallel()
		r := newSFRig(t)
		inv := r.submit(t, "k")
		ag := startSFAgent(t, r.p, "ack-delayed", 1, func(a *Agent) {
			var once sync.Once
			a.testHookRunStarted = func(string) { once.Do(func() { r.tr.Next(TWI, delay, fb, fb) }) }
		})
		r.waitDone(t, inv)
		ans := ag.log.wait(t, "ack answered", sfMsg("ack answered"))
		r.stopAndCheck(t, ag, []string{inv}, []storetest.Fault{delay, fb, fb})
		if ans.Attrs["state"] != wire.StateSucceeded || ans.Attrs["tries"] != int64(2) {
			t.Errorf("ack answer %s; want state=succeeded on the daemon's 2nd try", ans)
		}
		t.Logf("the daemon's second try answered recorded=%v (true: it landed before the held write)", ans.Attrs["recorded"])
	})

	// bye's write of the worker row applied and answered 500: the SDK's
	// retry is refused, bye reads the row again, finds it gone and answers
	// 204. The worker is gone, as after any bye.
	t.Run("bye answer lost", func(t *testing.T) {
		t.Parallel()
		r := newSFRig(t)
		inv := r.submit(t, "k")
		ag := startSFAgent(t, r.p, "bye-lost", 1, r.stopWhenIdle(Put, fa))
		r.waitDone(t, inv)
		if err := ag.wait(t, 30*time.Second); err != nil {
			t.Errorf("Run = %v", err)
		}
		r.checkEnd(t, ag, []string{inv}, []storetest.Fault{fa})
		if n := len(ag.log.find(sfMsg("bye failed"))); n != 0 {
			t.Errorf("bye failed %d times", n)
		}
		if w := r.worker(t, ag); w.ByeReason != "bye: signal" {
			t.Errorf("worker %+v; want bye reason signal", w)
		}
	})

	// Every attempt of bye's write fails: bye is not retried (it never
	// delays exit), the worker stays as its last poll left it, and the stale window is the
	// backstop: once it passes the worker reads stale and a sweep looks
	// for its work.
	t.Run("bye lost", func(t *testing.T) {
		t.Parallel()
		r := newSFRig(t)
		inv := r.submit(t, "k")
		ag := startSFAgent(t, r.p, "bye-lost-thrice", 1, r.stopWhenIdle(Put, fb, fb, fb))
		r.waitDone(t, inv)
		if err := ag.wait(t, 30*time.Second); err != nil {
			t.Errorf("Run = %v", err)
		}
		r.settle(t, []storetest.Fault{fb, fb, fb})
		sfCheckCounts(t, sfReadTruth(t, context.Background(), r.p), []string{inv})
		if n := len(ag.log.find(sfMsg("bye failed"))); n != 1 {
			t.Errorf("bye failed %d times, want 1", n)
		}
		w := r.worker(t, ag)
		// Idle when stopped, the daemon went straight to bye: its row still
		// says what its last poll said.
		if got := domain.Project(w, time.Now(), sfStaleAfter); got != domain.WorkerActive {
			t.Errorf("worker whose bye was lost reads %s, want active (its last poll)", got)
		}
		later := time.Now().Add(sfStaleAfter + time.Second)
		if got := domain.Project(w, later, sfStaleAfter); got != domain.WorkerStale {
			t.Errorf("after the stale window it reads %s, want stale", got)
		}
		sweeper := store.New(r.p.DB, r.p.Prefix)
		sweeper.Now = func() time.Time { return later }
		if res, err := sweeper.Sweep(context.Background(), sfStaleAfter); err != nil || res.Lost != 1 || res.Requeued != 0 {
			t.Errorf("sweep after the stale window: %+v %v; want the worker lost, nothing to hand back", res, err)
		}
	})

	// The sweep hands back a crashed daemon's claim; its requeue write is
	// applied but its connection drops: the SDK's retry loses its version
	// check, the requeue reads the invocation again and finds it queued.
	// Another daemon runs it as attempt 2.
	t.Run("sweep requeue answer lost", func(t *testing.T) {
		t.Parallel()
		r := newSFRig(t)
		inv := r.submit(t, "k")
		ph := sfPhantom(t, context.Background(), r.p, "sweep-phantom", 1)
		if !slices.Equal(ph.claimed, []string{inv}) {
			t.Fatalf("the crashing daemon claimed %v, want [%s]", ph.claimed, inv)
		}
		// The reaper Lambda's own store client, through the same faults,
		// its clock past the stale window.
		sweeper := store.New(storetest.FaultyClient(r.p.Endpoint, r.tr, sfRigTimeout), r.p.Prefix)
		sweeper.Now = func() time.Time { return time.Now().Add(sfStaleAfter + time.Second) }
		r.tr.Next(Put, drop)
		res, err := reaper.Handler(sweeper, sfStaleAfter, slog.New(slog.DiscardHandler))(context.Background(), nil)
		if err != nil || res.Lost != 1 || res.Requeued != 1 {
			t.Fatalf("sweep: %+v %v; want one lost worker, one invocation handed back", res, err)
		}
		if got := r.invocation(t, inv); got.State != wire.StateQueued || got.Attempt != 1 {
			t.Fatalf("after the sweep: %s attempt %d, want queued after attempt 1", got.State, got.Attempt)
		}
		ag := startSFAgent(t, r.p, "sweep-runner", 1, nil)
		r.waitDone(t, inv)
		r.stopAndCheck(t, ag, []string{inv}, []storetest.Fault{drop})
		if got := r.invocation(t, inv); got.Attempt != 2 || got.State != wire.StateSucceeded {
			t.Errorf("invocation: %s attempt %d, want succeeded on attempt 2", got.State, got.Attempt)
		}
	})

	// EC2's stop event for a worker's instance: the host-status write is
	// applied and answered 500; the SDK's retry is refused, the write reads
	// the row again and finds it stopped, and the worker's claim is handed
	// back all the same.
	t.Run("host status answer lost", func(t *testing.T) {
		t.Parallel()
		r := newSFRig(t)
		inv := r.submit(t, "k")
		const machine = "i-00000000000000b01"
		ph := sfPhantom(t, context.Background(), r.p, machine, 1)
		if !slices.Equal(ph.claimed, []string{inv}) {
			t.Fatalf("the stopped instance's daemon claimed %v, want [%s]", ph.claimed, inv)
		}
		ops := &sfOps{p: r.p, ec2: &sfEC2{states: map[string]ec2types.InstanceStateName{}}, log: slog.New(slog.DiscardHandler)}
		r.tr.Next(Put, fa)
		if err := ops.stopEvent(context.Background(), machine); err != nil {
			t.Fatalf("stop event: %v", err)
		}
		if ops.events.Load() != 1 {
			t.Fatalf("the stop event took %d tries, want 1", ops.events.Load())
		}
		w, err := r.p.Truth.GetWorker(context.Background(), ph.workerID)
		if err != nil || w.HostStatus != domain.HostStopped || domain.Project(w, time.Now(), sfStaleAfter) != domain.WorkerGone {
			t.Fatalf("worker after the stop event: %+v %v", w, err)
		}
		if got := r.invocation(t, inv); got.State != wire.StateQueued {
			t.Fatalf("its claim after the stop event: %s, want queued", got.State)
		}
		ag := startSFAgent(t, r.p, "host-runner", 1, nil)
		r.waitDone(t, inv)
		r.stopAndCheck(t, ag, []string{inv}, []storetest.Fault{fa})
	})

	// An operator's submit: its transaction applied and answered 500. The
	// SDK's retry finds the idempotency key taken by the same request and
	// answers the first invocation (200, not 201). Then every attempt of a
	// second submit fails after the first applied: 503, and the operator's
	// resend gets that invocation back. One invocation per key.
	t.Run("submit answers lost", func(t *testing.T) {
		t.Parallel()
		r := newSFRig(t)
		ctx := context.Background()
		req := func(key string) wire.SubmitRequest {
			return wire.SubmitRequest{Queue: sfQueue, Argv: []string{"true"}, IdempotencyKey: key}
		}
		r.tr.Next(TWI, fa)
		first, created, err := r.p.op.Submit(ctx, req("a"))
		if err != nil || created {
			t.Fatalf("submit whose answer was lost: created=%v %v; want a replay of the first try", created, err)
		}
		r.tr.Next(TWI, fa, fb, fb)
		if _, _, err := r.p.op.Submit(ctx, req("b")); wire.CodeOf(err) != wire.CodeUnavailable {
			t.Fatalf("submit lost on every try: %v, want unavailable", err)
		}
		second, tries, err := sfSubmit(ctx, r.p.op, req("b"))
		if err != nil || tries != 1 {
			t.Fatalf("the operator's resend: %v after %d tries", err, tries)
		}
		ag := startSFAgent(t, r.p, "submit-runner", 1, nil)
		r.waitDone(t, first.InvocationID)
		r.waitDone(t, second.InvocationID)
		r.stopAndCheck(t, ag, []string{first.InvocationID, second.InvocationID}, []storetest.Fault{fa, fa, fb, fb})
	})
}

// sfSeed reads LAKESHORE_FAULT_SEED (default sfDefaultSeed) and logs it, so
// a failure can be replayed.
func sfSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(sfDefaultSeed)
	if v := os.Getenv("LAKESHORE_FAULT_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("LAKESHORE_FAULT_SEED=%q: want an unsigned integer", v)
		}
		seed = n
	}
	t.Logf("fault seed %d (replay: LAKESHORE_FAULT_SEED=%d go test -race -run '^%s$' ./agent/)", seed, seed, t.Name())
	return seed
}

// sfRate reads LAKESHORE_FAULT_RATE (default sfDefaultRate).
func sfRate(t *testing.T) float64 {
	t.Helper()
	v := os.Getenv("LAKESHORE_FAULT_RATE")
	if v == "" {
		return sfDefaultRate
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 || f > 0.5 {
		t.Fatalf("LAKESHORE_FAULT_RATE=%q: want a number in (0, 0.5]", v)
	}
	t.Logf("fault rate %g", f)
	return f
}

// sfPlane is a control plane whose store goes through a FaultyTransport.
type sfPlane struct {
	*apitest.Plane
	tr  *storetest.FaultyTransport
	log *logRecorder // the control plane's own log
	op  *client.Client
}

func newSFPlane(t *testing.T, tr *storetest.FaultyTransport, timeout time.Duration) *sfPlane {
	t.Helper()
	log := newLogRecorder()
	p := apitest.NewWith(t, apitest.Options{Transport: tr, ClientTimeout: timeout}, func(c *api.Config) {
		c.StaleAfter = sfStaleAfter
		c.Logger = log.logger()
	})
	return &sfPlane{Plane: p, tr: tr, log: log, op: client.New(p.URL, apitest.OperatorToken)}
}

// summary counts what the control plane's log says it did about faults.
func (p *sfPlane) summary() string {
	return fmt.Sprintf("control plane: %d lost claims handed back by reconcile, %d 5xx answers",
		len(p.log.find(sfMsg("redelivered an invocation its worker does not know"))),
		len(p.log.find(func(r logRecord) bool { return r.Level >= slog.LevelError })))
}

// sfAgent is one daemon running in process.
type sfAgent struct {
	a       *Agent
	log     *logRecorder
	machine string
	done    chan error
	ended   bool
}

// startSFAgent starts a daemon on machine with capacity; mod may set test
// hooks before it runs. The test's cleanup stops it if the test did not.
func startSFAgent(t *testing.T, p *sfPlane, machine string, capacity int, mod func(*Agent)) *sfAgent {
	t.Helper()
	dir := t.TempDir()
	log := newLogRecorder()
	a, err := New(Config{
		ControlPlane: p.URL, EnrollToken: apitest.EnrollToken, Queue: sfQueue, Capacity: capacity,
		Workdir: filepath.Join(dir, "work"), StateDir: filepath.Join(dir, "state"),
		MachineID: machine, IntrospectAddr: "off", PollInterval: sfPollEvery,
		Grace: 10 * time.Second, KillAfter: time.Second,
		Logger: log.logger(), Notifier: nopNotifier{},
	})
	if err != nil {
		t.Fatal(err)
	}
	if mod != nil {
		mod(a)
	}
	s := &sfAgent{a: a, log: log, machine: machine, done: make(chan error, 1)}
	go func() { s.done <- a.Run(context.Background()) }()
	t.Cleanup(func() {
		if !s.ended {
			a.Stop()
			a.Stop()
			select {
			case <-s.done:
			case <-time.After(30 * time.Second):
			}
		}
	})
	return s
}

// stop signals the daemon (as SIGTERM does) and waits for it to leave.
func (s *sfAgent) stop(t *testing.T) error {
	t.Helper()
	s.a.Stop()
	return s.wait(t, 30*time.Second)
}

// wait waits, at most limit, for Run to return. A daemon that does not is
// stuck: the test fails, and a second signal ends it.
func (s *sfAgent) wait(t *testing.T, limit time.Duration) error {
	t.Helper()
	select {
	case err := <-s.done:
		s.ended = true
		return err
	case <-time.After(limit):
	}
	t.Errorf("daemon on %s still running %s after it was stopped: stuck (phase %s, inflight %d)",
		s.machine, limit, s.a.Health().Snapshot().Phase, s.a.Health().Snapshot().Inflight)
	s.a.Stop()
	s.a.Stop()
	select {
	case err := <-s.done:
		s.ended = true
		return err
	case <-time.After(limit):
		t.Fatalf("daemon on %s did not end after a second signal either", s.machine)
		return nil
	}
}

// sfDaemonRetries counts the daemons' own retries, from their logs.
func sfDaemonRetries(agents []*sfAgent) string {
	var acks, polls, hellos, rehellos int
	for _, ag := range agents {
		acks += len(ag.log.find(sfMsg("ack not answered; will retry")))
		polls += len(ag.log.find(sfMsg("poll failed")))
		hellos += len(ag.log.find(sfMsg("hello failed; retrying")))
		rehellos += len(ag.log.find(sfMsg("the control plane let go of this worker; saying hello again")))
	}
	return fmt.Sprintf("%d acks resent, %d polls failed, %d hellos retried, %d re-hellos", acks, polls, hellos, rehellos)
}

func sfMsg(msg string) func(logRecord) bool {
	return func(r logRecord) bool { return r.Msg == msg }
}

// sfSubmit submits req as an operator or the CLI would against a control
// plane that answers 5xx now and then: the same request, idempotency key
// included, again after a 5xx or a transport error, a bounded number of
// times.
func sfSubmit(ctx context.Context, op *client.Client, req wire.SubmitRequest) (wire.Invocation, int, error) {
	var inv wire.Invocation
	tries, err := sfRetry(20, func() (err error) {
		inv, _, err = op.Submit(ctx, req)
		return err
	})
	return inv, tries, err
}

// sfRetry runs fn until it succeeds, fails for good (a 4xx) or has run
// tries times, backing off a little between tries; it reports how many
// tries it made.
func sfRetry(tries int, fn func() error) (int, error) {
	for try := 1; ; try++ {
		err := fn()
		if err == nil || try >= tries || !client.Retryable(err) {
			return try, err
		}
		time.Sleep(time.Duration(try) * 20 * time.Millisecond) // backoff, not synchronisation
	}
}

// sfEventually polls cond until it holds, or fails the test after limit
// with the last state cond described.
func sfEventually(t *testing.T, what string, limit time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last seen: %s", what, limit, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sfSubmitted is what the operators' submits answered, by idempotency key.
type sfSubmitted struct {
	mu    sync.Mutex
	ids   map[string]string
	extra int // tries beyond the first
}

func (s *sfSubmitted) add(key, id string, tries int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids[key] = id
	s.extra += tries - 1
}

func (s *sfSubmitted) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

func (s *sfSubmitted) retries() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.extra
}

func (s *sfSubmitted) invocationIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Values(s.ids))
}

// sfPhantomDaemon is a daemon that said hello, polled once and crashed.
type sfPhantomDaemon struct {
	machine, workerID string
	claimed           []string
}

// sfPhantom says hello for machine and polls once with room for capacity
// runs, each retried as nymph retries them, and never polls again: the
// crash after a claim that only the sweep (or EC2) can hand back.
func sfPhantom(t *testing.T, ctx context.Context, p *sfPlane, machine string, capacity int) sfPhantomDaemon {
	t.Helper()
	enroll := client.New(p.URL, apitest.EnrollToken)
	var hello wire.HelloResponse
	if _, err := sfRetry(10, func() (err error) {
		hello, err = enroll.Hello(ctx, wire.HelloRequest{
			MachineID: machine, BootID: "boot-" + machine, Lanes: []string{sfQueue},
			Capabilities: wire.Capabilities{MaxConcurrency: ptr(capacity)},
		})
		return err
	}); err != nil {
		t.Fatalf("hello for %s: %v", machine, err)
	}
	api := enroll.WithToken(hello.Token)
	var resp wire.PollResponse
	if _, err := sfRetry(10, func() (err error) {
		resp, err = api.Poll(ctx, wire.PollRequest{
			WorkerID: hello.WorkerID, Queue: sfQueue, Invocations: []string{}, Phase: wire.PhaseReady,
			UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: ptr(capacity), CurrentInvocations: ptr(0)},
		})
		return err
	}); err != nil {
		t.Fatalf("poll for %s: %v", machine, err)
	}
	d := sfPhantomDaemon{machine: machine, workerID: hello.WorkerID}
	for _, c := range resp.Commands {
		if c.Type == wire.CommandRun {
			d.claimed = append(d.claimed, c.Invocation.InvocationID)
		}
	}
	return d
}

// sfEC2 answers DescribeInstances for any instance: running unless set.
type sfEC2 struct {
	mu     sync.Mutex
	states map[string]ec2types.InstanceStateName
}

func (f *sfEC2) set(id string, s ec2types.InstanceStateName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.states[id] = s
}

func (f *sfEC2) DescribeInstances(_ context.Context, in *ec2.DescribeInstancesInput, _ ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var insts []ec2types.Instance
	for _, id := range in.InstanceIds {
		s := f.states[id]
		if s == "" {
			s = ec2types.InstanceStateNameRunning
		}
		insts = append(insts, ec2types.Instance{InstanceId: aws.String(id), State: &ec2types.InstanceState{Name: s}})
	}
	return &ec2.DescribeInstancesOutput{Reservations: []ec2types.Reservation{{Instances: insts}}}, nil
}

// sfOps runs what the scheduled Lambdas run — the reaper's sweep and the
// host-status poller — through the control plane's faulty store, and
// counts how they fared.
type sfOps struct {
	p   *sfPlane
	ec2 *sfEC2
	log *slog.Logger

	sweeps, sweepErrs, requeued atomic.Int64
	polls, pollErrs, changed    atomic.Int64
	events                      atomic.Int64
}

func (o *sfOps) sweep(ctx context.Context) error {
	res, err := reaper.Handler(o.p.Store, sfStaleAfter, o.log)(ctx, nil)
	o.sweeps.Add(1)
	o.requeued.Add(int64(res.Requeued))
	if err != nil {
		o.sweepErrs.Add(1)
	}
	return err
}

func (o *sfOps) poller() *hoststatus.Poller {
	return &hoststatus.Poller{Store: o.p.Store, EC2: o.ec2, Logger: o.log}
}

func (o *sfOps) poll(ctx context.Context) error {
	res, err := o.poller().Handle(ctx, json.RawMessage(`{"detail-type":"Scheduled Event","source":"aws.events","detail":{}}`))
	o.polls.Add(1)
	o.changed.Add(int64(res.Changed))
	if err != nil {
		o.pollErrs.Add(1)
	}
	return err
}

// stopEvent delivers EC2's "stopping" state change for instance, retried
// as EventBridge retries a failed Lambda invocation.
func (o *sfOps) stopEvent(ctx context.Context, instance string) error {
	ev := fmt.Sprintf(`{"detail-type":%q,"source":"aws.ec2","detail":{"instance-id":%q,"state":"stopping"}}`,
		hoststatus.DetailTypeStateChange, instance)
	_, err := sfRetry(10, func() error {
		o.events.Add(1)
		res, err := o.poller().Handle(ctx, json.RawMessage(ev))
		if err == nil && res.Instances != 1 {
			err = fmt.Errorf("event handled as %+v", res)
		}
		return err
	})
	return err
}

// holding reports the current worker of machine and how many invocations
// it holds, read without faults.
func (o *sfOps) holding(ctx context.Context, machine string) (string, int) {
	id, ok, err := o.p.Truth.MachineWorker(ctx, machine)
	if err != nil || !ok {
		return "", 0
	}
	held, err := o.p.Truth.Held(ctx, id)
	if err != nil {
		return id, 0
	}
	return id, len(held)
}

func (o *sfOps) summary() string {
	return fmt.Sprintf("sweeps %d (%d failed, %d handed back), host polls %d (%d failed, %d written), %d stop-event tries",
		o.sweeps.Load(), o.sweepErrs.Load(), o.requeued.Load(), o.polls.Load(), o.pollErrs.Load(), o.changed.Load(), o.events.Load())
}

// sfTerminal counts the queue's terminal invocations, read without faults.
func sfTerminal(ctx context.Context, p *sfPlane) (int, string) {
	st, err := p.Truth.QueueStats(ctx, sfQueue)
	if err != nil {
		return 0, err.Error()
	}
	n := 0
	for s, c := range st.Counts {
		if wire.Terminal(s) {
			n += c
		}
	}
	return n, fmt.Sprintf("%v done_count %d", st.Counts, st.DoneCount)
}

func sfAllTerminal(ctx context.Context, p *sfPlane, want int) bool {
	n, _ := sfTerminal(ctx, p)
	return n == want
}

// sfTruth is the end state, read without faults.
type sfTruth struct {
	invs     []domain.Invocation
	workers  []domain.Worker
	counters store.QueueCounters
	stats    wire.QueueStats
}

func sfReadTruth(t *testing.T, ctx context.Context, p *sfPlane) sfTruth {
	t.Helper()
	var out sfTruth
	cursor := ""
	for {
		page, next, err := p.Truth.ListInvocations(ctx, sfQueue, "", 500, cursor)
		if err != nil {
			t.Fatalf("list invocations: %v", err)
		}
		out.invs = append(out.invs, page...)
		if cursor = next; cursor == "" {
			break
		}
	}
	for {
		page, next, err := p.Truth.ListWorkers(ctx, 500, cursor)
		if err != nil {
			t.Fatalf("list workers: %v", err)
		}
		out.workers = append(out.workers, page...)
		if cursor = next; cursor == "" {
			break
		}
	}
	var err error
	if out.counters, err = p.Truth.Counters(ctx, sfQueue); err != nil {
		t.Fatalf("read the queue's counters: %v", err)
	}
	if out.stats, err = p.Truth.QueueStats(ctx, sfQueue); err != nil {
		t.Fatalf("queue stats: %v", err)
	}
	return out
}

// sfCheckCounts checks the invariants on the end state: the invocations are
// exactly those submitted, each terminal, none cancelled (no operator
// cancelled any), a failure only for a worker lost max_attempts times, and
// done_count and every per-state count equal to what the invocations say.
func sfCheckCounts(t *testing.T, out sfTruth, submitted []string) {
	t.Helper()
	want := map[string]bool{}
	for _, id := range submitted {
		want[id] = true
	}
	byState := map[string]int{}
	for _, inv := range out.invs {
		byState[inv.State]++
		switch {
		case !want[inv.ID]:
			t.Errorf("invocation %s was never answered to a submit (a retried submit made a second one?)", inv.ID)
		case !wire.Terminal(inv.State):
			t.Errorf("invocation %s is %s (attempt %d, worker %s): lost", inv.ID, inv.State, inv.Attempt, inv.WorkerID)
		case inv.State == wire.StateCancelled:
			t.Errorf("invocation %s was cancelled, and no operator cancelled anything: %+v", inv.ID, inv.Error)
		case inv.State == wire.StateFailed && (inv.Error == nil || inv.Error.Type != wire.ErrorTypeWorkerLost):
			t.Errorf("invocation %s failed: %+v", inv.ID, inv.Error)
		}
		delete(want, inv.ID)
	}
	for id := range want {
		t.Errorf("submitted invocation %s is missing", id)
	}
	terminal := byState[wire.StateSucceeded] + byState[wire.StateFailed] + byState[wire.StateCancelled]
	c := out.counters
	if c.Done != terminal || terminal != len(submitted) {
		t.Errorf("done_count %d, terminal invocations %d, submitted %d: they must be equal (states %v)", c.Done, terminal, len(submitted), byState)
	}
	if c.Succeeded != byState[wire.StateSucceeded] || c.Failed != byState[wire.StateFailed] || c.Cancelled != byState[wire.StateCancelled] {
		t.Errorf("per-state counts %+v; the invocations say %v", c, byState)
	}
	if out.stats.DoneCount != c.Done {
		t.Errorf("queue stats done_count %d, the queue row %d", out.stats.DoneCount, c.Done)
	}
	for _, s := range wire.InvocationStates {
		if out.stats.Counts[s] != byState[s] {
			t.Errorf("queue stats count %d %s (the index), the table %d", out.stats.Counts[s], s, byState[s])
		}
	}
	if byState[wire.StateFailed] > 0 {
		t.Logf("%d invocations failed as worker_lost (max_attempts spent on lost claims): allowed", byState[wire.StateFailed])
	}
}

// sfCheckRan checks that every succeeded invocation's body ran (the bodies
// append "id attempt" to ran); a redelivered body may run more than once.
func sfCheckRan(t *testing.T, ran string, out sfTruth) {
	t.Helper()
	f, err := os.Open(ran)
	if err != nil {
		t.Fatalf("ran log: %v", err)
	}
	defer f.Close()
	runs := map[string]int{}
	lines := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		id, _, _ := strings.Cut(sc.Text(), " ")
		runs[id]++
		lines++
	}
	twice := 0
	for _, inv := range out.invs {
		if inv.State == wire.StateSucceeded && runs[inv.ID] == 0 {
			t.Errorf("invocation %s succeeded but its body never ran", inv.ID)
		}
		if runs[inv.ID] > 1 {
			twice++
		}
	}
	t.Logf("bodies ran %d times for %d invocations (%d ran more than once: at least once, recorded once)", lines, len(out.invs), twice)
}

// sfRig is a control plane for one aimed fault: its store's faults come
// from arm, which starts with none.
type sfRig struct {
	p   *sfPlane
	tr  *storetest.FaultyTransport
	log *logRecorder
}

// sfRigTimeout bounds one store request in a rig: generous, so no request
// times out but the one a Delay fault holds (for sfRigHold).
const (
	sfRigTimeout = 500 * time.Millisecond
	sfRigHold    = 1500 * time.Millisecond
)

func newSFRig(t *testing.T) *sfRig {
	t.Helper()
	tr := storetest.NewFaultyTransport(nil)
	tr.Hold = sfRigHold
	p := newSFPlane(t, tr, sfRigTimeout)
	return &sfRig{p: p, tr: tr, log: p.log}
}

// submit queues `true` under key, as an operator would; it reports the id.
func (r *sfRig) submit(t *testing.T, key string) string {
	inv, _, err := sfSubmit(context.Background(), r.p.op, wire.SubmitRequest{Queue: sfQueue, Argv: []string{"true"}, IdempotencyKey: key})
	if err != nil {
		t.Errorf("submit %s: %v", key, err)
	}
	return inv.InvocationID
}

// waitDone waits until invocation id is terminal, read without faults.
func (r *sfRig) waitDone(t *testing.T, id string) {
	t.Helper()
	sfEventually(t, "invocation "+id+" terminal", 20*time.Second, func() (bool, string) {
		inv, err := r.p.Truth.GetInvocation(context.Background(), id)
		if err != nil {
			return false, err.Error()
		}
		return wire.Terminal(inv.State), fmt.Sprintf("%s attempt %d", inv.State, inv.Attempt)
	})
}

func (r *sfRig) invocation(t *testing.T, id string) domain.Invocation {
	t.Helper()
	inv, err := r.p.Truth.GetInvocation(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// worker reads the daemon's current worker, without faults.
func (r *sfRig) worker(t *testing.T, ag *sfAgent) domain.Worker {
	t.Helper()
	w, err := r.p.Truth.GetWorker(context.Background(), ag.a.Health().Snapshot().WorkerID)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// stopWhenIdle makes the daemon, once it has run something and its ack is
// answered (its poll lists nothing), aim faults at the next requests of op
// and stop: the drain, one last poll, then bye, all on the loop's goroutine
// so nothing else comes between.
func (r *sfRig) stopWhenIdle(op string, faults ...storetest.Fault) func(*Agent) {
	return func(a *Agent) {
		var ran atomic.Bool
		var once sync.Once
		a.testHookRunStarted = func(string) { ran.Store(true) }
		a.testHookPolled = func(req wire.PollRequest) {
			if ran.Load() && len(req.Invocations) == 0 {
				once.Do(func() {
					r.tr.Next(op, faults...)
					a.Stop()
				})
			}
		}
	}
}

// stopAndCheck stops the daemon (SIGTERM, bye) and checks the end: see
// checkEnd.
func (r *sfRig) stopAndCheck(t *testing.T, ag *sfAgent, invs []string, want []storetest.Fault) {
	t.Helper()
	if err := ag.stop(t); err != nil {
		t.Errorf("Run = %v", err)
	}
	r.checkEnd(t, ag, invs, want)
}

// checkEnd checks, once delayed writes landed, that exactly the faults
// aimed were injected, that the counts hold for invs, and that the
// daemon's worker (its only one) is gone.
func (r *sfRig) checkEnd(t *testing.T, ag *sfAgent, invs []string, want []storetest.Fault) {
	t.Helper()
	r.settle(t, want)
	out := sfReadTruth(t, context.Background(), r.p)
	sfCheckCounts(t, out, invs)
	w := r.worker(t, ag)
	if got := domain.Project(w, time.Now(), sfStaleAfter); got != domain.WorkerGone {
		t.Errorf("worker %s reads %s after bye", w.ID, got)
	}
	n := 0
	for _, x := range out.workers {
		if x.MachineID == ag.machine {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d workers for machine %s, want 1", n, ag.machine)
	}
}

// settle waits for delayed writes and checks the faults injected were
// exactly want.
func (r *sfRig) settle(t *testing.T, want []storetest.Fault) {
	t.Helper()
	r.tr.Settle()
	var got []storetest.Fault
	for _, in := range r.tr.Injected() {
		got = append(got, in.Fault)
	}
	if !slices.Equal(got, want) {
		t.Errorf("faults injected %v, want %v", r.tr.Injected(), want)
	}
}
