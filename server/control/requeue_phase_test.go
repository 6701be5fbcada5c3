package control_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// requeueRig is one worker over the embedded store holding attempt 1 of
// one invocation, with the tables at hand for snapshots.
type requeueRig struct {
	svc    *control.Service
	st     *store.Store
	snap   func() storetest.Snapshot
	worker string
	run    domain.Invocation
}

func newRequeueRig(t *testing.T, ctx context.Context) requeueRig {
	t.Helper()
	db, prefix, st := embeddedTables(t)
	svc, worker := oneWorker(t, ctx, control.Config{Store: st})
	inv, _, err := svc.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"train"}, MaxAttempts: 3}.Spec())
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := svc.Poll(ctx, wire.PollRequest{WorkerID: worker, Queue: "q", Phase: wire.PhaseReady, Invocations: []string{},
		UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: ptr(1), CurrentInvocations: ptr(0)}}.Poll(), nil)
	if err != nil || len(cmds) != 1 || cmds[0].Run == nil || cmds[0].Run.ID != inv.ID {
		t.Fatalf("poll: %+v %v, want a run of %s", cmds, err, inv.ID)
	}
	// A daemon lists what it received in its next poll, as the body runs.
	if _, err := svc.Poll(ctx, wire.PollRequest{WorkerID: worker, Queue: "q", Phase: wire.PhaseReady, Invocations: []string{inv.ID},
		UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: ptr(1), CurrentInvocations: ptr(1)}}.Poll(), nil); err != nil {
		t.Fatal(err)
	}
	return requeueRig{svc: svc, st: st, worker: worker, run: *cmds[0].Run,
		snap: func() storetest.Snapshot { return storetest.TakeSnapshot(t, db, prefix) }}
}

// oneWorker builds the service of cfg (a minute's stale window, logs
// discarded) and says hello for one worker of capacity 1 on queue q.
func oneWorker(t *testing.T, ctx context.Context, cfg control.Config) (*control.Service, string) {
	t.Helper()
	cfg.StaleAfter = time.Minute
	cfg.Logger = slog.New(slog.DiscardHandler)
	svc := control.New(cfg)
	hello, err := svc.Hello(ctx, wire.HelloRequest{MachineID: "m1", BootID: "b1", Lanes: []string{"q"},
		Capabilities: wire.Capabilities{MaxConcurrency: ptr(1)}}.Registration(), func(string) (string, error) { return "hash", nil })
	if err != nil {
		t.Fatal(err)
	}
	return svc, hello.Worker.ID
}

// ack sends the rig's requeued ack, its daemon in phase ("" for none).
func (r requeueRig) ack(ctx context.Context, phase string) (store.AckResult, error) {
	req := wire.AckRequest{WorkerID: r.worker, InvocationID: r.run.ID, Attempt: r.run.Attempt, State: wire.AckRequeued,
		ExitCode: ptr(75), Error: &wire.ErrorInfo{Type: wire.AckRequeued, Message: "exited with status 75"}, Phase: phase}
	return r.svc.Ack(ctx, req.Outcome(), nil)
}

// TestRequeuedAckRefusedUnlessDraining: a requeued ack from a worker that
// is stored active and reports phase ready or setup is a conflict (409)
// that changes nothing in any table; the attempt stays running with its
// worker. Nothing is lost: the worker's next poll, which no longer lists
// it, takes it back as for any run its worker does not know.
func TestRequeuedAckRefusedUnlessDraining(t *testing.T) {
	for _, phase := range []string{wire.PhaseReady, wire.PhaseSetup} {
		t.Run(phase, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r := newRequeueRig(t, ctx)
			before := r.snap()
			res, err := r.ack(ctx, phase)
			if !errors.Is(err, domain.ErrConflict) || wire.Status(wire.CodeOf(err)) != 409 {
				t.Fatalf("requeued ack in phase %s: %+v %v; want a 409 conflict", phase, res, err)
			}
			if d := before.Diff(r.snap()); d != "" {
				t.Errorf("a refused requeued ack changed the tables:\n%s", d)
			}
			inv, err := r.st.GetInvocation(ctx, r.run.ID)
			if err != nil || inv.State != domain.StateRunning || inv.WorkerID != r.worker || inv.Attempt != 1 {
				t.Errorf("after the refusal: %s on %s attempt %d (%v); want running on %s attempt 1",
					inv.State, inv.WorkerID, inv.Attempt, err, r.worker)
			}
			if _, err := r.svc.Poll(ctx, wire.PollRequest{WorkerID: r.worker, Queue: "q", Phase: phase, Invocations: []string{},
				UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: ptr(0), CurrentInvocations: ptr(0)}}.Poll(), nil); err != nil {
				t.Fatal(err)
			}
			inv, err = r.st.GetInvocation(ctx, r.run.ID)
			if err != nil || inv.State != domain.StateQueued || inv.Attempts[0].Outcome != string(domain.EndOmitted) {
				t.Errorf("after a poll without it: %s, attempts %+v (%v); want queued, attempt 1 omitted", inv.State, inv.Attempts, err)
			}
		})
	}
}

// TestRequeuedAckSayingItDrainsHandsBack: a requeued ack whose phase is
// draining or terminating, from a worker no poll has yet reported
// draining, hands the attempt back (queued again, attempt 1 ended
// requeued) and leaves the worker stored draining: it claims nothing more,
// even the invocation it just handed back.
func TestRequeuedAckSayingItDrainsHandsBack(t *testing.T) {
	for _, phase := range []string{wire.PhaseDraining, wire.PhaseTerminating} {
		t.Run(phase, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r := newRequeueRig(t, ctx)
			if w, err := r.st.GetWorker(ctx, r.worker); err != nil || w.State != domain.WorkerActive {
				t.Fatalf("before the ack the worker is %s (%v); want active", w.State, err)
			}
			res, err := r.ack(ctx, phase)
			if err != nil || !res.Recorded || !res.HandedBack || res.State != domain.StateQueued {
				t.Fatalf("requeued ack in phase %s: %+v %v; want handed back, queued", phase, res, err)
			}
			inv, err := r.st.GetInvocation(ctx, r.run.ID)
			if err != nil || inv.State != domain.StateQueued || len(inv.Attempts) != 1 || inv.Attempts[0].Outcome != string(domain.EndRequeued) {
				t.Fatalf("after the hand-back: %s, attempts %+v (%v); want queued, attempt 1 ended requeued", inv.State, inv.Attempts, err)
			}
			w, err := r.st.GetWorker(ctx, r.worker)
			if err != nil || w.State != domain.WorkerDraining || w.Phase != domain.Phase(phase) {
				t.Fatalf("after the hand-back the worker is %s in phase %q (%v); want draining in phase %s", w.State, w.Phase, err, phase)
			}
			cmds, err := r.svc.Poll(ctx, wire.PollRequest{WorkerID: r.worker, Queue: "q", Phase: wire.PhaseReady, Invocations: []string{}}.Poll(), nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cmds {
				if c.Type == domain.CommandRun {
					t.Errorf("the draining worker claimed %s", c.Run.ID)
				}
			}
		})
	}
}

// TestRequeuedAckAcceptedAsBefore: a requeued ack without a phase (a nymph
// that sends none) from an active worker, and one from a worker an
// operator drained, hand the attempt back as they always did; the active
// worker stays active. A retired worker's requeued ack, even one saying
// ready, is answered as any of its acks is: its work went back at its bye,
// so it records nothing, and is no conflict.
func TestRequeuedAckAcceptedAsBefore(t *testing.T) {
	for _, c := range []struct {
		name, phase string
		before      func(context.Context, requeueRig) error
		worker      domain.WorkerState
	}{
		{"no phase, active", "", nil, domain.WorkerActive},
		{"no phase, stored draining", "", func(ctx context.Context, r requeueRig) error {
			_, err := r.svc.Drain(ctx, r.worker)
			return err
		}, domain.WorkerDraining},
		{"phase ready, stored draining", wire.PhaseReady, func(ctx context.Context, r requeueRig) error {
			_, err := r.svc.Drain(ctx, r.worker)
			return err
		}, domain.WorkerDraining},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r := newRequeueRig(t, ctx)
			if c.before != nil {
				if err := c.before(ctx, r); err != nil {
					t.Fatal(err)
				}
			}
			res, err := r.ack(ctx, c.phase)
			if err != nil || !res.Recorded || !res.HandedBack || res.State != domain.StateQueued {
				t.Fatalf("requeued ack: %+v %v; want handed back, queued", res, err)
			}
			inv, err := r.st.GetInvocation(ctx, r.run.ID)
			if err != nil || inv.State != domain.StateQueued || inv.Attempts[0].Outcome != string(domain.EndRequeued) {
				t.Errorf("after the hand-back: %s, attempts %+v (%v)", inv.State, inv.Attempts, err)
			}
			if w, err := r.st.GetWorker(ctx, r.worker); err != nil || w.State != c.worker {
				t.Errorf("after the hand-back the worker is %s (%v); want %s", w.State, err, c.worker)
			}
		})
	}

	t.Run("retired", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		r := newRequeueRig(t, ctx)
		if _, err := r.svc.Bye(ctx, domain.Bye{WorkerID: r.worker, Reason: wire.ByeSignal, Abandoned: 1}, nil); err != nil {
			t.Fatal(err)
		}
		before := r.snap()
		res, err := r.ack(ctx, wire.PhaseReady)
		if err != nil || res.Recorded || res.State != domain.StateQueued {
			t.Fatalf("a retired worker's requeued ack: %+v %v; want recorded false, queued", res, err)
		}
		if d := before.Diff(r.snap()); d != "" {
			t.Errorf("a retired worker's requeued ack changed the tables:\n%s", d)
		}
	})
}
