package tests

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

func intp(n int) *int { return &n }

// hello enrolls a daemon and returns a client holding its worker token.
func hello(t *testing.T, d *devServer, machine, boot string, capacity int) (*client.Client, string) {
	t.Helper()
	res, err := d.Enroll().Hello(context.Background(), wire.HelloRequest{
		MachineID: machine, BootID: boot, Label: machine,
		Capabilities: wire.Capabilities{MaxConcurrency: intp(capacity)},
	})
	if err != nil {
		t.Fatalf("hello %s/%s: %v", machine, boot, err)
	}
	return client.New(d.URL, res.Token), res.WorkerID
}

func commandsOf(resp wire.PollResponse, typ string) []wire.Command {
	var out []wire.Command
	for _, c := range resp.Commands {
		if c.Type == typ {
			out = append(out, c)
		}
	}
	return out
}

// TestEndToEnd walks every route through the real `lakeshore dev` binary,
// once on the embedded store and once on moto_server.
func TestEndToEnd(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			d := startDev(t, b, "--stale-after", "60s")
			op := d.Operator()

			// hello → first poll without a phase: joining → active.
			wc, wid := hello(t, d, "machine-a", "boot-1", 2)
			if w, err := op.GetWorker(ctx, wid); err != nil || w.State != "joining" {
				t.Fatalf("after hello: state %q, err %v; want joining", w.State, err)
			}
			if _, err := wc.Poll(ctx, wire.PollRequest{WorkerID: wid, Queue: "q"}); err != nil {
				t.Fatalf("first poll: %v", err)
			}
			if w, _ := op.GetWorker(ctx, wid); w.State != "active" {
				t.Fatalf("after first poll: state %q, want active", w.State)
			}

			// Submit, then a poll in phase setup claims nothing.
			inv, created, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"echo", "hi"}, IdempotencyKey: "k1"})
			if err != nil || !created || inv.State != wire.StateQueued {
				t.Fatalf("submit: %+v created=%v err=%v", inv, created, err)
			}
			again, created, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"echo", "hi"}, IdempotencyKey: "k1"})
			if err != nil || created || again.InvocationID != inv.InvocationID {
				t.Fatalf("idempotent replay: %+v created=%v err=%v", again, created, err)
			}
			resp, err := wc.Poll(ctx, wire.PollRequest{WorkerID: wid, Queue: "q", Phase: wire.PhaseSetup})
			if err != nil || len(commandsOf(resp, wire.CommandRun)) != 0 {
				t.Fatalf("poll in setup: %+v err=%v; want no run command", resp, err)
			}
			if w, _ := op.GetWorker(ctx, wid); w.State != "setting_up" {
				t.Fatalf("phase setup: state %q, want setting_up", w.State)
			}

			// Ready claims it.
			resp, err = wc.Poll(ctx, wire.PollRequest{WorkerID: wid, Queue: "q", Phase: wire.PhaseReady})
			runs := commandsOf(resp, wire.CommandRun)
			if err != nil || len(runs) != 1 || runs[0].Invocation.InvocationID != inv.InvocationID || runs[0].Invocation.Attempt != 1 {
				t.Fatalf("ready poll: %+v err=%v; want the one run command, attempt 1", resp, err)
			}
			if got, _ := op.GetInvocation(ctx, inv.InvocationID); got.State != wire.StateRunning || got.WorkerID != wid {
				t.Fatalf("claimed invocation: %+v", got)
			}

			// First ack wins; the duplicate is recorded false; done_count moves once.
			ack := wire.AckRequest{WorkerID: wid, InvocationID: inv.InvocationID, Attempt: 1, State: wire.StateSucceeded,
				ExitCode: intp(0), ResultBlob: []byte(`{"score":0.9}`), StdoutTail: "hi\n"}
			if r, err := wc.Ack(ctx, ack); err != nil || !r.Recorded || r.State != wire.StateSucceeded {
				t.Fatalf("first ack: %+v err=%v", r, err)
			}
			ack.State = wire.StateFailed
			if r, err := wc.Ack(ctx, ack); err != nil || r.Recorded || r.State != wire.StateSucceeded {
				t.Fatalf("duplicate ack: %+v err=%v; want recorded false, state succeeded", r, err)
			}
			got, _ := op.GetInvocation(ctx, inv.InvocationID)
			if got.State != wire.StateSucceeded || string(got.ResultBlob) != `{"score":0.9}` || got.FinishedAt == nil {
				t.Fatalf("finished invocation: %+v", got)
			}
			if st, _ := op.QueueStats(ctx, "q"); st.DoneCount != 1 || st.Counts[wire.StateSucceeded] != 1 {
				t.Fatalf("queue stats: %+v; want done_count 1", st)
			}

			// Operator cancel: queued at once; running through the worker's next poll.
			queued, _, _ := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"sleep", "1"}})
			if c, err := op.CancelInvocation(ctx, queued.InvocationID); err != nil || c.State != wire.StateCancelled {
				t.Fatalf("cancel queued: %+v err=%v", c, err)
			}
			running, _, _ := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"sleep", "60"}})
			resp, _ = wc.Poll(ctx, wire.PollRequest{WorkerID: wid, Queue: "q", Phase: wire.PhaseReady})
			if len(commandsOf(resp, wire.CommandRun)) != 1 {
				t.Fatalf("claim for cancel: %+v", resp)
			}
			if c, err := op.CancelInvocation(ctx, running.InvocationID); err != nil || !c.CancelRequested {
				t.Fatalf("cancel running: %+v err=%v", c, err)
			}
			resp, _ = wc.Poll(ctx, wire.PollRequest{WorkerID: wid, Queue: "q", Phase: wire.PhaseReady,
				Invocations: []string{running.InvocationID}, UpdatedCapabilities: &wire.Capabilities{CurrentInvocations: intp(1)}})
			if cs := commandsOf(resp, wire.CommandCancel); len(cs) != 1 || cs[0].InvocationID != running.InvocationID {
				t.Fatalf("poll after cancel: %+v; want a cancel command", resp)
			}
			if r, err := wc.Ack(ctx, wire.AckRequest{WorkerID: wid, InvocationID: running.InvocationID, Attempt: 1,
				State: wire.StateCancelled, ExitCode: intp(-1)}); err != nil || !r.Recorded {
				t.Fatalf("ack cancelled: %+v err=%v", r, err)
			}

			// Setup FIFO: the command goes out, claims stop until it is reported.
			setup, err := op.AddSetup(ctx, wid, []string{"true"})
			if err != nil {
				t.Fatalf("add setup: %v", err)
			}
			op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}})
			resp, _ = wc.Poll(ctx, wire.PollRequest{WorkerID: wid, Queue: "q", Phase: wire.PhaseReady})
			if cs := commandsOf(resp, wire.CommandSetup); len(cs) != 1 || cs[0].CommandID != setup.CommandID || len(commandsOf(resp, wire.CommandRun)) != 0 {
				t.Fatalf("poll with setup pending: %+v; want the setup command and no run", resp)
			}
			resp, _ = wc.Poll(ctx, wire.PollRequest{WorkerID: wid, Queue: "q", Phase: wire.PhaseReady,
				SetupResults: []wire.SetupResult{{CommandID: setup.CommandID, Status: wire.SetupSucceeded, DurationMS: 12, OutputTail: "ok"}}})
			if len(commandsOf(resp, wire.CommandSetup)) != 0 || len(commandsOf(resp, wire.CommandRun)) != 1 {
				t.Fatalf("poll after setup reported: %+v; want a run and no setup", resp)
			}
			sr, err := op.SetupResults(ctx, wid)
			if err != nil || len(sr.SetupResults) != 1 || sr.SetupResults[0].Status != wire.SetupSucceeded || sr.SetupResults[0].DurationMS != 12 {
				t.Fatalf("setup results: %+v err=%v", sr, err)
			}

			// Listing.
			list, err := op.ListInvocations(ctx, client.ListInvocationsParams{Queue: "q"})
			if err != nil || len(list.Invocations) != 4 {
				t.Fatalf("list by queue: %d invocations, err %v; want 4", len(list.Invocations), err)
			}
			list, err = op.ListInvocations(ctx, client.ListInvocationsParams{Queue: "q", State: wire.StateCancelled})
			if err != nil || len(list.Invocations) != 2 {
				t.Fatalf("list cancelled: %d, err %v; want 2", len(list.Invocations), err)
			}
			page, err := op.ListInvocations(ctx, client.ListInvocationsParams{Limit: 1})
			if err != nil || len(page.Invocations) != 1 || page.NextCursor == "" {
				t.Fatalf("paged list: %+v err=%v", page, err)
			}

			// A new boot of the same machine retires the old worker and hands its
			// running invocation back at once.
			_, wid2 := hello(t, d, "machine-a", "boot-2", 1)
			if w, _ := op.GetWorker(ctx, wid); w.State != "gone" {
				t.Fatalf("old boot's worker: state %q, want gone", w.State)
			}
			if q, _ := op.QueueStats(ctx, "q"); q.Counts[wire.StateQueued] != 1 || q.Counts[wire.StateRunning] != 0 {
				t.Fatalf("after new boot: %+v; want the running invocation queued again", q)
			}
			if _, err := wc.Poll(ctx, wire.PollRequest{WorkerID: wid, Queue: "q"}); !errors.Is(err, wire.ErrWorkerGone) {
				t.Fatalf("old boot's poll: %v, want 410 worker_gone", err)
			}

			// Drain: the next poll carries a drain command and claims nothing.
			wc2, _ := hello(t, d, "machine-a", "boot-2", 1) // a retried hello: same worker, new token
			if _, err := op.DrainWorker(ctx, wid2); err != nil {
				t.Fatalf("drain: %v", err)
			}
			resp, _ = wc2.Poll(ctx, wire.PollRequest{WorkerID: wid2, Queue: "q", Phase: wire.PhaseReady})
			if len(commandsOf(resp, wire.CommandDrain)) != 1 || len(commandsOf(resp, wire.CommandRun)) != 0 {
				t.Fatalf("poll after drain: %+v; want drain and no run", resp)
			}

			// bye → gone at once; the next poll gets 410.
			if err := wc2.Bye(ctx, wire.ByeRequest{WorkerID: wid2, Reason: wire.ByeDrain}); err != nil {
				t.Fatalf("bye: %v", err)
			}
			if _, err := wc2.Poll(ctx, wire.PollRequest{WorkerID: wid2, Queue: "q"}); !errors.Is(err, wire.ErrWorkerGone) {
				t.Fatalf("poll after bye: %v, want 410 worker_gone", err)
			}
			ws, err := op.ListWorkers(ctx, 10, "")
			if err != nil || len(ws.Workers) != 2 || !slices.ContainsFunc(ws.Workers, func(w wire.Worker) bool { return w.WorkerID == wid2 && w.State == "gone" }) {
				t.Fatalf("workers: %+v err=%v", ws, err)
			}
		})
	}
}
