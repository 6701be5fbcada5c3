package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The conformance cases of setup commands: the FIFO and host setup results,
// run on every backend.
func init() {
	conformanceCases = append(conformanceCases,
		conformanceCase{"setup/FIFO", testSetupFIFO},
		conformanceCase{"setup/host setup result", testHostSetupResult},
	)
}

func testSetupFIFO(t *testing.T, f *fixture) {
	w := f.worker("m1", "")
	var added []domain.SetupCommand
	for i := range 3 {
		c, err := f.s.AddSetup(f.ctx, w.ID, []string{"setup", fmt.Sprint(i)})
		if err != nil {
			t.Fatalf("AddSetup: %v", err)
		}
		if !ids.Valid(ids.Command, c.CommandID) || c.Status != wire.SetupPending {
			t.Fatalf("AddSetup = %+v", c)
		}
		added = append(added, c)
		f.clock.Advance(time.Millisecond)
	}
	cmdIDs := func(pendingOnly bool) []string {
		t.Helper()
		cs, err := f.s.SetupCommands(f.ctx, w.ID, pendingOnly)
		if err != nil {
			t.Fatalf("SetupCommands: %v", err)
		}
		out := []string{}
		for _, c := range cs {
			out = append(out, c.CommandID)
		}
		return out
	}
	all := []string{added[0].CommandID, added[1].CommandID, added[2].CommandID}
	if got := cmdIDs(true); !slices.Equal(got, all) {
		t.Fatalf("pending = %v, want %v (in order)", got, all)
	}

	result := domain.SetupResult{CommandID: added[0].CommandID, Status: wire.SetupSucceeded, ExitCode: 0, DurationMS: 12, OutputTail: "ok"}
	got, err := f.s.RecordSetupResults(f.ctx, w, []domain.SetupResult{result})
	if err != nil {
		t.Fatalf("RecordSetupResults: %v", err)
	}
	// The worker row shows the latest result.
	if got.LastSetupResult == nil || *got.LastSetupResult != domain.SetupResult(result) {
		t.Fatalf("RecordSetupResults answered last_setup_result %+v, want %+v", got.LastSetupResult, result)
	}
	if stored := f.getWorker(w.ID).LastSetupResult; stored == nil || *stored != domain.SetupResult(result) {
		t.Fatalf("stored last_setup_result %+v, want %+v", stored, result)
	}
	if got := cmdIDs(true); !slices.Equal(got, all[1:]) {
		t.Fatalf("pending after one result = %v, want %v", got, all[1:])
	}
	// Repeats, unknown ids and another worker's reports change nothing.
	repeat := result
	repeat.Status, repeat.ExitCode, repeat.OutputTail = wire.SetupFailed, 7, "again"
	other := f.worker("m2", "")
	if _, err := f.s.RecordSetupResults(f.ctx, f.getWorker(w.ID), []domain.SetupResult{repeat, {CommandID: "cmd_unknown", Status: wire.SetupSucceeded}}); err != nil {
		t.Fatalf("RecordSetupResults (repeat): %v", err)
	}
	if _, err := f.s.RecordSetupResults(f.ctx, other, []domain.SetupResult{{CommandID: added[1].CommandID, Status: wire.SetupSucceeded}}); err != nil {
		t.Fatalf("RecordSetupResults (other worker): %v", err)
	}
	if stored := f.getWorker(w.ID).LastSetupResult; stored == nil || *stored != domain.SetupResult(result) {
		t.Fatalf("a repeat changed last_setup_result to %+v", stored)
	}
	if stored := f.getWorker(other.ID).LastSetupResult; stored != nil {
		t.Fatalf("another worker's unrecorded report set its last_setup_result %+v", stored)
	}
	cs, err := f.s.SetupCommands(f.ctx, w.ID, false)
	if err != nil || len(cs) != 3 {
		t.Fatalf("SetupCommands = %d, %v; want 3", len(cs), err)
	}
	first := cs[0]
	if first.CommandID != all[0] || first.Status != wire.SetupSucceeded || first.ExitCode == nil || *first.ExitCode != 0 ||
		first.DurationMS != 12 || first.OutputTail != "ok" || !first.FinishedAt.Equal(f.clock.Now()) ||
		!slices.Equal(first.Argv, []string{"setup", "0"}) {
		t.Fatalf("recorded command: %+v", first)
	}
	if cs[1].Status != wire.SetupPending || cs[2].Status != wire.SetupPending {
		t.Fatalf("other commands: %s %s, want pending", cs[1].Status, cs[2].Status)
	}
	if got := cmdIDs(false); len(got) != 3 {
		t.Fatalf("an unknown id made a row: %v", got)
	}
	if oc, err := f.s.SetupCommands(f.ctx, other.ID, false); err != nil || len(oc) != 0 {
		t.Fatalf("other worker's commands = %v, %v", oc, err)
	}

	if _, err := f.s.AddSetup(f.ctx, "wrk_missing", []string{"x"}); !errors.Is(err, wire.ErrNotFound) {
		t.Fatalf("AddSetup to an unknown worker: %v", err)
	}
	if _, err := f.svc.Bye(f.ctx, wire.ByeRequest{WorkerID: w.ID, Reason: wire.ByeIdle}.Bye(), nil); err != nil {
		t.Fatalf("Bye: %v", err)
	}
	_, err = f.s.AddSetup(f.ctx, w.ID, []string{"x"})
	wantCode(t, err, wire.ErrConflict)
}

// testHostSetupResult: a result without a command id is the daemon's own
// --host-setup command. No command row is moved or made, but it becomes the
// worker row's last_setup_result, so a failed host setup shows.
func testHostSetupResult(t *testing.T, f *fixture) {
	w := f.worker("m1", "")
	pending, err := f.s.AddSetup(f.ctx, w.ID, []string{"repair"})
	if err != nil {
		t.Fatalf("AddSetup: %v", err)
	}
	failed := domain.SetupResult{Command: "exit 3", Status: wire.SetupFailed, ExitCode: 3, DurationMS: 4, OutputTail: "boom"}
	got, err := f.s.RecordSetupResults(f.ctx, f.getWorker(w.ID), []domain.SetupResult{failed})
	if err != nil {
		t.Fatalf("RecordSetupResults: %v", err)
	}
	if got.LastSetupResult == nil || *got.LastSetupResult != domain.SetupResult(failed) {
		t.Fatalf("RecordSetupResults answered last_setup_result %+v, want %+v", got.LastSetupResult, failed)
	}
	if stored := f.getWorker(w.ID).LastSetupResult; stored == nil || *stored != domain.SetupResult(failed) {
		t.Fatalf("stored last_setup_result %+v, want %+v", stored, failed)
	}
	if cs, err := f.s.SetupCommands(f.ctx, w.ID, false); err != nil || len(cs) != 1 || cs[0].CommandID != pending.CommandID || cs[0].Status != wire.SetupPending {
		t.Fatalf("setup commands after a host-setup result: %+v, %v; want the one pending command untouched", cs, err)
	}
	// A result naming neither a command id nor a command records nothing.
	if _, err := f.s.RecordSetupResults(f.ctx, f.getWorker(w.ID), []domain.SetupResult{{Status: wire.SetupSucceeded}}); err != nil {
		t.Fatalf("RecordSetupResults (empty): %v", err)
	}
	if stored := f.getWorker(w.ID).LastSetupResult; stored == nil || *stored != domain.SetupResult(failed) {
		t.Fatalf("an empty result changed last_setup_result to %+v", stored)
	}
	// The control-plane repair and the host setup's rerun land in order.
	repaired := domain.SetupResult{CommandID: pending.CommandID, Status: wire.SetupSucceeded}
	rerun := domain.SetupResult{Command: "exit 3", Status: wire.SetupSucceeded, DurationMS: 2}
	if got, err = f.s.RecordSetupResults(f.ctx, f.getWorker(w.ID), []domain.SetupResult{repaired, rerun}); err != nil {
		t.Fatalf("RecordSetupResults (repair): %v", err)
	}
	if got.LastSetupResult == nil || *got.LastSetupResult != domain.SetupResult(rerun) {
		t.Fatalf("last_setup_result after the repair %+v, want %+v", got.LastSetupResult, rerun)
	}
	if cs, err := f.s.SetupCommands(f.ctx, w.ID, true); err != nil || len(cs) != 0 {
		t.Fatalf("pending after the repair: %+v, %v", cs, err)
	}
}

// TestSetupFIFOOrderWithinOneMillisecond: a worker's setup FIFO is ordered
// by command_id (the commands table's range key), a ULID. Commands added
// back to back, several in one millisecond, must still come out in the order
// they were added: ids.Generator draws monotonic entropy, so the ULIDs of
// one millisecond sort in the order one process made them (plain random
// entropy would sort them at random). The store keeps its defaults here
// (real clock).
func TestSetupFIFOOrderWithinOneMillisecond(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := storetest.Embedded(t)
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(ctx, db, prefix); err != nil {
		t.Fatalf("EnsureTables: %v", err)
	}
	s := store.New(db, prefix)
	w, err := storetest.Control(s).Register(ctx, helloReq("m1", "boot-1").Registration(), func(string) (string, error) { return "h", nil })
	if err != nil {
		t.Fatalf("Hello: %v", err)
	}
	for i := range 20 {
		if _, err := s.AddSetup(ctx, w.Worker.ID, []string{"step", fmt.Sprint(i)}); err != nil {
			t.Fatalf("AddSetup: %v", err)
		}
	}
	cs, err := s.SetupCommands(ctx, w.Worker.ID, true)
	if err != nil {
		t.Fatalf("SetupCommands: %v", err)
	}
	var got []string
	for _, c := range cs {
		got = append(got, strings.Join(c.Argv, " "))
	}
	var want []string
	for i := range 20 {
		want = append(want, fmt.Sprintf("step %d", i))
	}
	if !slices.Equal(got, want) {
		t.Errorf("setup FIFO order is not the order of AddSetup:\n got  %v\n want %v", got, want)
	}
}
