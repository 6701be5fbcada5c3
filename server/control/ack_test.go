package control_test

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// recorder keeps the metric events it hears, as "kind queue label".
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(e string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) Claimed(string, int, int, []time.Duration) {}
func (r *recorder) HandedBack(q string, ended domain.EndKind) {
	r.add("handed_back " + q + " " + string(ended))
}
func (r *recorder) Finished(q string, state domain.InvocationState) {
	r.add("finished " + q + " " + string(state))
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}

// TestAckRequeuedAndRetried: over the embedded store, a requeued ack hands
// the attempt back (queued, done_count unmoved, a handed-back event, no
// outcome), the next attempt's success counts once; a retried failure is
// no outcome either (an outcome is never counted with state "queued").
func TestAckRequeuedAndRetried(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := embeddedStore(t)
	rec := &recorder{}
	svc := control.New(control.Config{Store: st, StaleAfter: time.Minute, Metrics: rec, Logger: slog.New(slog.DiscardHandler)})
	issue := func(string) (string, error) { return "hash", nil }
	hello, err := svc.Hello(ctx, wire.HelloRequest{MachineID: "m1", BootID: "b1", Lanes: []string{"q"},
		Capabilities: wire.Capabilities{MaxConcurrency: ptr(1)}}.Registration(), issue)
	if err != nil {
		t.Fatal(err)
	}
	claim := func(want string) domain.Invocation {
		t.Helper()
		resp, err := svc.Poll(ctx, wire.PollRequest{WorkerID: hello.Worker.ID, Queue: "q", Phase: wire.PhaseReady, Invocations: []string{},
			UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: ptr(1), CurrentInvocations: ptr(0)}}.Poll(), nil)
		if err != nil || len(resp) != 1 || resp[0].Run == nil || resp[0].Run.ID != want {
			t.Fatalf("poll: %+v %v, want a run of %s", resp, err, want)
		}
		return *resp[0].Run
	}
	ack := func(run domain.Invocation, state domain.InvocationState, code int) store.AckResult {
		t.Helper()
		req := wire.AckRequest{WorkerID: hello.Worker.ID, InvocationID: run.ID, Attempt: run.Attempt, State: string(state), ExitCode: &code}
		if state == domain.StateFailed {
			req.Error = &wire.ErrorInfo{Type: wire.ErrorTypeExitCode, Message: "exited with status 3"}
		}
		res, err := svc.Ack(ctx, req.Outcome(), nil)
		if err != nil {
			t.Fatalf("ack %s: %v", state, err)
		}
		return res
	}
	done := func() int {
		t.Helper()
		s, err := st.QueueStats(ctx, "q")
		if err != nil {
			t.Fatal(err)
		}
		return s.DoneCount
	}

	inv, _, err := svc.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"train"}, MaxAttempts: 3}.Spec())
	if err != nil {
		t.Fatal(err)
	}
	first := claim(inv.ID)
	rec.take()
	if res := ack(first, domain.AckRequeued, 75); !res.Recorded || res.State != domain.StateQueued {
		t.Fatalf("requeued ack: %+v", res)
	}
	if got := rec.take(); !slices.Equal(got, []string{"handed_back q " + string(domain.EndRequeued)}) {
		t.Errorf("a requeued ack's metric events: %v", got)
	}
	if n := done(); n != 0 {
		t.Errorf("done_count %d after a requeue, want 0", n)
	}
	second := claim(inv.ID)
	if second.Attempt != 2 {
		t.Fatalf("after the requeue the claim is attempt %d", second.Attempt)
	}
	if res := ack(second, domain.StateSucceeded, 0); !res.Recorded || res.State != domain.StateSucceeded {
		t.Fatalf("success: %+v", res)
	}
	if n := done(); n != 1 {
		t.Errorf("done_count %d after the success, want 1", n)
	}
	got, err := st.GetInvocation(ctx, inv.ID)
	if err != nil || len(got.Attempts) != 2 || got.Attempts[0].Outcome != string(domain.EndRequeued) || !got.Attempts[1].Recorded {
		t.Errorf("history after requeue and success: %+v %v", got.Attempts, err)
	}

	retried, _, err := svc.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"flaky"}, MaxAttempts: 3,
		Retry: &wire.RetryPolicy{ExitCodes: []int{3}, BackoffS: 1}}.Spec())
	if err != nil {
		t.Fatal(err)
	}
	run := claim(retried.ID)
	rec.take()
	if res := ack(run, domain.StateFailed, 3); !res.Recorded || res.State != domain.StateQueued {
		t.Fatalf("retried failure: %+v", res)
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("a retried failure was counted as an outcome: %v", got)
	}
}
