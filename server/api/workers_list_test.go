package api_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestWorkerListFiltersAndRetention: ls workers --state/--label select by
// the computed state and the label; a worker silent past an hour is retired
// by the sweep, keeping its last_seen_at; once reaped it leaves the list a
// day after it went gone, and stays readable by id meanwhile.
func TestWorkerListFiltersAndRetention(t *testing.T) {
	c := newClock()
	h := newHarness(t, withClock(c), func(cfg *apitest.Config) { cfg.Control.StaleAfter = 3 * time.Second })
	sweeper := control.New(control.Config{Store: h.store, StaleAfter: 3 * time.Second, Clock: c.Clock(), Logger: slog.New(slog.DiscardHandler)})
	sweep := func() {
		t.Helper()
		if _, err := sweeper.Sweep(context.Background()); err != nil {
			t.Fatalf("sweep: %v", err)
		}
	}
	list := func(query string) map[string]wire.Worker {
		t.Helper()
		var out wire.WorkerList
		h.do("GET", "/v1/workers"+query, operatorToken, nil).want(t, 200, &out)
		got := map[string]wire.Worker{}
		for _, w := range out.Workers {
			got[w.WorkerID] = w
		}
		return got
	}
	silent := h.helloReq(wire.HelloRequest{MachineID: "m-silent", BootID: "b", Label: "cpu", Lanes: []string{"default"}})
	busy := h.helloReq(wire.HelloRequest{MachineID: "m-busy", BootID: "b", Label: "gpu", Lanes: []string{"default"}})
	seen := h.worker(silent.id).LastSeenAt

	c.Advance(10 * time.Second)
	h.poll(busy, wire.PollRequest{Phase: wire.PhaseReady})
	if got := list("?state=stale"); len(got) != 1 || got[silent.id].StateWhy != "silent for 10s; stale after 3s" {
		t.Fatalf("state=stale: %+v", got)
	}
	if got := list("?label=gpu"); len(got) != 1 || got[busy.id].State != "active" {
		t.Fatalf("label=gpu: %+v", got)
	}
	if got := list("?state=active&label=cpu"); len(got) != 0 {
		t.Fatalf("state=active&label=cpu: %+v", got)
	}
	h.do("GET", "/v1/workers?state=asleep", operatorToken, nil).wantError(t, 400, wire.CodeInvalid)

	c.Advance(2 * time.Hour)
	h.poll(busy, wire.PollRequest{Phase: wire.PhaseReady})
	sweep()
	w := h.worker(silent.id)
	if w.State != "gone" || w.StoredState != "gone" || w.RetiredAt == nil || !w.LastSeenAt.Equal(*seen) ||
		w.StateWhy != "retired after 2h0m0s of silence" {
		t.Fatalf("after two silent hours: %s (stored %s) retired %v last seen %v (want %v): %q",
			w.State, w.StoredState, w.RetiredAt, w.LastSeenAt, seen, w.StateWhy)
	}

	c.Advance(11 * time.Minute) // past the holder index's settling time: reaped
	h.poll(busy, wire.PollRequest{Phase: wire.PhaseReady})
	sweep()
	if got := list(""); len(got) != 2 {
		t.Fatalf("a reaped worker left the list before the retention: %+v", got)
	}
	c.Advance(24 * time.Hour)
	h.poll(busy, wire.PollRequest{Phase: wire.PhaseReady})
	if got := list(""); len(got) != 1 || got[busy.id].WorkerID == "" {
		t.Fatalf("a day after it went gone: %+v; want only the live worker", got)
	}
	if w := h.worker(silent.id); w.State != "gone" {
		t.Fatalf("by id after the retention: %+v", w)
	}
}
