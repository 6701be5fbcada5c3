package control

import (
	"context"
	"time"

	"github.com/dreamlake/lakeshore/server/metrics"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// Gauges reads the control plane's state for the metrics (docs/metrics.md):
// per queue, its counts by state and how long its oldest queued invocation
// has waited; per fleet, workers by the state they read now, those that
// left the list after the worker retention left out. It reads every queue,
// every run (a page at a time) and the listed workers (the roster index):
// call it on a scrape or a schedule, never on the request path.
func (s *Service) Gauges(ctx context.Context, retention time.Duration) (metrics.Gauges, error) {
	now := s.clock.Now().UTC()
	g := metrics.Gauges{Workers: map[domain.WorkerState]int{}, Runs: map[domain.RunState]int{}}
	queues, err := s.store.Queues(ctx)
	if err != nil {
		return g, err
	}
	for _, q := range queues {
		st, err := s.store.QueueStats(ctx, q)
		if err != nil {
			return g, err
		}
		qg := metrics.QueueGauge{Queue: q, Counts: st.Counts}
		if oldest, ok, err := s.store.OldestQueued(ctx, q); err != nil {
			return g, err
		} else if ok {
			qg.OldestQueuedAge = max(now.Sub(oldest), 0)
		}
		g.Queues = append(g.Queues, qg)
	}
	for cursor := ""; ; {
		runs, next, err := s.store.Runs(ctx, "", gaugeRunPage, cursor)
		if err != nil {
			return g, err
		}
		for _, r := range runs {
			g.Runs[r.State()]++
		}
		if cursor = next; cursor == "" {
			break
		}
	}
	err = s.store.EachListedWorker(ctx, "gauges", func(w domain.Worker) error {
		if domain.Listed(w, now, retention) {
			g.Workers[domain.Project(w, now, s.staleAfter)]++
		}
		return nil
	})
	return g, err
}

// gaugeRunPage is how many runs one read of the gauges' run count takes.
const gaugeRunPage = 500
