package store_test

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
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

// TestStoreProperty drives the store through random sequences of daemon,
// operator and reaper calls (hello, heartbeat, claim, ack, bye, mark gone,
// sweep, submit, cancel, clock advance) against a small model of the
// lifecycle in docs/design.md §4-5, and checks after every step, by reading the
// store, that:
//
//   - every answer (ids, recorded, requeue counts, sweep counts) and every
//     error code is exactly what the model predicts: 403 for an ack of an
//     attempt the worker did not run, 401 for a revoked token, 410 for a
//     poll of a gone worker, 409 for a cancel of a finished invocation;
//   - no invocation is lost: each submitted id is readable and is queued,
//     running or terminal, in the state the model says;
//   - attempt numbers never decrease and attempts are numbered 1..n;
//   - a terminal state never changes (first terminal outcome wins, and an
//     ack answers recorded:true only if the invocation was not terminal);
//   - at most one live attempt: a running invocation is held (holder index)
//     by exactly one worker, the one that claimed its current attempt;
//   - the queue's done_count equals succeeded + failed + cancelled, and
//     every per-state count equals the model's;
//   - after a sweep, nothing runs on a worker the model knows is stale or
//     gone (within the sweep's gone window);
//   - no invocation is cancelled unless an operator cancelled it: a worker
//     that comes back from stale ("return": it polls with what it still
//     runs, is told its superseded attempts are over, and acks them
//     cancelled) changes nothing, and a cancelled ack counts only from the
//     attempt running now after an operator's cancel.
//
// One embedded store serves the whole test; each rapid check gets tables of
// its own. Checks default to 25 (not rapid's 100) to keep the test fast
// under -race; -rapid.checks and -rapid.steps override.
func TestStoreProperty(t *testing.T) {
	setDefaultFlag("rapid.checks", "25")
	setDefaultFlag("rapid.shrinktime", "20s")
	db := storetest.Embedded(t)
	base := storetest.Prefix(t)
	var run atomic.Int64
	rapid.Check(t, func(rt *rapid.T) {
		prefix := fmt.Sprintf("%sp%d-", base, run.Add(1))
		newPropModel(rt, db, prefix).run(rt)
	})
}

// setDefaultFlag sets flag name unless the command line set it.
func setDefaultFlag(name, value string) {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	if !set {
		_ = flag.Set(name, value)
	}
}

const (
	propQueue      = "q"
	propStaleAfter = 60 * time.Second
	propGoneWindow = 10 * time.Minute // store.sweepGoneFor
)

var propMachines = []string{"m0", "m1", "m2"}

// mWorker is the model of one worker row.
type mWorker struct {
	id       string
	machine  string
	gone     bool
	goneAt   time.Time
	reaped   bool
	lastSeen time.Time
	hash     string // token hash of its latest hello
	// runs is what the daemon believes it runs: invocation id → attempt,
	// from its claims until it acks them. A worker that was stale keeps
	// believing it after its work was handed out again.
	runs map[string]int
}

// mMachine is the model of a machine's current boot.
type mMachine struct {
	boot   int
	worker string
}

// mAttempt is one attempt of an invocation.
type mAttempt struct {
	n      int
	worker string
}

// mInv is the model of one invocation.
type mInv struct {
	id              string
	state           domain.InvocationState
	attempt         int
	maxAttempts     int
	holder          string // worker of the current attempt while running
	attempts        []mAttempt
	cancelRequested bool
}

type propModel struct {
	ctx   context.Context
	s     *store.Store
	svc   *control.Service // the use cases over s
	clock *clock.Fake
	// read, if set, is what check reads the store through (a client without
	// faults, in TestStorePropertyUnderFaults); nil: s.
	read *store.Store

	issued   int
	machines map[string]*mMachine
	workers  map[string]*mWorker
	wOrder   []string // worker ids in creation order
	invs     map[string]*mInv
	iOrder   []string // invocation ids in submit order
	runs     []mRun   // runs, their jobs among invs

	// what the last check read, for the monotonic properties
	seenAttempt  map[string]int
	seenTerminal map[string]domain.InvocationState
}

func newPropModel(rt *rapid.T, db *dynamodb.Client, prefix string) *propModel {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	rt.Cleanup(cancel)
	if err := schema.EnsureTables(ctx, db, prefix); err != nil {
		rt.Fatalf("EnsureTables: %v", err)
	}
	c := clock.NewFake(t0)
	s := store.New(db, prefix)
	s.Clock = c.Clock()
	s.IDs = &ids.Generator{Clock: c.Clock()}
	s.Shuffle = func(int, func(i, j int)) {} // deterministic claims, so rapid can shrink
	// Walks with and without the remembered rows of `lakeshore dev`.
	s.RememberWrites = rapid.Bool().Draw(rt, "rememberWrites")
	return &propModel{
		ctx: ctx, s: s, svc: storetest.Control(s), clock: c,
		machines:     map[string]*mMachine{},
		workers:      map[string]*mWorker{},
		invs:         map[string]*mInv{},
		seenAttempt:  map[string]int{},
		seenTerminal: map[string]domain.InvocationState{},
	}
}

func (m *propModel) issue(workerID string) (string, error) {
	m.issued++
	return fmt.Sprintf("hash-%d-%s", m.issued, workerID), nil
}

func (m *propModel) run(rt *rapid.T) {
	rt.Repeat(map[string]func(*rapid.T){
		"hello":     m.hello,
		"heartbeat": m.heartbeat,
		"claim":     m.claim,
		"ack":       m.ack,
		"bye":       m.bye,
		"markGone":  m.markGoneAction,
		"sweep":     m.sweep,
		"advance":   m.advance,
		"submit":    m.submit,
		"submitRun": m.submitRun,
		"cancel":    m.cancel,
		"return":    m.returnFromStale,
		"":          m.check,
	})
}

// ---- helpers ----

// wantCode fails unless err carries code want ("" means no error).
func propWant(rt *rapid.T, op string, err error, want wire.Code) {
	rt.Helper()
	switch {
	case want == "" && err != nil:
		rt.Fatalf("%s: unexpected error %v", op, err)
	case want != "" && err == nil:
		rt.Fatalf("%s: succeeded, want error %s", op, want)
	case want != "" && wire.CodeOf(err) != want:
		rt.Fatalf("%s: error %v (code %s), want code %s", op, err, wire.CodeOf(err), want)
	}
}

func (m *propModel) liveWorkers() []string {
	var out []string
	for _, id := range m.wOrder {
		if !m.workers[id].gone {
			out = append(out, id)
		}
	}
	return out
}

func (m *propModel) heldBy(workerID string) []*mInv {
	var out []*mInv
	for _, id := range m.iOrder {
		if inv := m.invs[id]; inv.state == domain.StateRunning && inv.holder == workerID {
			out = append(out, inv)
		}
	}
	return out
}

// requeue applies store.Requeue's rule to inv, held by its holder.
func (m *propModel) requeue(inv *mInv) {
	switch {
	case inv.cancelRequested:
		inv.state = domain.StateCancelled
	case inv.attempt >= inv.maxAttempts:
		inv.state = domain.StateFailed
	default:
		inv.state = domain.StateQueued
	}
	inv.holder = ""
}

func (m *propModel) requeueHeld(workerID string) int {
	held := m.heldBy(workerID)
	for _, inv := range held {
		m.requeue(inv)
	}
	return len(held)
}

func (m *propModel) retire(w *mWorker) {
	if w.gone {
		return
	}
	now := m.clock.Now()
	w.gone, w.goneAt, w.lastSeen = true, now, now
}

// ---- actions ----

func (m *propModel) hello(rt *rapid.T) {
	name := rapid.SampledFrom(propMachines).Draw(rt, "machine")
	newBoot := rapid.Bool().Draw(rt, "newBoot")
	mach, found := m.machines[name]
	boot := 1
	if found {
		boot = mach.boot
		if newBoot {
			boot++
		}
	}
	req := wire.HelloRequest{MachineID: name, BootID: fmt.Sprintf("boot-%d", boot), Label: name, Lanes: []string{propQueue}}
	rt.Logf("hello %s %s", name, req.BootID)
	res, err := m.svc.Register(m.ctx, req.Registration(), m.issue)
	propWant(rt, "hello", err, "")

	now := m.clock.Now()
	if found && mach.boot == boot && !m.workers[mach.worker].gone {
		w := m.workers[mach.worker]
		if res.Worker.ID != w.id || res.Retired != "" || res.Requeued != 0 {
			rt.Fatalf("retried hello of %s: worker %s retired %q requeued %d, want worker %s, nothing retired",
				name, res.Worker.ID, res.Retired, res.Requeued, w.id)
		}
		w.hash, w.lastSeen = res.Worker.TokenHash, now
		return
	}
	if _, dup := m.workers[res.Worker.ID]; dup {
		rt.Fatalf("hello of %s %s: reused worker id %s, want a new worker", name, req.BootID, res.Worker.ID)
	}
	wantRetired, wantRequeued := "", 0
	if found {
		wantRetired = mach.worker
		m.retire(m.workers[mach.worker])
		wantRequeued = m.requeueHeld(mach.worker)
	}
	if res.Retired != wantRetired || res.Requeued != wantRequeued {
		rt.Fatalf("hello of %s %s: retired %q requeued %d, want retired %q requeued %d",
			name, req.BootID, res.Retired, res.Requeued, wantRetired, wantRequeued)
	}
	m.machines[name] = &mMachine{boot: boot, worker: res.Worker.ID}
	m.workers[res.Worker.ID] = &mWorker{id: res.Worker.ID, machine: name, lastSeen: now, hash: res.Worker.TokenHash, runs: map[string]int{}}
	m.wOrder = append(m.wOrder, res.Worker.ID)
}

func (m *propModel) heartbeat(rt *rapid.T) {
	if len(m.wOrder) == 0 {
		rt.Skip("no workers")
	}
	id := rapid.SampledFrom(m.wOrder).Draw(rt, "worker")
	phase := rapid.SampledFrom([]string{"", wire.PhaseReady}).Draw(rt, "phase")
	w := m.workers[id]
	rt.Logf("heartbeat %s (%s) phase %q", id, w.machine, phase)
	var held []string
	for _, inv := range m.heldBy(id) {
		held = append(held, inv.id)
	}
	_, err := m.svc.Heartbeat(m.ctx, wire.PollRequest{WorkerID: id, Queue: propQueue, Phase: phase, Invocations: held}.Poll(), nil)
	if w.gone {
		propWant(rt, "heartbeat of gone "+id, err, wire.CodeWorkerGone)
		return
	}
	propWant(rt, "heartbeat "+id, err, "")
	w.lastSeen = m.clock.Now()
}

func (m *propModel) claim(rt *rapid.T) {
	live := m.liveWorkers()
	if len(live) == 0 {
		rt.Skip("no live workers")
	}
	id := rapid.SampledFrom(live).Draw(rt, "worker")
	max := rapid.IntRange(1, 3).Draw(rt, "max")
	rt.Logf("claim %s max %d", id, max)
	w, err := m.s.GetWorker(m.ctx, id)
	propWant(rt, "get worker "+id, err, "")
	res, err := m.s.Claim(m.ctx, w, propQueue, max)
	propWant(rt, "claim", err, "")
	queued := 0
	for _, inv := range m.invs {
		if inv.state == domain.StateQueued {
			queued++
		}
	}
	if got, want := len(res.Claimed), min(max, queued); got != want {
		rt.Fatalf("claim max %d with %d queued got %d invocations, want %d", max, queued, got, want)
	}
	for _, c := range res.Claimed {
		inv, ok := m.invs[c.ID]
		if !ok || inv.state != domain.StateQueued {
			rt.Fatalf("claim handed out %s, which the model has in state %v", c.ID, inv)
		}
		if c.Attempt != inv.attempt+1 || c.WorkerID != id || c.State != domain.StateRunning {
			rt.Fatalf("claim of %s: attempt %d worker %s state %s, want attempt %d worker %s running",
				c.ID, c.Attempt, c.WorkerID, c.State, inv.attempt+1, id)
		}
		inv.attempt++
		inv.state = domain.StateRunning
		inv.holder = id
		inv.attempts = append(inv.attempts, mAttempt{n: inv.attempt, worker: id})
		m.workers[id].runs[inv.id] = inv.attempt
		rt.Logf("  claimed %s attempt %d", c.ID, inv.attempt)
	}
}

func (m *propModel) ack(rt *rapid.T) {
	if len(m.iOrder) == 0 || len(m.wOrder) == 0 {
		rt.Skip("nothing to ack")
	}
	inv := m.invs[rapid.SampledFrom(m.iOrder).Draw(rt, "invocation")]
	mode := rapid.SampledFrom([]string{"holder", "earlier", "wrong"}).Draw(rt, "mode")
	var workerID string
	var attempt int
	switch {
	case mode == "holder" && len(inv.attempts) > 0:
		last := inv.attempts[len(inv.attempts)-1]
		workerID, attempt = last.worker, last.n
	case mode == "earlier" && len(inv.attempts) > 0:
		a := rapid.SampledFrom(inv.attempts).Draw(rt, "attempt")
		workerID, attempt = a.worker, a.n
	default:
		workerID = rapid.SampledFrom(m.wOrder).Draw(rt, "worker")
		attempt = rapid.IntRange(1, len(inv.attempts)+1).Draw(rt, "attempt")
	}
	state := rapid.SampledFrom([]domain.InvocationState{domain.StateSucceeded, domain.StateFailed, domain.StateCancelled}).Draw(rt, "state")
	w := m.workers[workerID]
	hash := w.hash
	revoked := rapid.IntRange(0, 9).Draw(rt, "token") == 0
	if revoked {
		hash = "revoked-" + hash
	}
	rt.Logf("ack %s attempt %d by %s (%s) as %s revokedToken=%v [model: %s attempt %d holder %s]",
		inv.id, attempt, workerID, mode, state, revoked, inv.state, inv.attempt, inv.holder)
	exit := 0
	resp, err := m.svc.Ack(m.ctx, wire.AckRequest{WorkerID: workerID, InvocationID: inv.id, Attempt: attempt, State: string(state), ExitCode: &exit}.Outcome(), authorizeHash(hash))

	m.expectAck(rt, inv, workerID, attempt, state, revoked, resp, err)
}

// expectAck checks an ack's answer against the model and applies it.
func (m *propModel) expectAck(rt *rapid.T, inv *mInv, workerID string, attempt int, state domain.InvocationState, revoked bool, resp store.AckResult, err error) {
	rt.Helper()
	ran := attempt >= 1 && attempt <= len(inv.attempts) && inv.attempts[attempt-1].worker == workerID
	// A cancelled outcome confirms an operator's cancel of the attempt that
	// runs now; from any other attempt (superseded) or without a cancel it
	// is nobody's cancel, and changes nothing.
	confirmsCancel := inv.cancelRequested && inv.state == domain.StateRunning && inv.holder == workerID && inv.attempt == attempt
	if ran && m.workers[workerID].runs[inv.id] == attempt {
		delete(m.workers[workerID].runs, inv.id)
	}
	switch {
	case revoked:
		// The token is checked first, on the worker's row read with the
		// invocation: nothing about the invocation decides the answer.
		propWant(rt, "ack with a revoked token", err, wire.CodeUnauthorized)
	case !ran:
		propWant(rt, "ack by a worker that did not run the attempt", err, wire.CodeForbidden)
	case state == domain.StateCancelled && !inv.state.Terminal() && !confirmsCancel:
		propWant(rt, "cancelled ack nobody asked for", err, "")
		if resp.Recorded || resp.State != inv.state {
			rt.Fatalf("cancelled ack of %s attempt %d by %s (model: %s attempt %d holder %s cancel_requested %v): recorded %v state %s, want a no-op (recorded false, state %s)",
				inv.id, attempt, workerID, inv.state, inv.attempt, inv.holder, inv.cancelRequested, resp.Recorded, resp.State, inv.state)
		}
	case inv.state.Terminal():
		propWant(rt, "ack of a finished invocation", err, "")
		if resp.Recorded || resp.State != inv.state {
			rt.Fatalf("ack of %s (already %s): recorded %v state %s, want recorded false state %s",
				inv.id, inv.state, resp.Recorded, resp.State, inv.state)
		}
	default:
		propWant(rt, "first ack", err, "")
		if !resp.Recorded || resp.State != state {
			rt.Fatalf("first terminal ack of %s (was %s): recorded %v state %s, want recorded true state %s",
				inv.id, inv.state, resp.Recorded, resp.State, state)
		}
		inv.state, inv.holder = state, ""
	}
}

func (m *propModel) bye(rt *rapid.T) {
	if len(m.wOrder) == 0 {
		rt.Skip("no workers")
	}
	id := rapid.SampledFrom(m.wOrder).Draw(rt, "worker")
	rt.Logf("bye %s (gone=%v)", id, m.workers[id].gone)
	n, err := m.svc.Bye(m.ctx, wire.ByeRequest{WorkerID: id, Reason: "property test"}.Bye(), nil)
	propWant(rt, "bye", err, "")
	m.retire(m.workers[id])
	if want := m.requeueHeld(id); n != want {
		rt.Fatalf("bye %s requeued %d, want %d", id, n, want)
	}
}

// markGone is the hoststatus path: gone at once, the work handed back only
// by the next sweep.
func (m *propModel) markGoneAction(rt *rapid.T) {
	live := m.liveWorkers()
	if len(live) == 0 {
		rt.Skip("no live workers")
	}
	id := rapid.SampledFrom(live).Draw(rt, "worker")
	rt.Logf("markGone %s (holding %d)", id, len(m.heldBy(id)))
	_, _, err := m.s.MarkGone(m.ctx, id, nil, domain.EndGone, "host terminated")
	propWant(rt, "mark gone", err, "")
	m.retire(m.workers[id])
}

func (m *propModel) sweep(rt *rapid.T) {
	now := m.clock.Now()
	rt.Logf("sweep at +%s", now.Sub(t0))
	res, err := m.svc.Sweep(m.ctx)
	propWant(rt, "sweep", err, "")
	// The sweep reads the workers it is not done with (the reaped ones
	// cost it nothing).
	want := control.SweepResult{}
	for _, id := range m.wOrder {
		if !m.workers[id].reaped {
			want.Workers++
		}
	}
	var lost []string
	for _, id := range m.wOrder {
		w := m.workers[id]
		switch {
		case w.gone && !w.reaped, !w.gone && now.Sub(w.lastSeen) > propStaleAfter:
			lost = append(lost, id)
			want.Lost++
			n := m.requeueHeld(id)
			want.Requeued += n
			// Past the index-lag window, a gone worker found holding nothing is
			// done with: later sweeps skip it.
			if w.gone && n == 0 && now.Sub(w.goneAt) > propGoneWindow {
				w.reaped = true
			}
		}
	}
	if res != want {
		rt.Fatalf("sweep: %+v, want %+v (lost workers %v)", res, want, lost)
	}
	// Read back: nothing may still run on a worker the sweep found lost.
	for _, id := range lost {
		held, err := m.s.Held(m.ctx, id)
		propWant(rt, "held", err, "")
		if len(held) != 0 {
			rt.Fatalf("after sweep, lost worker %s still holds %v", id, invIDsOf(held))
		}
	}
}

func (m *propModel) advance(rt *rapid.T) {
	d := time.Duration(rapid.IntRange(1, 90).Draw(rt, "seconds")) * time.Second
	rt.Logf("advance %s", d)
	m.clock.Advance(d)
}

func (m *propModel) submit(rt *rapid.T) {
	maxAttempts := rapid.IntRange(1, 3).Draw(rt, "maxAttempts")
	inv, created, err := m.svc.Submit(m.ctx, wire.SubmitRequest{Queue: propQueue, Argv: []string{"job"}, MaxAttempts: maxAttempts}.Spec())
	propWant(rt, "submit", err, "")
	if !created {
		rt.Fatalf("submit: created false without an idempotency key")
	}
	if _, dup := m.invs[inv.ID]; dup {
		rt.Fatalf("submit reused invocation id %s", inv.ID)
	}
	rt.Logf("submit %s max_attempts %d", inv.ID, maxAttempts)
	m.invs[inv.ID] = &mInv{id: inv.ID, state: domain.StateQueued, maxAttempts: maxAttempts}
	m.iOrder = append(m.iOrder, inv.ID)
	m.clock.Advance(time.Millisecond) // ids sort in submit order
}

func (m *propModel) cancel(rt *rapid.T) {
	if len(m.iOrder) == 0 {
		rt.Skip("nothing to cancel")
	}
	inv := m.invs[rapid.SampledFrom(m.iOrder).Draw(rt, "invocation")]
	rt.Logf("cancel %s [model: %s]", inv.id, inv.state)
	got, err := m.s.Cancel(m.ctx, inv.id)
	switch inv.state {
	case domain.StateQueued:
		propWant(rt, "cancel queued", err, "")
		inv.state, inv.cancelRequested = domain.StateCancelled, true
	case domain.StateRunning:
		propWant(rt, "cancel running", err, "")
		inv.cancelRequested = true
	default:
		propWant(rt, "cancel of a finished invocation", err, wire.CodeConflict)
		return
	}
	if got.State != inv.state || !got.CancelRequested {
		rt.Fatalf("cancel %s: state %s cancel_requested %v, want %s true", inv.id, got.State, got.CancelRequested, inv.state)
	}
}

// returnFromStale is a worker that was silent (SIGSTOP, a partition) and
// comes back: it polls with every invocation it still believes it runs.
// Those it no longer holds were superseded; the control plane tells it to
// stop them and its bodies ack cancelled, which must change nothing. Those
// it still holds run on.
func (m *propModel) returnFromStale(rt *rapid.T) {
	live := m.liveWorkers()
	if len(live) == 0 {
		rt.Skip("no live workers")
	}
	id := rapid.SampledFrom(live).Draw(rt, "worker")
	w := m.workers[id]
	believed := slices.Sorted(maps.Keys(w.runs))
	rt.Logf("return %s (silent %s) believing it runs %v", id, m.clock.Now().Sub(w.lastSeen), believed)
	_, err := m.svc.Heartbeat(m.ctx, wire.PollRequest{WorkerID: id, Queue: propQueue, Phase: wire.PhaseReady, Invocations: believed}.Poll(), nil)
	propWant(rt, "heartbeat of a returning worker", err, "")
	w.lastSeen = m.clock.Now()
	for _, invID := range believed {
		inv, n := m.invs[invID], w.runs[invID]
		if inv.state == domain.StateRunning && inv.holder == id && inv.attempt == n && !inv.cancelRequested {
			continue // still its own: it runs on
		}
		exit := 137
		resp, err := m.svc.Ack(m.ctx, wire.AckRequest{WorkerID: id, InvocationID: invID, Attempt: n, State: wire.StateCancelled, ExitCode: &exit}.Outcome(), authorizeHash(w.hash))
		rt.Logf("  %s attempt %d acks cancelled [model: %s attempt %d holder %s]", invID, n, inv.state, inv.attempt, inv.holder)
		m.expectAck(rt, inv, id, n, domain.StateCancelled, false, resp, err)
	}
}

// ---- invariants ----

func (m *propModel) reader() *store.Store {
	if m.read != nil {
		return m.read
	}
	return m.s
}

func (m *propModel) check(rt *rapid.T) {
	counts := map[domain.InvocationState]int{}
	for _, id := range m.iOrder {
		want := m.invs[id]
		got, err := m.reader().GetInvocation(m.ctx, id)
		if err != nil {
			rt.Fatalf("invocation %s lost: %v", id, err)
		}
		if !slices.Contains(domain.InvocationStates, got.State) {
			rt.Fatalf("invocation %s in unknown state %q", id, got.State)
		}
		counts[got.State]++
		if prev := m.seenAttempt[id]; got.Attempt < prev {
			rt.Fatalf("invocation %s: attempt went from %d to %d", id, prev, got.Attempt)
		}
		m.seenAttempt[id] = got.Attempt
		if prev, ok := m.seenTerminal[id]; ok && got.State != prev {
			rt.Fatalf("invocation %s: terminal state %s changed to %s", id, prev, got.State)
		}
		if got.State.Terminal() {
			m.seenTerminal[id] = got.State
		}
		if got.State == domain.StateCancelled && !got.CancelRequested {
			rt.Fatalf("invocation %s is cancelled, but no operator cancelled it (lost work)", id)
		}
		for i, a := range got.Attempts {
			if a.Attempt != i+1 {
				rt.Fatalf("invocation %s: attempts numbered %v, want 1..n", id, attemptNs(got.Attempts))
			}
		}
		if got.State != want.state || got.Attempt != want.attempt || len(got.Attempts) != len(want.attempts) ||
			got.CancelRequested != want.cancelRequested {
			rt.Fatalf("invocation %s: store has %s attempt %d (%d attempts) cancel_requested %v; model has %s attempt %d (%d attempts) cancel_requested %v",
				id, got.State, got.Attempt, len(got.Attempts), got.CancelRequested,
				want.state, want.attempt, len(want.attempts), want.cancelRequested)
		}
		for i, a := range got.Attempts {
			if a.WorkerID != want.attempts[i].worker {
				rt.Fatalf("invocation %s attempt %d: worker %s, model %s", id, a.Attempt, a.WorkerID, want.attempts[i].worker)
			}
		}
		if got.State == domain.StateRunning {
			last := got.Attempts[len(got.Attempts)-1]
			if got.WorkerID != want.holder || last.Attempt != got.Attempt || last.WorkerID != got.WorkerID {
				rt.Fatalf("running invocation %s: worker %s, last attempt %+v; model holder %s", id, got.WorkerID, last, want.holder)
			}
		}
	}

	m.checkRuns(rt)

	// At most one live attempt: each running invocation is held by exactly
	// one worker (the holder index, filtered by the row), the model's.
	holders := map[string][]string{}
	for _, wid := range m.wOrder {
		held, err := m.reader().Held(m.ctx, wid)
		propWant(rt, "held", err, "")
		for _, inv := range held {
			holders[inv.ID] = append(holders[inv.ID], wid)
		}
	}
	for _, id := range m.iOrder {
		want := m.invs[id]
		var wantHolders []string
		if want.state == domain.StateRunning {
			wantHolders = []string{want.holder}
		}
		if !slices.Equal(holders[id], wantHolders) {
			rt.Fatalf("invocation %s (%s) held by %v, want %v", id, want.state, holders[id], wantHolders)
		}
	}

	st, err := m.reader().QueueStats(m.ctx, propQueue)
	propWant(rt, "queue stats", err, "")
	done := counts[domain.StateSucceeded] + counts[domain.StateFailed] + counts[domain.StateCancelled]
	for _, state := range domain.InvocationStates {
		if st.Counts[state] != counts[state] {
			rt.Fatalf("queue stats count %s = %d, but %d invocations read %s (stats %v)", state, st.Counts[state], counts[state], state, fmtCounts(st.Counts))
		}
	}
	if st.DoneCount != done {
		rt.Fatalf("done_count = %d, want %d terminal invocations (%v)", st.DoneCount, done, fmtCounts(counts))
	}
	counters, err := m.reader().Counters(m.ctx, propQueue)
	propWant(rt, "queue counters", err, "")
	for state, n := range counters.ByState() {
		if n != counts[state] {
			rt.Fatalf("%s_count = %d, but %d invocations read %s (%v)", state, n, counts[state], state, fmtCounts(counts))
		}
	}
	if total := counts[domain.StateQueued] + counts[domain.StateRunning] + done; total != len(m.iOrder) {
		rt.Fatalf("%d invocations read, %d submitted", total, len(m.iOrder))
	}
}

func attemptNs(as []domain.Attempt) []int {
	out := make([]int, len(as))
	for i, a := range as {
		out[i] = a.Attempt
	}
	return out
}

func invIDsOf(invs []domain.Invocation) []string {
	out := make([]string, len(invs))
	for i, inv := range invs {
		out[i] = inv.ID
	}
	return out
}

func fmtCounts(c map[domain.InvocationState]int) string {
	keys := slices.Collect(maps.Keys(c))
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%d ", k, c[k])
	}
	return strings.TrimSpace(b.String())
}
