package main

import (
	"cmp"
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

// maxPages bounds --all: a control plane that keeps answering cursors (a
// bug, or a table growing faster than we read) must not keep us forever.
const maxPages = 10000

func newLsCmd(o *clientOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ls invocations|workers|hosts",
		Short: "List invocations, workers, or the hosts the provisioner launched",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("say what to list: lakeshore ls invocations, lakeshore ls workers, or lakeshore ls hosts")
		},
	}
	cmd.AddCommand(newLsInvocationsCmd(o), newLsWorkersCmd(o), newLsHostsCmd(o))
	return cmd
}

type pageOptions struct {
	limit  int
	cursor string
	all    bool
}

func (p *pageOptions) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.IntVar(&p.limit, "limit", 0, "page size (default: the control plane's, 100)")
	f.StringVar(&p.cursor, "cursor", "", "start at this cursor (the next_cursor of an earlier page)")
	f.BoolVarP(&p.all, "all", "A", false, "follow next_cursor until the last page")
}

func newLsInvocationsCmd(o *clientOptions) *cobra.Command {
	var p pageOptions
	var queue, state string
	cmd := &cobra.Command{
		Use:     "invocations",
		Aliases: []string{"invocation", "inv", "invs"},
		Short:   "List invocations, optionally of one queue and state",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			params := client.ListInvocationsParams{Queue: queue, State: state, Limit: p.limit, Cursor: p.cursor}
			list, err := listInvocations(cmd.Context(), c, params, p.all)
			if err != nil {
				return err
			}
			if o.json() {
				return printJSON(cmd.OutOrStdout(), list)
			}
			invs := slices.Clone(list.Invocations)
			// ULIDs sort by creation time: oldest first, as the queue runs.
			slices.SortFunc(invs, func(a, b wire.Invocation) int { return cmp.Compare(a.InvocationID, b.InvocationID) })
			if err := invocationTable(cmd.OutOrStdout(), invs, time.Now()); err != nil {
				return err
			}
			moreHint(cmd, list.NextCursor)
			return nil
		},
	}
	p.register(cmd)
	cmd.Flags().StringVarP(&queue, "queue", "q", "", "only this queue")
	cmd.Flags().StringVar(&state, "state", "", "only this state: queued, running, succeeded, failed or cancelled")
	return cmd
}

func newLsWorkersCmd(o *clientOptions) *cobra.Command {
	var p pageOptions
	var state, label string
	cmd := &cobra.Command{
		Use:     "workers",
		Aliases: []string{"worker", "wrk"},
		Short:   "List workers with their computed state, optionally of one state or label",
		Long: `List workers with the state the control plane computes for them now
(stale: silent past the stale window; gone: left, retired or its host
stopped). A gone worker leaves the list a day after it went gone; the
invocations it ran keep its id in their attempt history.

--state and --label filter each page the control plane reads, so a filtered
page may be short (or empty) and still have more after it: use --all.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			params := client.ListWorkersParams{State: state, Label: label, Limit: p.limit, Cursor: p.cursor}
			list, err := listWorkers(cmd.Context(), c, params, p.all)
			if err != nil {
				return err
			}
			if o.json() {
				return printJSON(cmd.OutOrStdout(), list)
			}
			ws := slices.Clone(list.Workers)
			if err := showHeld(cmd.Context(), c, ws); err != nil {
				return err
			}
			sortWorkers(ws)
			if err := workerTable(cmd.OutOrStdout(), ws, time.Now()); err != nil {
				return err
			}
			moreHint(cmd, list.NextCursor)
			return nil
		},
	}
	p.register(cmd)
	cmd.Flags().StringVar(&state, "state", "", "only this state: "+strings.Join(wire.WorkerStates, ", "))
	cmd.Flags().StringVar(&label, "label", "", "only workers with this label")
	return cmd
}

// moreHint tells the user (on stderr, so stdout stays a clean table) that
// the list goes on.
func moreHint(cmd *cobra.Command, cursor string) {
	if cursor != "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "more: --all, or --cursor %s\n", cursor)
	}
}

func sortWorkers(ws []wire.Worker) {
	slices.SortFunc(ws, func(a, b wire.Worker) int {
		return cmp.Or(cmp.Compare(a.Label, b.Label), cmp.Compare(a.WorkerID, b.WorkerID))
	})
}

// runningHeld counts the running invocations each worker holds, of queue
// ("": of every queue), in a listing of running invocations.
func runningHeld(running []wire.Invocation, queue string) map[string]int {
	held := map[string]int{}
	for _, inv := range running {
		if inv.State == wire.StateRunning && (queue == "" || inv.Queue == queue) {
			held[inv.WorkerID]++
		}
	}
	return held
}

// showHeld sets each worker's running count to the running invocations it
// holds now, the count the queues show, rather than the count it reported
// at its last poll (which lags each claim until the next poll). It reads
// the running invocations once, across every queue: a listing as long as
// the fleet's live work, where counting per worker would cost one query a
// worker.
func showHeld(ctx context.Context, c *client.Client, ws []wire.Worker) error {
	running, err := listInvocations(ctx, c, client.ListInvocationsParams{State: wire.StateRunning}, true)
	if err != nil {
		return fmt.Errorf("count the invocations each worker runs: %w", err)
	}
	held := runningHeld(running.Invocations, "")
	for i := range ws {
		ws[i].CurrentInvocations = held[ws[i].WorkerID]
	}
	return nil
}

// listInvocations reads one page, or with all every page from p.Cursor on,
// merged into one list without a cursor.
func listInvocations(ctx context.Context, c *client.Client, p client.ListInvocationsParams, all bool) (wire.InvocationList, error) {
	first, err := c.ListInvocations(ctx, p)
	if err != nil || !all {
		return first, err
	}
	out := wire.InvocationList{Invocations: first.Invocations}
	seen := map[string]bool{}
	for cursor := first.NextCursor; cursor != ""; {
		if seen[cursor] || len(seen) >= maxPages {
			return out, fmt.Errorf("list invocations: the control plane repeated cursor %q; stopping", cursor)
		}
		seen[cursor] = true
		p.Cursor = cursor
		page, err := c.ListInvocations(ctx, p)
		if err != nil {
			return out, err
		}
		out.Invocations = append(out.Invocations, page.Invocations...)
		cursor = page.NextCursor
	}
	if out.Invocations == nil {
		out.Invocations = []wire.Invocation{}
	}
	return out, nil
}

// listWorkers is listInvocations for workers.
func listWorkers(ctx context.Context, c *client.Client, params client.ListWorkersParams, all bool) (wire.WorkerList, error) {
	first, err := c.ListWorkersWhere(ctx, params)
	if err != nil || !all {
		return first, err
	}
	out := wire.WorkerList{Workers: first.Workers}
	seen := map[string]bool{}
	for cursor := first.NextCursor; cursor != ""; {
		if seen[cursor] || len(seen) >= maxPages {
			return out, fmt.Errorf("list workers: the control plane repeated cursor %q; stopping", cursor)
		}
		seen[cursor] = true
		params.Cursor = cursor
		page, err := c.ListWorkersWhere(ctx, params)
		if err != nil {
			return out, err
		}
		out.Workers = append(out.Workers, page.Workers...)
		cursor = page.NextCursor
	}
	if out.Workers == nil {
		out.Workers = []wire.Worker{}
	}
	return out, nil
}

func newLsHostsCmd(o *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:     "hosts",
		Aliases: []string{"host"},
		Short:   "List the hosts the provisioner launched or tried to, newest first, and why",
		Long: `List every host the provisioner launched, or tried to (docs/provision.md):
the queue and host key it serves, its state (reserved, launched, failed,
ended), its EC2 instance and how it was bought, its age, and why: what
launched it, EC2's refusal, or why it was let go.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			list, err := c.ListHosts(cmd.Context())
			if err != nil {
				return err
			}
			if o.json() {
				return printJSON(cmd.OutOrStdout(), list)
			}
			return hostTable(cmd.OutOrStdout(), list.Hosts, time.Now())
		},
	}
}
