package control_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestTerminatedHostIsRetired: once its host is terminated, a worker's poll
// is refused with 410 (it reads gone), and a hello from the same process
// (same machine and boot) makes a new worker instead of reviving it.
func TestTerminatedHostIsRetired(t *testing.T) {
	ctx := context.Background()
	s, _ := storetest.Store(t)
	svc := storetest.Control(s)
	issue := func(string) (string, error) { return "h", nil }
	hello := wire.HelloRequest{MachineID: "i-0123456789abcdef0", BootID: "b"}
	first, err := svc.Register(ctx, hello.Registration(), issue)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.SetHostStatus(ctx, first.Worker.ID, domain.HostTerminated); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Heartbeat(ctx, wire.PollRequest{WorkerID: first.Worker.ID, Phase: wire.PhaseReady}.Poll(), nil); !errors.Is(err, wire.ErrWorkerGone) {
		t.Fatalf("poll of a worker on a terminated host: %v, want 410", err)
	}
	again, err := svc.Register(ctx, hello.Registration(), issue)
	if err != nil || again.Worker.ID == first.Worker.ID {
		t.Fatalf("hello after the host was terminated: %+v %v; want a new worker", again.Worker.ID, err)
	}
}
