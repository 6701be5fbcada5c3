package control_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestHostStatus: a running host changes nothing but the column; a stopped
// one makes the worker read gone and hands its running work back at once;
// a host status never moves back; a worker stored gone is left alone.
func TestHostStatus(t *testing.T) {
	ctx := context.Background()
	c := clock.NewFake(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	s := embeddedStore(t)
	s.Clock = c.Clock()
	svc := storetest.Control(s)
	issue := func(string) (string, error) { return "h", nil }
	hello := func(m string) domain.Worker {
		res, err := svc.Register(ctx, wire.HelloRequest{MachineID: m, BootID: "b"}.Registration(), issue)
		if err != nil {
			t.Fatal(err)
		}
		return res.Worker
	}
	w, other, bye := hello("i-0123456789abcdef0"), hello("i-0fedcba9876543210"), hello("laptop")
	if _, err := svc.Bye(ctx, wire.ByeRequest{WorkerID: bye.ID, Reason: "done"}.Bye(), nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := svc.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"x"}, MaxAttempts: 3}.Spec()); err != nil {
		t.Fatal(err)
	}
	claim, err := s.Claim(ctx, w, "q", 1)
	if err != nil || len(claim.Claimed) != 1 {
		t.Fatalf("claim: %+v %v", claim, err)
	}
	inv := claim.Claimed[0]

	live, err := s.LiveWorkersByMachine(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 2 || len(live[w.MachineID]) != 1 || live[w.MachineID][0].ID != w.ID || len(live[other.MachineID]) != 1 {
		t.Fatalf("LiveWorkersByMachine = %+v, want the two workers on instances (not the one that said bye)", live)
	}
	if id, ok, err := s.MachineWorker(ctx, w.MachineID); err != nil || !ok || id != w.ID {
		t.Fatalf("MachineWorker = %q %v %v, want %s", id, ok, err, w.ID)
	}
	if _, ok, err := s.MachineWorker(ctx, "i-00000000"); err != nil || ok {
		t.Fatalf("MachineWorker(unknown) = %v %v, want not found", ok, err)
	}

	if _, err := svc.SetHostStatus(ctx, w.ID, "exploded"); !errors.Is(err, wire.ErrInvalid) {
		t.Fatalf("SetHostStatus(exploded): %v, want invalid", err)
	}
	got, err := svc.SetHostStatus(ctx, w.ID, domain.HostRunning)
	if err != nil || got.HostStatus != domain.HostRunning || got.Version != w.Version+1 {
		t.Fatalf("running: %+v %v", got, err)
	}
	if again, err := svc.SetHostStatus(ctx, w.ID, domain.HostRunning); err != nil || again.Version != got.Version {
		t.Fatalf("running again wrote: version %d → %d, %v", got.Version, again.Version, err)
	}
	if i, _ := s.GetInvocation(ctx, inv.ID); i.State != domain.StateRunning {
		t.Fatalf("invocation on a running host: %s", i.State)
	}

	c.Advance(time.Second)
	got, err = svc.SetHostStatus(ctx, w.ID, domain.HostStopped)
	if err != nil || got.HostStatus != domain.HostStopped || !got.GoneAt.Equal(c.Now()) {
		t.Fatalf("stopped: %+v %v", got, err)
	}
	if p := domain.Project(got, c.Now(), time.Minute); p != domain.WorkerGone {
		t.Fatalf("worker on a stopped host reads %s, want gone", p)
	}
	if i, _ := s.GetInvocation(ctx, inv.ID); i.State != domain.StateQueued {
		t.Fatalf("invocation of a stopped host's worker: %s, want queued at once", i.State)
	}
	if back, err := svc.SetHostStatus(ctx, w.ID, domain.HostRunning); err != nil || back.HostStatus != domain.HostStopped || back.Version != got.Version {
		t.Fatalf("stopped → running revived: %+v %v", back, err)
	}
	term, err := svc.SetHostStatus(ctx, w.ID, domain.HostTerminated)
	if err != nil || term.HostStatus != domain.HostTerminated || !term.GoneAt.Equal(got.GoneAt) {
		t.Fatalf("terminated: %+v %v", term, err)
	}
	live, err = s.LiveWorkersByMachine(ctx)
	if err != nil || len(live) != 1 || len(live[other.MachineID]) != 1 {
		t.Fatalf("LiveWorkersByMachine after terminate = %+v %v, want only the other worker", live, err)
	}

	gone, err := s.GetWorker(ctx, bye.ID)
	if err != nil {
		t.Fatal(err)
	}
	if after, err := svc.SetHostStatus(ctx, bye.ID, domain.HostTerminated); err != nil || after.Version != gone.Version || after.HostStatus != "" {
		t.Fatalf("SetHostStatus on a gone worker wrote: %+v %v", after, err)
	}
	if _, err := svc.SetHostStatus(ctx, "w-nope", domain.HostRunning); !errors.Is(err, wire.ErrNotFound) {
		t.Fatalf("SetHostStatus(unknown worker): %v, want not found", err)
	}
}
