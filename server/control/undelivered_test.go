package control_test

import (
	"context"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// goneAfterClaim is the real store, but the poll's client goes away just
// as its claim lands (it timed out waiting on an overloaded control plane).
type goneAfterClaim struct {
	*store.Store
	cancel context.CancelFunc
}

func (g goneAfterClaim) Claim(ctx context.Context, w domain.Worker, queue string, max int) (store.ClaimResult, error) {
	res, err := g.Store.Claim(ctx, w, queue, max)
	g.cancel()
	return res, err
}

// TestAClaimForAPollWhoseClientLeftGoesBackAtOnce: when a poll's client
// went away before its claim was answered, nothing can reach the daemon,
// so what it claimed goes back to the queue at once, undelivered (no
// attempt spent), rather than wait for that worker's next poll.
func TestAClaimForAPollWhoseClientLeftGoesBackAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := embeddedStore(t)
	pollCtx, leave := context.WithCancel(ctx)
	defer leave()
	svc, worker := oneWorker(t, ctx, control.Config{Store: goneAfterClaim{Store: st, cancel: leave}})
	inv, _, err := svc.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"train"}, MaxAttempts: 1}.Spec())
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := svc.Poll(pollCtx, wire.PollRequest{WorkerID: worker, Queue: "q", Phase: wire.PhaseReady, Invocations: []string{},
		UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: ptr(1), CurrentInvocations: ptr(0)}}.Poll(), nil)
	if domain.KindOf(err) != domain.KindUnavailable || len(cmds) != 0 {
		t.Fatalf("poll whose client left: %+v %v, want no commands and unavailable (503), as any poll cut off", cmds, err)
	}
	got, err := st.GetInvocation(ctx, inv.ID)
	if err != nil || got.State != domain.StateQueued || len(got.Attempts) != 1 || got.Attempts[0].Outcome != string(domain.EndUndelivered) {
		t.Fatalf("after the poll: %s, attempts %+v (%v); want queued again, attempt 1 undelivered", got.State, got.Attempts, err)
	}
}

// countingClaims is the real store, counting claim reads.
type countingClaims struct {
	*store.Store
	claims *int
}

func (c countingClaims) Claim(ctx context.Context, w domain.Worker, queue string, max int) (store.ClaimResult, error) {
	*c.claims++
	return c.Store.Claim(ctx, w, queue, max)
}

// TestAHeldPollInOneProcessRechecksSeldom: with long polls (one process
// serves every route, so its own submits, hand-backs and sweeps wake a
// held poll), an idle poll held 20 s looks at the store every 5 s, not on
// the 1–2 s backoff a poll served beside other processes needs: an idle
// fleet's polls are most of what a large in-process fleet asks the store.
func TestAHeldPollInOneProcessRechecksSeldom(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := embeddedStore(t)
	claims := 0
	svc, worker := oneWorker(t, ctx, control.Config{Store: countingClaims{Store: st, claims: &claims},
		LongPoll: true, Sleep: func(context.Context, time.Duration) error { return nil }})
	cmds, err := svc.Poll(ctx, wire.PollRequest{WorkerID: worker, Queue: "q", Phase: wire.PhaseReady, Invocations: []string{},
		TimeoutS: 20, UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: ptr(1), CurrentInvocations: ptr(0)}}.Poll(), nil)
	if err != nil || len(cmds) != 0 {
		t.Fatalf("idle poll: %+v %v", cmds, err)
	}
	if claims != 5 {
		t.Errorf("an idle poll held 20 s read the claim index %d times, want 5 (at 0, 5, 10, 15 and 20 s)", claims)
	}
}
