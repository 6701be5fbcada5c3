// Package reaper is the scheduled redelivery sweep (docs/design.md §5): every run
// hands back the running work of each worker that reads stale or gone. The
// Lambda in functions/reaper runs it on a schedule; `lakeshore dev` runs the
// same sweep (control.Service.Sweep) on a ticker.
package reaper

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/metrics"
)

// Sweeper is the use case the reaper runs.
type Sweeper interface {
	Sweep(ctx context.Context) (control.SweepResult, error)
}

var _ Sweeper = (*control.Service)(nil)

// Gauger reads and writes the gauges (docs/metrics.md): the reaper runs
// on a schedule anyway, so it is where the queue depths, oldest queued ages
// and workers by state are measured on AWS.
type Gauger interface {
	Gauges(ctx context.Context, retention time.Duration) (metrics.Gauges, error)
}

// Backfiller brings rows written before the indexes that keep the sweep
// independent of history into them, once per deployment
// (store.Store.BackfillIndexes).
type Backfiller interface {
	BackfillIndexes(ctx context.Context) (int, error)
}

// Backfill runs b before a sweep and logs what it did. It never fails the
// sweep: a pass cut short is tried again before the next one.
func Backfill(ctx context.Context, b Backfiller, log *slog.Logger) {
	n, err := b.BackfillIndexes(ctx)
	if n > 0 {
		log.Info("backfill: rows written before the history-independent indexes brought into them", "rows", n)
	}
	if err != nil {
		log.Warn("backfill not finished; tried again before the next sweep", "rows", n, "error", err.Error())
	}
}

// WithBackfill is h with Backfill run before each of its sweeps.
func WithBackfill(b Backfiller, log *slog.Logger, h func(context.Context, json.RawMessage) (control.SweepResult, error)) func(context.Context, json.RawMessage) (control.SweepResult, error) {
	return func(ctx context.Context, ev json.RawMessage) (control.SweepResult, error) {
		Backfill(ctx, b, log)
		return h(ctx, ev)
	}
}

// Handler returns the Lambda handler: any event (a schedule's, or a manual
// invoke) runs one sweep, then writes the gauges to out (nil g or out:
// none). A failed sweep is returned as an error so the invocation is
// retried; what it did is logged either way. Gauges that cannot be read
// are logged, not an error: the sweep's work is done.
func Handler(s Sweeper, g Gauger, out *metrics.EMF, retention time.Duration, log *slog.Logger) func(context.Context, json.RawMessage) (control.SweepResult, error) {
	return func(ctx context.Context, _ json.RawMessage) (control.SweepResult, error) {
		start := time.Now()
		res, err := s.Sweep(ctx)
		if g != nil && out != nil {
			if gs, err := g.Gauges(ctx, retention); err != nil {
				log.Warn("gauges not read", "error", err.Error())
			} else {
				out.Gauges(gs)
			}
		}
		attrs := []any{"workers", res.Workers, "lost_workers", res.Lost, "requeued", res.Requeued,
			"duration_ms", time.Since(start).Milliseconds()}
		if err != nil {
			log.Error("sweep failed", append(attrs, "error", err.Error())...)
			return res, fmt.Errorf("sweep: %w", err)
		}
		log.Info("sweep", attrs...)
		return res, nil
	}
}
