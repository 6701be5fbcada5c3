package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The store's writes with one fault aimed at one request, and the exact
// outcome checked: each case is a place where a DynamoDB that applied a
// write but lost its answer (or a Lambda that died between two writes)
// could make the store count twice, count nothing, or leave work stranded.
// TestStorePropertyUnderFaults meets the same faults at random; these pin
// the known places so a refactor cannot lose them quietly.

// lostAnswers are the faults after which a write has landed (or lands) but
// its caller saw an error.
var lostAnswers = []storetest.Fault{storetest.FailAfter, storetest.DropAfter, storetest.Delay}

// faultTimeout is the store client's per-attempt timeout in these tests: a
// Delay fault holds its request three times as long.
const faultTimeout = 500 * time.Millisecond

// faultFixture is a conformance fixture whose store goes through faults.
type faultFixture struct {
	*fixture
	faulty storetest.Faulty
	fault  storetest.Fault // the case's fault, for table-driven cases
}

func newFaultFixture(t *testing.T) *faultFixture {
	t.Helper()
	fs := storetest.FaultyStore(t, storetest.Never(), faultTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	f := &fixture{t: t, ctx: ctx, backend: backends[0], tables: fs.Store.Tables(), s: fs.Store,
		svc: storetest.Control(fs.Store), clock: fs.Clock, hashes: map[string]string{}}
	return &faultFixture{fixture: f, faulty: fs}
}

// aim injects faults into the next requests of op; hit, called after the
// action, fails the test unless exactly those faults were injected, and
// turns faults off and waits for delayed writes so what is read next is
// the truth.
func (f *faultFixture) aim(op string, faults ...storetest.Fault) (hit func()) {
	before := len(f.faulty.Transport.Injected())
	f.faulty.Transport.Next(op, faults...)
	return func() {
		f.t.Helper()
		f.faulty.Transport.SetSchedule(storetest.Never())
		f.faulty.Transport.Settle()
		got := f.faulty.Transport.Injected()[before:]
		if len(got) != len(faults) {
			f.t.Fatalf("injected %v, want %d faults into %s: the case did not reach the request it aims at", got, len(faults), op)
		}
	}
}

// untilAnswered calls fn until it returns something other than "the store
// did not answer", as the callers do (a daemon resends, an operator's CLI
// retries a 5xx), at most five times.
func untilAnswered[T any](t *testing.T, what string, fn func() (T, error)) (T, error) {
	t.Helper()
	var v T
	var err error
	for range 5 {
		if v, err = fn(); err == nil || !unanswered(err) {
			return v, err
		}
	}
	t.Fatalf("%s: no answer after 5 tries: %v", what, err)
	return v, err
}

func TestFaultHelloNewBootAnswerLost(t *testing.T) {
	for _, fault := range lostAnswers {
		t.Run(fault.String(), func(t *testing.T) {
			f := newFaultFixture(t)
			old := f.worker("m1", "")
			inv := f.submit(submitReq())
			f.claimOne(old, inv)

			hit := f.aim("TransactWriteItems", fault)
			res, err := untilAnswered(t, "hello", func() (control.Registered, error) {
				return f.svc.Register(f.ctx, helloReq("m1", "boot-2").Registration(), f.issue)
			})
			hit()
			if err != nil {
				t.Fatalf("Hello: %v", err)
			}
			f.wantRetired(old.ID, res.Worker.ID, inv.ID)
		})
	}
}

// TestFaultHelloNewBootLambdaDied: the hello's Lambda records the new boot
// and dies before it retires the old worker (every later request fails).
// The daemon says hello again; that hello must finish the retirement.
func TestFaultHelloNewBootLambdaDied(t *testing.T) {
	f := newFaultFixture(t)
	old := f.worker("m1", "")
	inv := f.submit(submitReq())
	f.claimOne(old, inv)

	recorded := false
	f.faulty.Transport.SetSchedule(func(c storetest.Call) storetest.Fault {
		if recorded {
			return storetest.FailBefore
		}
		recorded = c.Op == "TransactWriteItems"
		return storetest.NoFault
	})
	if _, err := f.svc.Register(f.ctx, helloReq("m1", "boot-2").Registration(), f.issue); err == nil {
		t.Fatal("Hello succeeded although every request after its transaction failed")
	}
	f.faulty.Transport.SetSchedule(storetest.Never())
	if g := f.getWorker(old.ID); g.State == domain.WorkerGone {
		t.Fatal("the old worker is gone already: the case does not die between the writes")
	}
	res := f.hello(helloReq("m1", "boot-2"))
	f.wantRetired(old.ID, res.Worker.ID, inv.ID)
	if res.Retired != old.ID || res.Requeued != 1 {
		t.Fatalf("the hello that finished the retirement reports retired %q requeued %d, want %s and 1", res.Retired, res.Requeued, old.ID)
	}
	// Once the retirement is finished, a further hello of the same boot
	// retires nothing and says so (the log line an operator reads).
	again := f.hello(helloReq("m1", "boot-2"))
	if again.Worker.ID != res.Worker.ID || again.Retired != "" || again.Requeued != 0 {
		t.Fatalf("a later hello of the same boot: worker %s retired %q requeued %d; want worker %s, nothing retired",
			again.Worker.ID, again.Retired, again.Requeued, res.Worker.ID)
	}
}

// wantRetired checks that a hello from a new boot retired old: gone, its
// invocation inv queued again, and exactly one new worker (cur) made.
func (f *faultFixture) wantRetired(old, cur, inv string) {
	f.t.Helper()
	if cur == old {
		f.t.Fatalf("the new boot answered the old worker %s", old)
	}
	if g := f.getWorker(old); g.State != domain.WorkerGone {
		f.t.Fatalf("the old boot's worker %s is %s, want gone", old, g.State)
	}
	if g := f.get(inv); g.State != domain.StateQueued || g.WorkerID != "" || g.Attempt != 1 {
		f.t.Fatalf("the old worker's invocation is %s on %q attempt %d, want queued again after attempt 1", g.State, g.WorkerID, g.Attempt)
	}
	if id, ok, err := f.s.MachineWorker(f.ctx, "m1"); err != nil || !ok || id != cur {
		f.t.Fatalf("MachineWorker(m1) = %s, %v, %v; want %s", id, ok, err, cur)
	}
	ws, _, err := f.s.ListWorkers(f.ctx, 100, "")
	if err != nil || len(ws) != 2 {
		f.t.Fatalf("ListWorkers = %d workers, %v; want the old and one new", len(ws), err)
	}
}

// TestFaultTerminalAnswerLost: every way an invocation becomes terminal,
// with the answer of its one transaction lost. It must be counted once —
// not twice by the retry, not zero times because the retry found the work
// done.
func TestFaultTerminalAnswerLost(t *testing.T) {
	cases := []struct {
		name  string
		state domain.InvocationState
		run   func(f *faultFixture) error
	}{
		{"ack", domain.StateSucceeded, func(f *faultFixture) error {
			w := f.worker("m1", "")
			inv := f.claimOne(w, f.submit(submitReq()))
			hit := f.aim("TransactWriteItems", f.fault)
			resp, err := untilAnswered(f.t, "ack", func() (store.AckResult, error) {
				return f.ack(w, inv, 1, domain.StateSucceeded)
			})
			hit()
			if err == nil && resp.State != domain.StateSucceeded {
				return fmt.Errorf("ack answered %+v", resp)
			}
			// The daemon's spool may resend it once more after a restart.
			if _, err := f.ack(w, inv, 1, domain.StateSucceeded); err != nil {
				return fmt.Errorf("late duplicate ack: %w", err)
			}
			return err
		}},
		{"cancel queued", domain.StateCancelled, func(f *faultFixture) error {
			inv := f.submit(submitReq())
			hit := f.aim("TransactWriteItems", f.fault)
			_, err := untilAnswered(f.t, "cancel", func() (domain.Invocation, error) { return f.s.Cancel(f.ctx, inv.ID) })
			hit()
			if wire.CodeOf(err) == wire.CodeConflict {
				return nil // the retry found the first try's cancel: "already cancelled"
			}
			return err
		}},
		{"requeue with attempts spent", domain.StateFailed, func(f *faultFixture) error {
			w := f.worker("m1", "")
			req := submitReq()
			req.MaxAttempts = 1
			inv := f.claimOne(w, f.submit(req))
			hit := f.aim("TransactWriteItems", f.fault)
			_, err := untilAnswered(f.t, "requeue", func() (domain.Invocation, error) {
				got, _, err := f.s.Requeue(f.ctx, inv.ID, w.ID, domain.Loss{Kind: domain.EndStale, Why: "worker lost"})
				return got, err
			})
			hit()
			return err
		}},
		{"requeue with a cancel pending", domain.StateCancelled, func(f *faultFixture) error {
			w := f.worker("m1", "")
			inv := f.claimOne(w, f.submit(submitReq()))
			if _, err := f.s.Cancel(f.ctx, inv.ID); err != nil {
				return err
			}
			hit := f.aim("TransactWriteItems", f.fault)
			_, err := untilAnswered(f.t, "requeue", func() (domain.Invocation, error) {
				got, _, err := f.s.Requeue(f.ctx, inv.ID, w.ID, domain.Loss{Kind: domain.EndStale, Why: "worker lost"})
				return got, err
			})
			hit()
			return err
		}},
	}
	for _, c := range cases {
		for _, fault := range lostAnswers {
			t.Run(c.name+"/"+fault.String(), func(t *testing.T) {
				f := newFaultFixture(t)
				f.fault = fault
				if err := c.run(f); err != nil {
					t.Fatal(err)
				}
				f.wantStats("q", map[domain.InvocationState]int{c.state: 1}, 1)
			})
		}
	}
}

// TestFaultSubmitAnswerLost: a submit with an idempotency key whose answer
// was lost, resent, makes one invocation and answers it.
func TestFaultSubmitAnswerLost(t *testing.T) {
	for _, fault := range lostAnswers {
		t.Run(fault.String(), func(t *testing.T) {
			f := newFaultFixture(t)
			req := submitReq()
			req.IdempotencyKey = "k1"
			hit := f.aim("TransactWriteItems", fault)
			inv, err := untilAnswered(t, "submit", func() (domain.Invocation, error) {
				inv, _, err := f.svc.Submit(f.ctx, req.Spec())
				return inv, err
			})
			hit()
			if err != nil {
				t.Fatalf("Submit: %v", err)
			}
			got, _ := f.listAll("q", "", 100)
			if len(got) != 1 || got[0] != inv.ID {
				t.Fatalf("invocations %v, want only the answered %s", got, inv.ID)
			}
		})
	}
}

// TestFaultNewItemAnswerLost: a submit without an idempotency key, or a
// run's, whose put was applied and its answer lost, is retried by the SDK;
// the retry finds the item (its id is new, so it is this put's own) and
// the call answers what it made, once: one invocation, one run.
func TestFaultNewItemAnswerLost(t *testing.T) {
	for _, fault := range []storetest.Fault{storetest.FailAfter, storetest.DropAfter} {
		t.Run("submit/"+fault.String(), func(t *testing.T) {
			f := newFaultFixture(t)
			hit := f.aim("PutItem", fault)
			inv, _, err := f.svc.Submit(f.ctx, submitReq().Spec())
			hit()
			if err != nil {
				t.Fatalf("Submit: %v", err)
			}
			if got, _ := f.listAll("q", "", 100); len(got) != 1 || got[0] != inv.ID {
				t.Fatalf("invocations %v, want only the answered %s", got, inv.ID)
			}
		})
		t.Run("run/"+fault.String(), func(t *testing.T) {
			f := newFaultFixture(t)
			hit := f.aim("PutItem", fault)
			run, _, err := f.svc.SubmitRun(f.ctx, runSpec("", 2))
			hit()
			if err != nil {
				t.Fatalf("SubmitRun: %v", err)
			}
			if got := f.getRun(run.ID); got.State() != domain.RunRunning || got.Total != 2 {
				t.Fatalf("run %+v, want running with 2 jobs", got)
			}
		})
	}
}

// TestFaultClaimAnswerLost: a claim whose answer was lost leaves the
// invocation running on a worker whose daemon never heard of it. It must
// be held by that worker (so the next poll's reconcile finds it), and once
// handed back, claimable again.
func TestFaultClaimAnswerLost(t *testing.T) {
	for _, fault := range lostAnswers {
		t.Run(fault.String(), func(t *testing.T) {
			f := newFaultFixture(t)
			w := f.worker("m1", "")
			inv := f.submit(submitReq())
			hit := f.aim("PutItem", fault)
			res, err := f.s.Claim(f.ctx, w, "q", 1)
			hit()
			if err != nil && !unanswered(err) {
				t.Fatalf("Claim: %v", err)
			}
			if held := f.held(w.ID); len(held) != 1 || held[0] != inv.ID {
				t.Fatalf("held by %s: %v, want [%s]", w.ID, held, inv.ID)
			}
			if len(res.Claimed) == 1 && res.Claimed[0].Attempt == 1 && fault == storetest.Delay {
				return // the SDK's retry landed first and was answered; the held request then lost its condition
			}
			if len(res.Claimed) != 0 {
				t.Fatalf("Claim answered %v although its answer was lost", invIDs(res.Claimed))
			}
			if _, _, err := f.s.Requeue(f.ctx, inv.ID, w.ID, domain.Loss{Kind: domain.EndStale, Why: "omitted from its worker's poll"}); err != nil {
				t.Fatalf("Requeue: %v", err)
			}
			if got := f.claimOne(w, inv); got.Attempt != 2 {
				t.Fatalf("claimed again as attempt %d, want 2", got.Attempt)
			}
			f.wantStats("q", map[domain.InvocationState]int{domain.StateRunning: 1}, 0)
		})
	}
}
