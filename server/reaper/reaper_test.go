package reaper_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/metrics"
	"github.com/dreamlake/lakeshore/server/reaper"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestHandlerSweeps: a scheduled event runs one sweep over the real store:
// a worker silent past the window loses its running invocation to the queue.
func TestHandlerSweeps(t *testing.T) {
	ctx := context.Background()
	s, c := storetest.Store(t)
	svc := storetest.Control(s)
	res, err := svc.Register(ctx, wire.HelloRequest{MachineID: "m", BootID: "b"}.Registration(), func(string) (string, error) { return "h", nil })
	if err != nil {
		t.Fatal(err)
	}
	inv, _, err := svc.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"x"}, MaxAttempts: 3}.Spec())
	if err != nil {
		t.Fatal(err)
	}
	if r, err := s.Claim(ctx, res.Worker, "q", 1); err != nil || len(r.Claimed) != 1 {
		t.Fatalf("claim: %+v %v", r, err)
	}
	var logs, emf bytes.Buffer
	h := reaper.Handler(svc, svc, &metrics.EMF{W: &emf, Clock: c.Clock()}, time.Hour, slog.New(slog.NewJSONHandler(&logs, nil)))
	scheduled := json.RawMessage(`{"source":"aws.scheduler","detail-type":"Scheduled Event","detail":{}}`)

	if got, err := h(ctx, scheduled); err != nil || got.Requeued != 0 {
		t.Fatalf("sweep inside the window: %+v %v", got, err)
	}
	c.Advance(61 * time.Second)
	got, err := h(ctx, scheduled)
	if err != nil || got.Lost != 1 || got.Requeued != 1 {
		t.Fatalf("sweep past the window: %+v %v", got, err)
	}
	if after, _ := s.GetInvocation(ctx, inv.ID); after.State != domain.StateQueued {
		t.Fatalf("invocation after the sweep: %s, want queued", after.State)
	}
	if !strings.Contains(logs.String(), `"requeued":1`) {
		t.Fatalf("sweep not logged: %s", logs.String())
	}

	// The gauges of the last sweep, as CloudWatch reads EMF: one JSON
	// object a line, the metric values at the top level, named in _aws.
	var depth, stale, running float64 = -1, -1, -1
	for _, line := range strings.Split(strings.TrimSpace(emf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("EMF line %q: %v", line, err)
		}
		aws, _ := m["_aws"].(map[string]any)
		if aws == nil || aws["Timestamp"] == nil || aws["CloudWatchMetrics"] == nil {
			t.Fatalf("EMF line without its _aws block: %s", line)
		}
		switch {
		case m["Queue"] == "q" && m["QueueDepth"] != nil:
			depth, running = m["QueueDepth"].(float64), m["Running"].(float64)
		case m["State"] == "stale" && m["Workers"] != nil:
			stale = m["Workers"].(float64)
		}
	}
	if depth != 1 || running != 0 || stale != 1 {
		t.Fatalf("gauges after the sweep: depth %v running %v stale workers %v; want 1, 0, 1\n%s", depth, running, stale, emf.String())
	}
}

type failingSweeper struct{}

func (failingSweeper) Sweep(context.Context) (control.SweepResult, error) {
	return control.SweepResult{Workers: 3}, context.DeadlineExceeded
}

// TestHandlerReportsFailure: a failed sweep is an error, so the scheduled
// invocation is retried, and it is logged.
func TestHandlerReportsFailure(t *testing.T) {
	var logs bytes.Buffer
	h := reaper.Handler(failingSweeper{}, nil, nil, 0, slog.New(slog.NewJSONHandler(&logs, nil)))
	if _, err := h(context.Background(), nil); err == nil {
		t.Fatal("a failed sweep returned no error")
	}
	if !strings.Contains(logs.String(), "sweep failed") {
		t.Fatalf("failure not logged: %s", logs.String())
	}
}

type backfiller struct {
	calls int
	err   error
}

func (b *backfiller) BackfillIndexes(context.Context) (int, error) {
	b.calls++
	return 2, b.err
}

type countingSweeper struct{ calls int }

func (c *countingSweeper) Sweep(context.Context) (control.SweepResult, error) {
	c.calls++
	return control.SweepResult{}, nil
}

// TestBackfillRunsBeforeEachSweep: the backfill runs before every sweep,
// and one cut short is logged without failing the sweep (it is tried
// again before the next).
func TestBackfillRunsBeforeEachSweep(t *testing.T) {
	var logs bytes.Buffer
	b := &backfiller{err: context.DeadlineExceeded}
	s := &countingSweeper{}
	h := reaper.WithBackfill(b, slog.New(slog.NewJSONHandler(&logs, nil)), reaper.Handler(s, nil, nil, 0, slog.New(slog.DiscardHandler)))
	for range 2 {
		if _, err := h(context.Background(), nil); err != nil {
			t.Fatalf("a backfill cut short failed the sweep: %v", err)
		}
	}
	if b.calls != 2 || s.calls != 2 {
		t.Errorf("backfills %d, sweeps %d; want 2 each", b.calls, s.calls)
	}
	if !strings.Contains(logs.String(), "backfill not finished") || !strings.Contains(logs.String(), `"rows":2`) {
		t.Errorf("backfill not logged: %s", logs.String())
	}
}
