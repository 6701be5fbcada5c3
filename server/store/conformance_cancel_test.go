package store_test

import (
	"slices"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The conformance cases of operator cancels of queued, running and finished
// work, run on every backend.
func init() {
	conformanceCases = append(conformanceCases,
		conformanceCase{"cancel/queued", testCancelQueued},
		conformanceCase{"cancel/running", testCancelRunning},
		conformanceCase{"cancel/terminal conflict", testCancelTerminal},
	)
}

func testCancelQueued(t *testing.T, f *fixture) {
	inv := f.submit(submitReq())
	f.clock.Advance(time.Second)
	got, err := f.s.Cancel(f.ctx, inv.ID)
	if err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	stored := f.get(inv.ID)
	for _, g := range []domain.Invocation{got, stored} {
		if g.State != domain.StateCancelled || !g.FinishedAt.Equal(f.clock.Now()) || g.Error == nil {
			t.Fatalf("cancelled queued: %+v", g)
		}
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateCancelled: 1}, 1)
	f.claimNone(f.worker("m1", ""), "q")
}

func testCancelRunning(t *testing.T, f *fixture) {
	inv := f.submit(submitReq())
	w := f.worker("m1", "")
	f.claimOne(w, inv)
	for range 2 { // a second cancel of the same running attempt is a no-op
		got, err := f.s.Cancel(f.ctx, inv.ID)
		if err != nil || got.State != domain.StateRunning || !got.CancelRequested {
			t.Fatalf("Cancel of running = %s cancel_requested %v, %v", got.State, got.CancelRequested, err)
		}
	}
	if stored := f.get(inv.ID); !stored.CancelRequested || stored.Version != 3 {
		t.Fatalf("stored: cancel_requested %v version %d, want true 3", stored.CancelRequested, stored.Version)
	}
	// Still held by its worker (its poll carries the cancel), not counted.
	if h := f.held(w.ID); !slices.Equal(h, []string{inv.ID}) {
		t.Fatalf("Held = %v", h)
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateRunning: 1}, 0)
	f.mustAck(w, inv, 1, domain.StateCancelled, true)
	f.wantStats("q", map[domain.InvocationState]int{domain.StateCancelled: 1}, 1)
}

func testCancelTerminal(t *testing.T, f *fixture) {
	done := f.submit(submitReq())
	w := f.worker("m1", "")
	f.claimOne(w, done)
	f.mustAck(w, done, 1, domain.StateSucceeded, true)
	_, err := f.s.Cancel(f.ctx, done.ID)
	wantCode(t, err, wire.ErrConflict)

	cancelled := f.submit(submitReq())
	if _, err := f.s.Cancel(f.ctx, cancelled.ID); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	_, err = f.s.Cancel(f.ctx, cancelled.ID)
	wantCode(t, err, wire.ErrConflict)
	_, err = f.s.Cancel(f.ctx, "inv_missing")
	wantCode(t, err, wire.ErrNotFound)
	f.wantStats("q", map[domain.InvocationState]int{domain.StateSucceeded: 1, domain.StateCancelled: 1}, 2)
}
