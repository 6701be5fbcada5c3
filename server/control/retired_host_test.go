package control_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// stopsHostOnClaim is the store with an EC2 event landing between a poll's
// heartbeat and its claim: the claiming worker's host stops (not yet
// stored gone: the sweep has not run).
type stopsHostOnClaim struct {
	*store.Store
	t *testing.T
}

func (s stopsHostOnClaim) Claim(ctx context.Context, w domain.Worker, queue string, max int) (store.ClaimResult, error) {
	if _, err := s.UpdateHostStatus(ctx, w.ID, domain.HostStopped); err != nil {
		s.t.Fatalf("stop the host: %v", err)
	}
	return s.Store.Claim(ctx, w, queue, max)
}

// TestWorkerOnAStoppedHostIsRetired: a worker whose host stopped reads
// retired before the sweep stores it gone. It cannot be drained, be sent a
// setup command or open a wake socket, and a run it claimed as its host
// stopped goes back to the queue instead of to it.
func TestWorkerOnAStoppedHostIsRetired(t *testing.T) {
	f := newWakeChannelFixture(t)
	id, token := f.worker(t, "i-0aaaaaaaaaaaaaaa0", "")
	stopped, err := f.st.UpdateHostStatus(f.ctx, id, domain.HostStopped)
	if err != nil || stopped.State == domain.WorkerGone || !domain.Retired(stopped) {
		t.Fatalf("host stopped: %+v %v; want retired, not yet stored gone", stopped, err)
	}
	if _, err := f.svc.Drain(f.ctx, id); err == nil {
		t.Error("a worker whose host stopped was drained")
	}
	if _, err := f.svc.AddSetup(f.ctx, id, []string{"true"}); err == nil {
		t.Error("a worker whose host stopped was given a setup command")
	}
	if cmds, err := f.st.SetupCommands(f.ctx, id, false); err != nil || len(cmds) != 0 {
		t.Errorf("setup commands of the retired worker: %+v %v; want none", cmds, err)
	}
	if _, err := f.svc.Connect(f.ctx, "c-retired", token, ""); !errors.Is(err, wire.ErrWorkerGone) {
		t.Errorf("wake socket of a worker whose host stopped: %v; want worker_gone", err)
	}
	if w, err := f.st.GetWorker(f.ctx, id); err != nil || w.State != stopped.State || w.Version != stopped.Version {
		t.Errorf("the retired worker changed: %+v %v; want it as its host left it", w, err)
	}

	// A run claimed as the host stopped is not handed out.
	other, _ := f.worker(t, "i-0bbbbbbbbbbbbbbb0", "")
	inv, _, err := f.svc.Submit(f.ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"x"}, MaxAttempts: 3}.Spec())
	if err != nil {
		t.Fatal(err)
	}
	svc := control.New(control.Config{Store: stopsHostOnClaim{f.st, t}, Clock: f.st.Clock, Logger: slog.New(slog.DiscardHandler)})
	res, err := svc.Poll(f.ctx, wire.PollRequest{WorkerID: other, Queue: "q", Phase: wire.PhaseReady}.Poll(), nil)
	for _, c := range res {
		if c.Type == wire.CommandRun {
			t.Fatalf("a worker whose host stopped as it claimed was handed %s", c.Run.ID)
		}
	}
	if !errors.Is(err, wire.ErrWorkerGone) {
		t.Errorf("poll as the host stopped: %v; want worker_gone", err)
	}
	if got, err := f.st.GetInvocation(f.ctx, inv.ID); err != nil || got.State != domain.StateQueued {
		t.Fatalf("the claimed run: %+v %v; want queued again", got, err)
	}
}
