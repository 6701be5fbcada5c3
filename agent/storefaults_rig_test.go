package agent

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

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
	waittest.UntilState(t, 20*time.Second, "invocation "+id+" terminal", func() (bool, string) {
		inv, err := r.p.Truth.GetInvocation(context.Background(), id)
		if err != nil {
			return false, err.Error()
		}
		return inv.State.Terminal(), fmt.Sprintf("%s attempt %d", inv.State, inv.Attempt)
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

// stopByeFaults makes the daemon, once it has run something and its ack is
// answered (its poll lists nothing), stop, and aims faults at bye's write
// of the worker row: the drain (nothing runs, so straight to terminating),
// the terminating poll, whose heartbeat is the next PutItem and meets no
// fault, then bye, whose PutItem (one per SDK attempt) meets faults.
func (r *sfRig) stopByeFaults(faults ...storetest.Fault) func(*Agent) {
	return func(a *Agent) {
		var ran atomic.Bool
		var once sync.Once
		a.testHookRunStarted = func(string) { ran.Store(true) }
		a.testHookPolled = func(req wire.PollRequest) {
			if ran.Load() && len(req.Invocations) == 0 {
				once.Do(func() {
					r.tr.Next("PutItem", append([]storetest.Fault{storetest.NoFault}, faults...)...)
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
