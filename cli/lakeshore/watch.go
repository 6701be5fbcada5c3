package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

type watchOptions struct {
	queue     string
	interval  time.Duration
	untilDone bool
}

func newWatchCmd(o *clientOptions) *cobra.Command {
	var w watchOptions
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Print a queue's counts and its workers' load once per interval",
		Long: `Print one status line per interval: the queue's invocation counts by state,
its done_count (terminal transitions, each counted once), and for each worker
serving it, its state and running/max (the running invocations it holds
now, of every queue). With --output json, one JSON object
per interval instead.

With --until-done, exit 0 once nothing is queued or running and at least one
invocation has finished; interrupted before then, exit 1.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runWatch(cmd, o, w)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&w.queue, "queue", "q", "default", "queue to watch")
	f.DurationVar(&w.interval, "interval", time.Second, "time between status lines")
	f.BoolVar(&w.untilDone, "until-done", false, "exit once the queue is empty and something has finished")
	return cmd
}

// watchSnapshot is one tick of `lakeshore watch`.
type watchSnapshot struct {
	Time    time.Time       `json:"time"`
	Queue   wire.QueueStats `json:"queue"`
	Workers []watchWorker   `json:"workers"`
}

// watchWorker is one worker's load as watch shows it: running/max as every
// view shows it, the running invocations the worker holds now, of every
// queue (the same listing the queue's running count comes from, so the
// two agree).
type watchWorker struct {
	WorkerID       string `json:"worker_id"`
	Label          string `json:"label,omitempty"`
	State          string `json:"state"`
	Running        int    `json:"running"`
	MaxConcurrency int    `json:"max_concurrency"`
}

// done reports whether the queue has drained: nothing queued or running,
// and something finished (so an empty queue before the first submit does
// not count).
func (s watchSnapshot) done() bool {
	c := s.Queue.Counts
	return c[wire.StateQueued]+c[wire.StateRunning] == 0 && s.Queue.DoneCount > 0
}

// line renders s as one compact status line.
func (s watchSnapshot) line() string {
	var b strings.Builder
	c := s.Queue.Counts
	fmt.Fprintf(&b, "%s queue=%s queued=%d running=%d succeeded=%d failed=%d cancelled=%d done=%d |",
		s.Time.Local().Format(time.TimeOnly), s.Queue.Queue, c[wire.StateQueued], c[wire.StateRunning],
		c[wire.StateSucceeded], c[wire.StateFailed], c[wire.StateCancelled], s.Queue.DoneCount)
	if len(s.Workers) == 0 {
		b.WriteString(" no workers")
	}
	for _, w := range s.Workers {
		b.WriteString(" " + w.WorkerID)
		if w.Label != "" {
			b.WriteString("(" + cell(w.Label) + ")")
		}
		fmt.Fprintf(&b, " %s %d/%d", w.State, w.Running, w.MaxConcurrency)
	}
	return b.String()
}

func runWatch(cmd *cobra.Command, o *clientOptions, w watchOptions) error {
	if w.interval <= 0 {
		return errors.New("--interval must be positive")
	}
	if !wire.ValidQueue(w.queue) {
		return fmt.Errorf("--queue %q is not a valid queue name", w.queue)
	}
	c, err := o.client()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	tick := time.NewTicker(w.interval)
	defer tick.Stop()
	for {
		snap, err := takeSnapshot(ctx, c, w.queue)
		switch {
		case err == nil:
			if o.json() {
				if err := printJSON(stdout, snap); err != nil {
					return err
				}
			} else if _, err := fmt.Fprintln(stdout, snap.line()); err != nil {
				return err
			}
			if w.untilDone && snap.done() {
				return nil
			}
		case ctx.Err() != nil:
		case client.Retryable(err):
			// The control plane may be restarting; keep watching.
			fmt.Fprintf(stderr, "%s %v\n", time.Now().Format(time.TimeOnly), err)
		default:
			return err
		}
		select {
		case <-ctx.Done():
			if w.untilDone {
				return fmt.Errorf("stopped watching before queue %s was done: %w", w.queue, context.Cause(ctx))
			}
			return nil // Ctrl-C is how a plain watch ends
		case <-tick.C:
		}
	}
}

// takeSnapshot reads the queue's counts, its running invocations and the
// workers, and joins them.
func takeSnapshot(ctx context.Context, c *client.Client, queue string) (watchSnapshot, error) {
	now := time.Now()
	stats, err := c.QueueStats(ctx, queue)
	if err != nil {
		return watchSnapshot{}, err
	}
	running, err := listInvocations(ctx, c, client.ListInvocationsParams{State: wire.StateRunning}, true)
	if err != nil {
		return watchSnapshot{}, err
	}
	workers, err := listWorkers(ctx, c, client.ListWorkersParams{}, true)
	if err != nil {
		return watchSnapshot{}, err
	}
	held, here := runningHeld(running.Invocations, ""), runningHeld(running.Invocations, queue)
	snap := watchSnapshot{Time: now, Queue: stats, Workers: []watchWorker{}}
	sortWorkers(workers.Workers)
	for _, wk := range workers.Workers {
		serves := len(wk.Lanes) == 0 || slices.Contains(wk.Lanes, queue)
		if here[wk.WorkerID] == 0 && (wk.State == "gone" || !serves) {
			continue
		}
		snap.Workers = append(snap.Workers, watchWorker{
			WorkerID: wk.WorkerID, Label: wk.Label, State: wk.State,
			Running: held[wk.WorkerID], MaxConcurrency: wk.MaxConcurrency,
		})
	}
	return snap, nil
}
