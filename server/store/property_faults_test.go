package store_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestStorePropertyUnderFaults drives the store through the same random
// walks as TestStoreProperty, but every request the store makes goes
// through a FaultyTransport: a request may fail before it is sent, be
// applied and then answered 500, be applied and then lose its connection,
// or be held past the client's timeout and applied later. Each call is
// retried as its real caller retries (a daemon resends an ack until it is
// answered, says hello again, polls again; an operator resends a submit
// with its idempotency key or a cancel), and a claim whose answer was lost
// is handed back as the next poll's reconcile does.
//
// A faulted call's answer cannot be predicted exactly (was the first try
// applied?), so after each step the model takes the store's state — after
// checking that the step moved every invocation and worker only along a
// transition the lifecycle allows — and the invariants are checked on what
// the store holds: done_count and every per-state count equal the
// invocations in those states (one terminal write is one count, however
// many times it was retried), no invocation is cancelled without an
// operator's cancel, a terminal state never changes, attempts never go
// back, and at the end every queued invocation is reached by claims.
//
// The fault schedule is drawn from rapid, so a failure replays with the
// seed rapid prints (go test -run TestStorePropertyUnderFaults
// -rapid.seed=N ./server/store/). Walks run until LAKESHORE_PROPERTY_STEPS
// steps were taken (default 1,000); LAKESHORE_FAULT_RATE sets the share of
// requests that meet a fault (default 0.1).
func TestStorePropertyUnderFaults(t *testing.T) {
	setDefaultFlag("rapid.checks", "25")
	setDefaultFlag("rapid.shrinktime", "20s")
	target := envInt(t, "LAKESHORE_PROPERTY_STEPS", 1000)
	rate := 0.1
	if v := os.Getenv("LAKESHORE_FAULT_RATE"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 0.5 {
			t.Fatalf("LAKESHORE_FAULT_RATE=%q: want a number in [0, 0.5]", v)
		}
		rate = f
	}
	endpoint := storetest.EmbeddedEndpoint(t)
	truthDB := storetest.Client(endpoint)
	base := storetest.Prefix(t)
	var walks, steps atomic.Int64
	kinds := map[storetest.Fault]int{}
	// Each rapid.Check runs -rapid.checks walks; more run until the steps
	// reach the target (bounded: a walk takes at least one step).
	for round := 0; steps.Load() < int64(target) && round < target; round++ {
		rapid.Check(t, func(rt *rapid.T) {
			prefix := fmt.Sprintf("%sf%d-", base, walks.Add(1))
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := schema.EnsureTables(ctx, truthDB, prefix); err != nil {
				rt.Fatalf("EnsureTables: %v", err)
			}
			seed := rapid.Uint64().Draw(rt, "faultSeed")
			tr := storetest.NewFaultyTransport(storetest.Random(seed, rate))
			tr.Hold = 150 * time.Millisecond
			c := clock.NewFake(t0)
			s := store.New(storetest.FaultyClient(endpoint, tr, 100*time.Millisecond), prefix)
			truth := store.New(truthDB, prefix)
			for _, st := range []*store.Store{s, truth} {
				st.Clock = c.Clock()
				st.Shuffle = func(int, func(i, j int)) {}
			}
			s.IDs = &ids.Generator{Clock: c.Clock()}
			s.RememberWrites = rapid.Bool().Draw(rt, "rememberWrites")
			m := &propModel{
				ctx: ctx, s: s, svc: storetest.Control(s), clock: c, read: truth,
				machines: map[string]*mMachine{}, workers: map[string]*mWorker{}, invs: map[string]*mInv{},
				seenAttempt: map[string]int{}, seenTerminal: map[string]domain.InvocationState{},
			}
			f := &faultModel{propModel: m, tr: tr, truth: truth, steps: &steps}
			f.run(rt)
			for _, in := range tr.Injected() {
				kinds[in.Fault]++
			}
		})
		if t.Failed() {
			return
		}
	}
	total := 0
	for _, n := range kinds {
		total += n
	}
	t.Logf("%d walks, %d steps, %d faults injected: %v", walks.Load(), steps.Load(), total, kinds)
	if total == 0 && rate > 0 {
		t.Fatalf("no fault was injected: the test proved nothing")
	}
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// faultModel runs the model's walks against a store behind faults. tr
// injects them; truth reads the same tables without faults.
type faultModel struct {
	*propModel
	tr    *storetest.FaultyTransport
	truth *store.Store
	keys  int           // idempotency keys used
	steps *atomic.Int64 // steps taken, over every walk
}

func (f *faultModel) run(rt *rapid.T) {
	step := func(action func(*rapid.T)) func(*rapid.T) {
		return func(rt *rapid.T) {
			f.steps.Add(1)
			action(rt)
			f.tr.Settle() // delayed writes land before the model looks
			f.resync(rt)
			f.check(rt)
		}
	}
	rt.Repeat(map[string]func(*rapid.T){
		"hello":     step(f.hello),
		"heartbeat": step(f.heartbeat),
		"claim":     step(f.claim),
		"ack":       step(f.ack),
		"bye":       step(f.bye),
		"markGone":  step(f.markGone),
		"sweep":     step(f.sweep),
		"advance":   step(f.advance),
		"submit":    step(f.submit),
		"submitRun": step(f.submitRun),
		"cancel":    step(f.cancel),
		"return":    step(f.returnFromStale),
		"":          func(rt *rapid.T) { f.check(rt) },
	})
	f.tr.SetSchedule(storetest.Never())
	f.drainQueue(rt)
}

// retry runs call until it is answered with something other than "the
// store did not answer" (bounded), as the callers retry.
func retry[T any](rt *rapid.T, op string, call func() (T, error)) (T, error) {
	rt.Helper()
	var v T
	var err error
	for range 30 {
		v, err = call()
		if err == nil || !unanswered(err) {
			return v, err
		}
		rt.Logf("%s: %v; again", op, err)
	}
	rt.Fatalf("%s: still failing after 30 tries: %v", op, err)
	return v, err
}

// unanswered reports whether err means the store gave no usable answer (a
// fault, a timeout), as opposed to a decision (403, 404, 409, 410, 401).
func unanswered(err error) bool {
	code := wire.CodeOf(err)
	return code == "" || code == wire.CodeUnavailable || code == wire.CodeInternal
}

func (f *faultModel) hello(rt *rapid.T) {
	name := rapid.SampledFrom(propMachines).Draw(rt, "machine")
	newBoot := rapid.Bool().Draw(rt, "newBoot")
	boot := 1
	if mach, ok := f.machines[name]; ok {
		boot = mach.boot
		if newBoot {
			boot++
		}
	}
	req := wire.HelloRequest{MachineID: name, BootID: fmt.Sprintf("boot-%d", boot), Label: name, Lanes: []string{propQueue}}
	rt.Logf("hello %s %s", name, req.BootID)
	res, err := retry(rt, "hello", func() (control.Registered, error) { return f.svc.Register(f.ctx, req.Registration(), f.issue) })
	propWant(rt, "hello", err, "")
	if res.Worker.State == domain.WorkerGone {
		rt.Fatalf("hello answered gone worker %s", res.Worker.ID)
	}
	f.machines[name] = &mMachine{boot: boot, worker: res.Worker.ID}
	if _, known := f.workers[res.Worker.ID]; !known {
		f.workers[res.Worker.ID] = &mWorker{id: res.Worker.ID, machine: name, runs: map[string]int{}}
		f.wOrder = append(f.wOrder, res.Worker.ID)
	}
	// A newer boot of the machine retires every older worker of it; the
	// resync checks that the store agrees.
}

func (f *faultModel) heartbeat(rt *rapid.T) {
	if len(f.wOrder) == 0 {
		rt.Skip("no workers")
	}
	id := rapid.SampledFrom(f.wOrder).Draw(rt, "worker")
	w := f.workers[id]
	rt.Logf("heartbeat %s", id)
	_, err := retry(rt, "heartbeat", func() (domain.Worker, error) {
		return f.svc.Heartbeat(f.ctx, wire.PollRequest{WorkerID: id, Queue: propQueue, Phase: wire.PhaseReady, Invocations: f.believed(w)}.Poll(), nil)
	})
	if w.gone {
		propWant(rt, "heartbeat of gone "+id, err, wire.CodeWorkerGone)
		return
	}
	if err != nil && wire.CodeOf(err) != wire.CodeWorkerGone { // a retried hello may have retired it meanwhile
		rt.Fatalf("heartbeat %s: %v", id, err)
	}
}

// believed is what worker w's daemon would list in its poll.
func (f *faultModel) believed(w *mWorker) []string {
	return slices.Sorted(func(yield func(string) bool) {
		for id := range w.runs {
			if !yield(id) {
				return
			}
		}
	})
}

// claim is one poll's claim. An answer lost to a fault leaves invocations
// running on the worker that its daemon never heard of: the next poll's
// reconcile (the API's, emulated here) hands each of them back.
func (f *faultModel) claim(rt *rapid.T) {
	live := f.liveWorkers()
	if len(live) == 0 {
		rt.Skip("no live workers")
	}
	id := rapid.SampledFrom(live).Draw(rt, "worker")
	max := rapid.IntRange(1, 3).Draw(rt, "max")
	rt.Logf("claim %s max %d", id, max)
	w, err := retry(rt, "get worker", func() (domain.Worker, error) { return f.s.GetWorker(f.ctx, id) })
	propWant(rt, "get worker", err, "")
	res, err := f.s.Claim(f.ctx, w, propQueue, max) // a poll is not retried: the next one comes
	if err != nil && !unanswered(err) {
		rt.Fatalf("claim: %v", err)
	}
	for _, c := range res.Claimed {
		if c.State != domain.StateRunning || c.WorkerID != id {
			rt.Fatalf("claim answered %s in state %s on %s", c.ID, c.State, c.WorkerID)
		}
		f.workers[id].runs[c.ID] = c.Attempt
	}
	if err == nil && len(res.Claimed) == max {
		return
	}
	// Reconcile as the next poll does: anything held that the daemon was
	// never told about goes back to the queue.
	held, err := retry(rt, "held", func() ([]domain.Invocation, error) { return f.truth.Held(f.ctx, id) })
	propWant(rt, "held", err, "")
	for _, inv := range held {
		if _, told := f.workers[id].runs[inv.ID]; told {
			continue
		}
		rt.Logf("  %s attempt %d claimed but never answered: handed back", inv.ID, inv.Attempt)
		_, err := retry(rt, "requeue", func() (domain.Invocation, error) {
			got, _, err := f.s.Requeue(f.ctx, inv.ID, id, domain.Loss{Kind: domain.EndStale, Why: "omitted from its worker's poll"})
			return got, err
		})
		propWant(rt, "requeue", err, "")
	}
}

func (f *faultModel) ack(rt *rapid.T) {
	if len(f.iOrder) == 0 || len(f.wOrder) == 0 {
		rt.Skip("nothing to ack")
	}
	inv := f.invs[rapid.SampledFrom(f.iOrder).Draw(rt, "invocation")]
	if len(inv.attempts) == 0 {
		rt.Skip("never claimed")
	}
	a := rapid.SampledFrom(inv.attempts).Draw(rt, "attempt")
	state := rapid.SampledFrom([]domain.InvocationState{domain.StateSucceeded, domain.StateFailed, domain.StateCancelled}).Draw(rt, "state")
	f.ackAs(rt, inv, a.worker, a.n, state)
}

// ackAs sends worker's ack of attempt n until it is answered, and checks the
// answer against what the store then holds.
func (f *faultModel) ackAs(rt *rapid.T, inv *mInv, workerID string, n int, state domain.InvocationState) {
	rt.Helper()
	w := f.workers[workerID]
	rt.Logf("ack %s attempt %d by %s as %s [model: %s attempt %d]", inv.id, n, workerID, state, inv.state, inv.attempt)
	exit := 0
	resp, err := retry(rt, "ack", func() (store.AckResult, error) {
		return f.svc.Ack(f.ctx, wire.AckRequest{WorkerID: workerID, InvocationID: inv.id, Attempt: n, State: string(state), ExitCode: &exit}.Outcome(), authorizeHash(w.hash))
	})
	delete(w.runs, inv.id)
	if wire.CodeOf(err) == wire.CodeUnauthorized {
		return // a newer hello of the same boot replaced the token; the daemon's ack is refused
	}
	propWant(rt, "ack", err, "")
	got, err := retry(rt, "read", func() (domain.Invocation, error) { return f.truth.GetInvocation(f.ctx, inv.id) })
	propWant(rt, "read", err, "")
	switch {
	case resp.Recorded && (got.State != state || resp.State != state):
		rt.Fatalf("ack of %s answered recorded %s, but the store has %s", inv.id, resp.State, got.State)
	case !resp.Recorded && resp.State.Terminal() && got.State != resp.State:
		rt.Fatalf("ack of %s answered not recorded, state %s, but the store has %s", inv.id, resp.State, got.State)
	case state == domain.StateCancelled && got.State == domain.StateCancelled && !inv.cancelRequested && !got.CancelRequested:
		rt.Fatalf("ack cancelled %s although nobody cancelled it", inv.id)
	}
}

func (f *faultModel) bye(rt *rapid.T) {
	if len(f.wOrder) == 0 {
		rt.Skip("no workers")
	}
	id := rapid.SampledFrom(f.wOrder).Draw(rt, "worker")
	rt.Logf("bye %s", id)
	// One attempt, as the daemon sends it: a bye lost to a fault is what the
	// sweep is for.
	if _, err := f.svc.Bye(f.ctx, wire.ByeRequest{WorkerID: id, Reason: "property test"}.Bye(), nil); err != nil && !unanswered(err) {
		rt.Fatalf("bye: %v", err)
	}
}

func (f *faultModel) markGone(rt *rapid.T) {
	live := f.liveWorkers()
	if len(live) == 0 {
		rt.Skip("no live workers")
	}
	id := rapid.SampledFrom(live).Draw(rt, "worker")
	rt.Logf("markGone %s", id)
	_, err := retry(rt, "mark gone", func() (domain.Worker, error) {
		w, _, err := f.s.MarkGone(f.ctx, id, nil, domain.EndGone, "host terminated")
		return w, err
	})
	propWant(rt, "mark gone", err, "")
}

func (f *faultModel) sweep(rt *rapid.T) {
	rt.Logf("sweep at +%s", f.clock.Now().Sub(t0))
	// The reaper runs again on its next tick; here, until one run got
	// through without an error.
	_, err := retry(rt, "sweep", func() (control.SweepResult, error) { return f.svc.Sweep(f.ctx) })
	propWant(rt, "sweep", err, "")
	for _, id := range f.wOrder {
		w := f.workers[id]
		if !w.gone && f.clock.Now().Sub(w.lastSeen) <= propStaleAfter {
			continue
		}
		held, err := retry(rt, "held", func() ([]domain.Invocation, error) { return f.truth.Held(f.ctx, id) })
		propWant(rt, "held", err, "")
		if len(held) != 0 && !(w.gone && w.reaped) {
			rt.Fatalf("after a sweep that got through, lost worker %s still holds %v", id, invIDsOf(held))
		}
	}
}

func (f *faultModel) advance(rt *rapid.T) { f.propModel.advance(rt) }

func (f *faultModel) submit(rt *rapid.T) {
	maxAttempts := rapid.IntRange(1, 3).Draw(rt, "maxAttempts")
	f.keys++
	req := wire.SubmitRequest{Queue: propQueue, Argv: []string{"job"}, MaxAttempts: maxAttempts, IdempotencyKey: fmt.Sprintf("k%d", f.keys)}
	inv, err := retry(rt, "submit", func() (domain.Invocation, error) {
		inv, _, err := f.svc.Submit(f.ctx, req.Spec())
		return inv, err
	})
	propWant(rt, "submit", err, "")
	rt.Logf("submit %s max_attempts %d", inv.ID, maxAttempts)
	if _, dup := f.invs[inv.ID]; dup {
		rt.Fatalf("submit with a new key answered an old invocation %s", inv.ID)
	}
	f.invs[inv.ID] = &mInv{id: inv.ID, state: domain.StateQueued, maxAttempts: maxAttempts}
	f.iOrder = append(f.iOrder, inv.ID)
	f.clock.Advance(time.Millisecond)
}

func (f *faultModel) cancel(rt *rapid.T) {
	if len(f.iOrder) == 0 {
		rt.Skip("nothing to cancel")
	}
	inv := f.invs[rapid.SampledFrom(f.iOrder).Draw(rt, "invocation")]
	rt.Logf("cancel %s [model: %s]", inv.id, inv.state)
	_, err := retry(rt, "cancel", func() (domain.Invocation, error) { return f.s.Cancel(f.ctx, inv.id) })
	if err != nil && wire.CodeOf(err) != wire.CodeConflict {
		rt.Fatalf("cancel: %v", err)
	}
	// A conflict is right for a finished invocation, and for a queued one
	// whose first try cancelled it (the retry finds it finished): either
	// way it is now finished. The resync checks the rest.
	inv.cancelRequested = inv.cancelRequested || err == nil || !inv.state.Terminal()
}

func (f *faultModel) returnFromStale(rt *rapid.T) {
	live := f.liveWorkers()
	if len(live) == 0 {
		rt.Skip("no live workers")
	}
	id := rapid.SampledFrom(live).Draw(rt, "worker")
	w := f.workers[id]
	believed := f.believed(w)
	rt.Logf("return %s believing it runs %v", id, believed)
	_, err := retry(rt, "heartbeat", func() (domain.Worker, error) {
		return f.svc.Heartbeat(f.ctx, wire.PollRequest{WorkerID: id, Queue: propQueue, Phase: wire.PhaseReady, Invocations: believed}.Poll(), nil)
	})
	if err != nil {
		return // retired meanwhile (410): its daemon says hello again
	}
	for _, invID := range believed {
		inv, n := f.invs[invID], w.runs[invID]
		if inv.state == domain.StateRunning && inv.holder == id && inv.attempt == n && !inv.cancelRequested {
			continue
		}
		f.ackAs(rt, inv, id, n, domain.StateCancelled)
	}
}

// resync takes the store's state into the model after a step, failing
// unless every invocation and worker moved along an allowed transition.
func (f *faultModel) resync(rt *rapid.T) {
	rt.Helper()
	for _, id := range f.iOrder {
		want := f.invs[id]
		got, err := retry(rt, "read", func() (domain.Invocation, error) { return f.truth.GetInvocation(f.ctx, id) })
		propWant(rt, "read "+id, err, "")
		if msg := invTransition(want, got); msg != "" {
			rt.Fatalf("invocation %s: %s (model: %s attempt %d cancel_requested %v; store: %s attempt %d cancel_requested %v)",
				id, msg, want.state, want.attempt, want.cancelRequested, got.State, got.Attempt, got.CancelRequested)
		}
		want.state, want.attempt, want.cancelRequested = got.State, got.Attempt, got.CancelRequested
		want.attempts = want.attempts[:0]
		for _, a := range got.Attempts {
			want.attempts = append(want.attempts, mAttempt{n: a.Attempt, worker: a.WorkerID})
		}
		want.holder = ""
		if got.State == domain.StateRunning {
			want.holder = got.WorkerID
		}
	}
	for _, id := range f.wOrder {
		w := f.workers[id]
		got, err := retry(rt, "read", func() (domain.Worker, error) { return f.truth.GetWorker(f.ctx, id) })
		propWant(rt, "read worker "+id, err, "")
		gone := got.State == domain.WorkerGone
		if w.gone && !gone {
			rt.Fatalf("worker %s was gone and came back as %s", id, got.State)
		}
		w.gone, w.goneAt, w.reaped, w.lastSeen, w.hash = gone, got.GoneAt, got.Reaped, got.LastSeenAt, got.TokenHash
	}
	// A newer boot retires the older workers of its machine.
	for name, mach := range f.machines {
		for _, id := range f.wOrder {
			if w := f.workers[id]; w.machine == name && id != mach.worker && !w.gone {
				rt.Fatalf("machine %s is on worker %s, but its older worker %s is not gone", name, mach.worker, id)
			}
		}
	}
}

// invTransition reports what is wrong with an invocation moving from want
// (the model, before the step) to got (the store, after it); "" if nothing.
// One step moves it by at most one claim.
func invTransition(want *mInv, got domain.Invocation) string {
	switch {
	case want.state.Terminal() && got.State != want.state:
		return "a terminal state changed"
	case got.Attempt < want.attempt:
		return "the attempt went back"
	case got.Attempt > want.attempt+1:
		return "more than one attempt in one step"
	case len(got.Attempts) < len(want.attempts):
		return "attempts were lost"
	case want.cancelRequested && !got.CancelRequested:
		return "an operator's cancel was forgotten"
	case got.State == domain.StateCancelled && !got.CancelRequested:
		return "cancelled, but nobody cancelled it"
	case got.State == domain.StateRunning && got.Attempt != want.attempt+1 && want.state != domain.StateRunning:
		return "running without a claim"
	}
	for i, a := range want.attempts {
		if got.Attempts[i].Attempt != a.n || got.Attempts[i].WorkerID != a.worker {
			return fmt.Sprintf("attempt %d was rewritten", a.n)
		}
	}
	return ""
}

// drainQueue claims (without faults) until the queue is empty: every queued
// invocation must be reachable by a claim. No fault is injected here, but
// the claims still cross a loopback connection, which once (in CI, under
// -race, on a loaded machine) ended a Query's answer early: the store said
// it did not answer. The drain retries that as every caller does.
func (f *faultModel) drainQueue(rt *rapid.T) {
	req := wire.HelloRequest{MachineID: "drainer", BootID: "boot-1", Lanes: []string{propQueue}}
	res, err := retry(rt, "hello drainer", func() (control.Registered, error) {
		return storetest.Control(f.truth).Register(f.ctx, req.Registration(), f.issue)
	})
	propWant(rt, "hello drainer", err, "")
	for range len(f.iOrder) + 1 {
		got, err := retry(rt, "drain claim", func() (store.ClaimResult, error) {
			return f.truth.Claim(f.ctx, res.Worker, propQueue, 3)
		})
		propWant(rt, "drain claim", err, "")
		if len(got.Claimed) == 0 {
			break
		}
	}
	st, err := retry(rt, "queue stats", func() (domain.QueueStats, error) {
		return f.truth.QueueStats(f.ctx, propQueue)
	})
	propWant(rt, "queue stats", err, "")
	if n := st.Counts[domain.StateQueued]; n != 0 {
		rt.Fatalf("%d queued invocations no claim reaches", n)
	}
}
