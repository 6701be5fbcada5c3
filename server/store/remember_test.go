package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestRememberedHeartbeatWritesWithoutARead: with RememberWrites, a poll
// that changes the worker's row writes it against the row the store last
// wrote, with no read first; without it, every such poll reads the row.
func TestRememberedHeartbeatWritesWithoutARead(t *testing.T) {
	for _, remember := range []bool{false, true} {
		f := newPollFixture(t)
		f.s.RememberWrites = remember
		f.poll("inv_a") // the first poll reads: the hello wrote the row
		for i, listed := range [][]string{{"inv_b"}, {"inv_b", "inv_c"}, {}} {
			got := f.poll(listed...)
			// The poll reads each invocation it lists that the worker does
			// not hold (none exists here), and the worker row unless it is
			// remembered.
			wantGets := len(listed) + 1
			if remember {
				wantGets--
			}
			if got["GetItem"] != wantGets || got["PutItem"] != 1 {
				t.Errorf("remember=%v, poll %d listing %v: %v; want %d GetItem and 1 PutItem", remember, i, listed, got, wantGets)
			}
			if w := f.worker(); len(w.Listed) != len(listed) {
				t.Errorf("remember=%v, poll %d: the row lists %v, want %v", remember, i, w.Listed, listed)
			}
			f.count()
		}
	}
}

// TestRememberedHeartbeatSeesOtherWrites: a row another process changed
// since this store wrote it fails the remembered write, and the poll is
// decided again on the row read afresh: its own change lands on top of
// the other's, and a retirement is answered as one.
func TestRememberedHeartbeatSeesOtherWrites(t *testing.T) {
	f := newPollFixture(t)
	f.s.RememberWrites = true
	f.poll("inv_a")

	// Another process records a setup command: the row's version moves.
	if _, err := storetest.Control(f.other).AddSetup(f.ctx, f.w.ID, []string{"true"}); err != nil {
		t.Fatal(err)
	}
	f.count()
	got := f.poll("inv_b")
	if got["PutItem"] != 2 || got["GetItem"] != 2 {
		t.Errorf("a poll after another process changed the row: %v; want the remembered put refused, a read of the row, the put again (and a read of inv_b, which is not held)", got)
	}
	w := f.worker()
	if len(w.Listed) != 1 || w.Listed[0] != "inv_b" || !w.MayHaveSetup() {
		t.Errorf("row after the poll: listed %v, setup_added %d; want [inv_b] and the other process's setup count kept", w.Listed, w.SetupAdded)
	}
	f.count()

	// Another process retires the worker: the next poll is told it is
	// gone, though on the remembered row it would change nothing (the
	// same list, within the quiet interval), so nothing would check it.
	if _, _, err := f.other.MarkGone(f.ctx, f.w.ID, nil, domain.EndGone, "retired by the test"); err != nil {
		t.Fatal(err)
	}
	p := wire.PollRequest{WorkerID: f.w.ID, Phase: wire.PhaseReady, Invocations: []string{"inv_b"}}.Poll()
	_, err := storetest.Control(f.s).Poll(f.ctx, p, nil)
	if domain.KindOf(err) != domain.KindGone {
		t.Fatalf("poll of a worker another process retired: %v; want gone", err)
	}
	if w := f.worker(); w.State != domain.WorkerGone || len(w.Listed) != 1 || w.Listed[0] != "inv_b" {
		t.Errorf("row after the refused poll: state %s, listed %v; want gone, still [inv_b]", w.State, w.Listed)
	}
}

// TestRememberedHeartbeatChecksTheToken: a token that does not pass on the
// remembered row is checked again on the row read afresh, and refused as
// ever; the row is not written.
func TestRememberedHeartbeatChecksTheToken(t *testing.T) {
	f := newPollFixture(t)
	f.s.RememberWrites = true
	f.poll("inv_a")
	before := f.worker()
	f.count()
	p := wire.PollRequest{WorkerID: f.w.ID, Phase: wire.PhaseReady, Invocations: []string{"inv_b"}}.Poll()
	_, err := storetest.Control(f.s).Poll(f.ctx, p, authorizeHash("not-the-hash"))
	if !errors.Is(err, wire.ErrUnauthorized) {
		t.Fatalf("poll with a wrong token: %v; want unauthorized", err)
	}
	if got := f.count(); got["PutItem"] != 0 || got["GetItem"] != 1 {
		t.Errorf("a refused poll made %v; want one read and no write", got)
	}
	if w := f.worker(); w.Version != before.Version {
		t.Errorf("the row moved from version %d to %d on a refused poll", before.Version, w.Version)
	}
}

// TestPollOfAFinishedInvocationNeedsNoRead: with RememberWrites, a poll
// that still lists an invocation this store recorded finished (its ack
// raced the poll) is told it is over without reading it; without, the
// poll reads it. The answer is the same.
func TestPollOfAFinishedInvocationNeedsNoRead(t *testing.T) {
	for _, remember := range []bool{false, true} {
		f := newPollFixture(t)
		f.s.RememberWrites = remember
		svc := storetest.Control(f.s)
		inv := f.finishOne(f.s)
		f.poll(inv.ID) // reads the worker row, remembered or not
		p := wire.PollRequest{WorkerID: f.w.ID, Phase: wire.PhaseReady, Invocations: []string{inv.ID}}.Poll()
		f.clock.Advance(6 * time.Second) // past the quiet interval: the poll writes
		cmds, err := svc.Poll(f.ctx, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := f.count()
		want := 0
		if !remember {
			want = 2 // the worker row and the invocation
		}
		if got["GetItem"] != want {
			t.Errorf("remember=%v: the poll made %v; want %d GetItem", remember, got, want)
		}
		if len(cmds) != 1 || cmds[0].Type != domain.CommandCancel || cmds[0].InvocationID != inv.ID || cmds[0].Reason != domain.CancelSuperseded {
			t.Errorf("remember=%v: poll answered %+v; want one superseded cancel of %s", remember, cmds, inv.ID)
		}
	}
}

// TestPollOfAnInvocationReadFinished: an invocation another process
// finished is read once by the poll that lists it; with RememberWrites the
// next poll that still lists it needs no read, as it stays finished.
func TestPollOfAnInvocationReadFinished(t *testing.T) {
	f := newPollFixture(t)
	f.s.RememberWrites = true
	inv := f.finishOne(f.other)
	f.poll() // remembers the worker row
	f.clock.Advance(6 * time.Second)
	if got := f.poll(inv.ID); got["GetItem"] != 1 {
		t.Errorf("the first poll listing %s made %v; want 1 GetItem (the invocation)", inv.ID, got)
	}
	f.clock.Advance(6 * time.Second)
	if got := f.poll(inv.ID); got["GetItem"] != 0 {
		t.Errorf("the next poll listing it made %v; want no GetItem", got)
	}
}

// finishOne submits an invocation through s, claims it for the fixture's
// worker and acks it succeeded, and returns it as claimed.
func (f *pollFixture) finishOne(s *store.Store) domain.Invocation {
	f.t.Helper()
	svc := storetest.Control(s)
	if _, _, err := svc.Submit(f.ctx, submitReq("job").Spec()); err != nil {
		f.t.Fatal(err)
	}
	inv := claimOne(f.t, s, f.w)
	if _, err := svc.Ack(f.ctx, ackReq(f.w, inv, inv.Attempt, domain.StateSucceeded).Outcome(), authorizeHash(f.w.TokenHash)); err != nil {
		f.t.Fatal(err)
	}
	return inv
}
