package control_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// embeddedStore is a store over the embedded DynamoDB, its tables made.
func embeddedStore(t *testing.T) *store.Store {
	t.Helper()
	_, _, st := embeddedTables(t)
	return st
}

// embeddedTables is embeddedStore with its client and table prefix, for
// snapshots of the tables.
func embeddedTables(t *testing.T) (*dynamodb.Client, string, *store.Store) {
	t.Helper()
	db := storetest.Embedded(t)
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(t.Context(), db, prefix); err != nil {
		t.Fatal(err)
	}
	return db, prefix, store.New(db, prefix)
}

// TestPollUseCase drives the poll use case straight over the embedded
// store, no HTTP in between: the claim gate keeps a worker in setup from
// claiming, a ready poll claims up to capacity, and a poll that omits what
// the worker holds hands it back; a stale attempt's worker is told why to
// stop.
func TestPollUseCase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := embeddedStore(t)
	svc := control.New(control.Config{Store: st, StaleAfter: 3 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	issue := func(string) (string, error) { return "hash", nil }

	hello, err := svc.Hello(ctx, wire.HelloRequest{MachineID: "m1", BootID: "b1", Lanes: []string{"q"},
		Capabilities: wire.Capabilities{MaxConcurrency: ptr(2)}}.Registration(), issue)
	if err != nil || hello.StaleAfter.Seconds() != 3 || hello.PollInterval.Seconds() != 0.5 {
		t.Fatalf("hello: %+v %v", hello, err)
	}
	for range 3 {
		if _, _, err := svc.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}, MaxAttempts: 3}.Spec()); err != nil {
			t.Fatal(err)
		}
	}
	poll := func(phase string, running []string) []domain.Command {
		t.Helper()
		resp, err := svc.Poll(ctx, wire.PollRequest{WorkerID: hello.Worker.ID, Queue: "q", Phase: phase, Invocations: running,
			UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: ptr(2), CurrentInvocations: ptr(len(running))}}.Poll(), nil)
		if err != nil {
			t.Fatalf("poll (%s, running %v): %v", phase, running, err)
		}
		return resp
	}
	if cmds := poll(wire.PhaseSetup, []string{}); len(cmds) != 0 {
		t.Fatalf("a worker in setup was handed %+v", cmds)
	}
	cmds := poll(wire.PhaseReady, []string{})
	if len(cmds) != 2 || cmds[0].Type != wire.CommandRun || cmds[1].Type != wire.CommandRun {
		t.Fatalf("a ready worker with room for 2 got %+v", cmds)
	}
	first, second := cmds[0].Run.ID, cmds[1].Run.ID
	// It says it runs only the first: the second's run command was lost,
	// and it goes back to the queue; the poll has room for one more again.
	cmds = poll(wire.PhaseReady, []string{first})
	got, err := st.GetInvocation(ctx, second)
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != 1 || cmds[0].Type != wire.CommandRun {
		t.Fatalf("after handing one back, the poll answered %+v", cmds)
	}
	// Handed back as attempt 1, it is queued, or claimed again by this very
	// poll as attempt 2.
	if handedBack := got.State == domain.StateQueued || (got.State == domain.StateRunning && got.Attempt == 2); !handedBack {
		t.Fatalf("the omitted invocation is %s attempt %d on %s, want handed back", got.State, got.Attempt, got.WorkerID)
	}
	// An id the worker says it runs but never held is superseded.
	cmds = poll(wire.PhaseReady, []string{first, "inv_01J0000000000000000000000X"})
	for _, c := range cmds {
		if c.Type == wire.CommandCancel && c.InvocationID == "inv_01J0000000000000000000000X" && c.Reason == wire.CancelSuperseded {
			return
		}
	}
	t.Fatalf("an invocation the worker never held was not cancelled as superseded: %+v", cmds)
}

func ptr[T any](v T) *T { return &v }
