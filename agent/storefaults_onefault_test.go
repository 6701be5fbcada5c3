package agent

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/dreamlake/lakeshore/server/reaper"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// sfAckFault runs one invocation on a daemon named machine whose ack's
// transaction meets faults (aimed as its body starts), waits until it is
// done and the daemon heard the ack's answer, checks the rig's end state
// (stopAndCheck) and returns that answer.
func sfAckFault(t *testing.T, machine string, faults ...storetest.Fault) logRecord {
	t.Helper()
	r := newSFRig(t)
	inv := r.submit(t, "k")
	ag := startSFAgent(t, r.p, machine, 1, func(a *Agent) {
		var once sync.Once
		a.testHookRunStarted = func(string) { once.Do(func() { r.tr.Next("TransactWriteItems", faults...) }) }
	})
	r.waitDone(t, inv)
	ans := ag.log.wait(t, "ack answered", sfMsg("ack answered"))
	r.stopAndCheck(t, ag, []string{inv}, faults)
	return ans
}

// TestStoreFaultsOneFault puts one fault (or one per SDK attempt of one
// call) on one request of a flow and checks its exact outcome: each
// subtest aims storetest.Nth at the next request of an operation from the
// point the flow has reached.
func TestStoreFaultsOneFault(t *testing.T) {
	const (
		TWI = "TransactWriteItems"
		Put = "PutItem"
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
		if got := r.invocation(t, inv); got.Attempt != 1 || got.State != domain.StateSucceeded {
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
					// The submit first; then the next put of an invocation
					// is the claim of the next poll (whose heartbeat may put
					// the worker row, or not: a quiet one writes nothing).
					id := r.submit(t, "k")
					r.tr.NextIn(Put, store.NamesFor(r.p.Prefix).Invocations, drop)
					inv.Store(id)
				})
			}
		})
		waittest.Until(t, 10*time.Second, "the submit from the hook", func() bool { return inv.Load() != nil })
		id := inv.Load().(string)
		r.waitDone(t, id)
		r.stopAndCheck(t, ag, []string{id}, []storetest.Fault{drop})
		got := r.invocation(t, id)
		w := ag.a.Health().Snapshot().WorkerID
		if got.State != domain.StateSucceeded || got.Attempt != 2 || len(got.Attempts) != 2 ||
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
		ans := sfAckFault(t, "ack-lost", fa)
		if ans.Attrs["recorded"] != false || ans.Attrs["state"] != wire.StateSucceeded || ans.Attrs["tries"] != int64(1) {
			t.Errorf("ack answer %s; want recorded=false state=succeeded after 1 try", ans)
		}
	})

	// Every SDK attempt of the ack's transaction fails, the first after it
	// was applied: the control plane answers 503, the daemon sends the ack
	// again and hears recorded:false — the invocation counted once.
	t.Run("ack lost on every try", func(t *testing.T) {
		t.Parallel()
		ans := sfAckFault(t, "ack-lost-thrice", fa, drop, fb)
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
		ans := sfAckFault(t, "ack-delayed", delay, fb, fb)
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
		ag := startSFAgent(t, r.p, "bye-lost", 1, r.stopByeFaults(fa))
		r.waitDone(t, inv)
		if err := ag.wait(t, 30*time.Second); err != nil {
			t.Errorf("Run = %v", err)
		}
		r.checkEnd(t, ag, []string{inv}, []storetest.Fault{fa})
		if n := len(ag.log.find(sfMsg("bye failed"))); n != 0 {
			t.Errorf("bye failed %d times", n)
		}
		if w := r.worker(t, ag); w.GoneWhy != "bye: signal" {
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
		ag := startSFAgent(t, r.p, "bye-lost-thrice", 1, r.stopByeFaults(fb, fb, fb))
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
		// Its row says what its last poll, the terminating one, said.
		if got := domain.Project(w, time.Now(), sfStaleAfter); got != domain.WorkerDraining {
			t.Errorf("worker whose bye was lost reads %s, want draining (its last poll)", got)
		}
		later := time.Now().Add(sfStaleAfter + time.Second)
		if got := domain.Project(w, later, sfStaleAfter); got != domain.WorkerStale {
			t.Errorf("after the stale window it reads %s, want stale", got)
		}
		sweeper := store.New(r.p.DB, r.p.Prefix)
		sweeper.Clock = clock.Of(func() time.Time { return later })
		if res, err := sfControl(sweeper).Sweep(context.Background()); err != nil || res.Lost != 1 || res.Requeued != 0 {
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
		sweeper.Clock = clock.Of(func() time.Time { return time.Now().Add(sfStaleAfter + time.Second) })
		r.tr.Next(Put, drop)
		res, err := reaper.Handler(sfControl(sweeper), nil, nil, 0, slog.New(slog.DiscardHandler))(context.Background(), nil)
		if err != nil || res.Lost != 1 || res.Requeued != 1 {
			t.Fatalf("sweep: %+v %v; want one lost worker, one invocation handed back", res, err)
		}
		if got := r.invocation(t, inv); got.State != domain.StateQueued || got.Attempt != 1 {
			t.Fatalf("after the sweep: %s attempt %d, want queued after attempt 1", got.State, got.Attempt)
		}
		ag := startSFAgent(t, r.p, "sweep-runner", 1, nil)
		r.waitDone(t, inv)
		r.stopAndCheck(t, ag, []string{inv}, []storetest.Fault{drop})
		if got := r.invocation(t, inv); got.Attempt != 2 || got.State != domain.StateSucceeded {
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
		if got := r.invocation(t, inv); got.State != domain.StateQueued {
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
