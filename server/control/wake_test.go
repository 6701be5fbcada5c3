package control_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/server/wake"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// blockSleep never ends a wait by itself: only a wake or the poll's end
// does. A long poll that answers under it was woken.
func blockSleep(ctx context.Context, _ time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

// wakeFixture is the use cases over the embedded store with a wake hub and
// long polls on, whose re-check never fires (blockSleep), and a hello for
// a worker of queue q.
type wakeFixture struct {
	ctx context.Context
	svc *control.Service
	hub *wake.Hub
}

func newWakeFixture(t *testing.T) wakeFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	st, _ := storetest.Store(t)
	hub := &wake.Hub{}
	svc := control.New(control.Config{Store: st, Sleep: blockSleep, Wake: hub, LongPoll: true,
		Logger: slog.New(slog.DiscardHandler)})
	return wakeFixture{ctx: ctx, svc: svc, hub: hub}
}

func (f wakeFixture) hello(t *testing.T, machine string) string {
	t.Helper()
	resp, err := f.svc.Hello(f.ctx, wire.HelloRequest{MachineID: machine, BootID: "b", Lanes: []string{"q"}}.Registration(),
		func(string) (string, error) { return "hash", nil })
	if err != nil || !resp.LongPoll {
		t.Fatalf("hello: %+v %v; want long polls offered for the poll interval", resp, err)
	}
	return resp.Worker.ID
}

// TestLongPollIsWoken: a long poll waiting for work is answered the moment
// a submit or a hand-back makes work it may claim, with no re-check timer
// (its Sleep never returns by itself); one new invocation wakes one waiting
// poll, not all of them.
func TestLongPollIsWoken(t *testing.T) {
	f := newWakeFixture(t)
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	svc, hub := f.svc, f.hub
	hello := func(m string) string { return f.hello(t, m) }
	type answer struct {
		worker string
		cmds   []domain.Command
		err    error
	}
	answers := make(chan answer, 3)
	longPoll := func(id string) {
		resp, err := svc.Poll(ctx, wire.PollRequest{WorkerID: id, Queue: "q", Phase: wire.PhaseReady,
			Invocations: []string{}, TimeoutS: 15}.Poll(), nil)
		answers <- answer{id, resp, err}
	}
	waitFor := func(n int) {
		t.Helper()
		for hub.Waiting(wake.Key("q", "")) != n {
			select {
			case a := <-answers:
				t.Fatalf("a poll answered %+v (%v) before it was woken", a.cmds, a.err)
			case <-ctx.Done():
				t.Fatalf("%d polls waiting, want %d", hub.Waiting(wake.Key("q", "")), n)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	next := func() answer {
		t.Helper()
		select {
		case a := <-answers:
			if a.err != nil {
				t.Fatalf("poll of %s: %v", a.worker, a.err)
			}
			return a
		case <-ctx.Done():
			t.Fatal("no waiting poll was woken")
			return answer{}
		}
	}

	workers := []string{hello("m1"), hello("m2"), hello("m3")}
	for _, id := range workers {
		go longPoll(id)
	}
	waitFor(3)
	inv, _, err := svc.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}, MaxAttempts: 3}.Spec())
	if err != nil {
		t.Fatal(err)
	}
	first := next()
	if len(first.cmds) != 1 || first.cmds[0].Run.ID != inv.ID {
		t.Fatalf("the woken poll answered %+v, want a run of %s", first.cmds, inv.ID)
	}
	waitFor(2) // the others still wait: one invocation woke one poll

	// Its worker says bye holding it: the hand-back wakes another.
	if _, err := svc.Bye(ctx, wire.ByeRequest{WorkerID: first.worker, Reason: wire.ByeSignal}.Bye(), nil); err != nil {
		t.Fatal(err)
	}
	second := next()
	if len(second.cmds) != 1 || second.cmds[0].Run.ID != inv.ID || second.cmds[0].Run.Attempt != 2 {
		t.Fatalf("after the bye, the woken poll answered %+v, want attempt 2 of %s", second.cmds, inv.ID)
	}
	if second.worker == first.worker {
		t.Fatalf("the gone worker %s was handed its own work back", first.worker)
	}
	waitFor(1)
	cancel() // the last poll's client goes away: it answers nothing
	if a := <-answers; len(a.cmds) != 0 {
		t.Fatalf("a poll whose client went away answered %+v", a.cmds)
	}
}

// TestLongPollHoldsThroughAFinishedCancel: a daemon lists an invocation
// whose ack it has sent, until the answer comes; the control plane answers
// "cancel, superseded" for it once it is finished. That news must not cut
// the daemon's next long poll short (an idle daemon whose poll returned at
// once would wait a whole interval before it polled again): the poll still
// waits, is woken by the next submit, and carries both.
func TestLongPollHoldsThroughAFinishedCancel(t *testing.T) {
	f := newWakeFixture(t)
	ctx, svc, hub := f.ctx, f.svc, f.hub
	worker := f.hello(t, "m")
	first, _, err := svc.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}, MaxAttempts: 3}.Spec())
	if err != nil {
		t.Fatal(err)
	}
	poll := func(inflight []string, timeoutS float64) ([]domain.Command, error) {
		// As nymph does: it lists what it runs or still acks, and says
		// how many bodies run.
		return svc.Poll(ctx, wire.PollRequest{WorkerID: worker, Queue: "q", Phase: wire.PhaseReady,
			Invocations: inflight, TimeoutS: timeoutS,
			UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: ptr(1), CurrentInvocations: ptr(0)}}.Poll(), nil)
	}
	if resp, err := poll([]string{}, 0); err != nil || len(resp) != 1 {
		t.Fatalf("claim: %+v %v", resp, err)
	}
	code := 0
	if _, err := svc.Ack(ctx, wire.AckRequest{WorkerID: worker, InvocationID: first.ID, Attempt: 1,
		State: wire.StateSucceeded, ExitCode: &code}.Outcome(), nil); err != nil {
		t.Fatal(err)
	}

	answered := make(chan []domain.Command, 1)
	go func() {
		resp, err := poll([]string{first.ID}, 15) // its ack's answer not in yet
		if err != nil {
			t.Error(err)
		}
		answered <- resp
	}()
	for hub.Waiting(wake.Key("q", "")) != 1 {
		select {
		case resp := <-answered:
			t.Fatalf("the long poll answered %+v at once instead of waiting", resp)
		case <-ctx.Done():
			t.Fatal("the long poll never waited")
		case <-time.After(5 * time.Millisecond):
		}
	}
	next, _, err := svc.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}, MaxAttempts: 3}.Spec())
	if err != nil {
		t.Fatal(err)
	}
	resp := <-answered
	var cancelled, run bool
	for _, c := range resp {
		cancelled = cancelled || (c.Type == wire.CommandCancel && c.InvocationID == first.ID && c.Reason == wire.CancelSuperseded)
		run = run || (c.Type == wire.CommandRun && c.Run.ID == next.ID)
	}
	if !cancelled || !run {
		t.Fatalf("the woken poll answered %+v; want the finished one's cancel and a run of %s", resp, next.ID)
	}
}

// TestLongPollEndsOnItsWorkersNews: a drain or a setup command for a
// worker whose poll is held ends that poll at once (its re-check never
// fires here), and the next poll carries the command.
func TestLongPollEndsOnItsWorkersNews(t *testing.T) {
	f := newWakeFixture(t)
	for _, tc := range []struct {
		name string
		news func(workerID string) error
		want string
	}{
		{"setup", func(id string) error { _, err := f.svc.AddSetup(f.ctx, id, []string{"true"}); return err }, wire.CommandSetup},
		{"drain", func(id string) error { _, err := f.svc.Drain(f.ctx, id); return err }, wire.CommandDrain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := f.hello(t, "m-"+tc.name)
			poll := func(timeoutS float64) ([]domain.Command, error) {
				resp, err := f.svc.Poll(f.ctx, wire.PollRequest{WorkerID: id, Queue: "q", Phase: wire.PhaseReady,
					Invocations: []string{}, TimeoutS: timeoutS,
					UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: ptr(1), CurrentInvocations: ptr(0)}}.Poll(), nil)
				return resp, err
			}
			answered := make(chan error, 1)
			go func() { _, err := poll(15); answered <- err }()
			for f.hub.Waiting(wake.WorkerKey(id)) != 1 {
				select {
				case err := <-answered:
					t.Fatalf("the long poll answered (%v) before it waited", err)
				case <-f.ctx.Done():
					t.Fatal("the long poll never waited")
				case <-time.After(5 * time.Millisecond):
				}
			}
			if err := tc.news(id); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-answered:
				if err != nil {
					t.Fatal(err)
				}
			case <-f.ctx.Done():
				t.Fatalf("the held poll did not end on the %s", tc.name)
			}
			cmds, err := poll(0)
			if err != nil || !slices.ContainsFunc(cmds, func(c domain.Command) bool { return c.Type == tc.want }) {
				t.Fatalf("the next poll answered %+v (%v); want a %s command", cmds, err, tc.want)
			}
		})
	}
}

// countedLongPolls is a long-polling service over a new embedded store whose
// requests counter counts, with a wake hub, and a hello for worker m of
// queue q; sleep is its Sleep.
func countedLongPolls(t *testing.T, ctx context.Context, sleep func(context.Context, time.Duration) error) (*control.Service, *wake.Hub, *storetest.Counter, string) {
	t.Helper()
	db := storetest.Embedded(t)
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(ctx, db, prefix); err != nil {
		t.Fatal(err)
	}
	counter := &storetest.Counter{}
	hub := &wake.Hub{}
	svc := control.New(control.Config{Store: store.New(storetest.CountingClient(db, counter), prefix), Wake: hub,
		LongPoll: true, Logger: slog.New(slog.DiscardHandler), Sleep: sleep})
	hello, err := svc.Hello(ctx, wire.HelloRequest{MachineID: "m", BootID: "b", Lanes: []string{"q"}}.Registration(),
		func(string) (string, error) { return "hash", nil })
	if err != nil {
		t.Fatal(err)
	}
	counter.Reset()
	return svc, hub, counter, hello.Worker.ID
}

// TestLongPollWokenForWorkReadsTheRowOnce: a held poll woken by a submit
// claims without reading the worker row first; the hand-out's read (is the
// worker retired?) is the one read after the heartbeat's.
func TestLongPollWokenForWorkReadsTheRowOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	svc, hub, counter, id := countedLongPolls(t, ctx, blockSleep)
	// What a submit reads, with nobody to wake.
	if _, _, err := svc.Submit(ctx, wire.SubmitRequest{Queue: "other", Argv: []string{"true"}}.Spec()); err != nil {
		t.Fatal(err)
	}
	submitGets := counter.Get("GetItem")
	counter.Reset()
	answered := make(chan []domain.Command, 1)
	go func() {
		cmds, err := svc.Poll(ctx, wire.PollRequest{WorkerID: id, Queue: "q", Phase: wire.PhaseReady,
			Invocations: []string{}, TimeoutS: 15}.Poll(), nil)
		if err != nil {
			t.Error(err)
		}
		answered <- cmds
	}()
	for hub.Waiting(wake.Key("q", "")) != 1 {
		select {
		case <-ctx.Done():
			t.Fatal("the long poll never waited")
		case <-time.After(5 * time.Millisecond):
		}
	}
	if _, _, err := svc.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}}.Spec()); err != nil {
		t.Fatal(err)
	}
	if cmds := <-answered; len(cmds) != 1 || cmds[0].Type != wire.CommandRun {
		t.Fatalf("woken poll answered %+v; want one run", cmds)
	}
	if got := counter.Get("GetItem") - submitGets; got != 2 {
		t.Errorf("a held poll woken for work read the worker row %d times (%v); want 2: its heartbeat and its hand-out", got, counter.Snapshot())
	}
}

// TestLongPollRecheckReadsOnlyTheClaimIndex: where long polls are offered
// this process wakes a held poll for its worker's news, so a re-check on
// the clock (no wake) reads only the claim index, for work another process
// made, not the worker's row: an idle fleet's held polls are most of what
// it asks of the store.
func TestLongPollRecheckReadsOnlyTheClaimIndex(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sleeps := 0
	svc, _, counter, id := countedLongPolls(t, ctx, func(context.Context, time.Duration) error { sleeps++; return nil })
	cmds, err := svc.Poll(ctx, wire.PollRequest{WorkerID: id, Queue: "q", Phase: wire.PhaseReady,
		Invocations: []string{}, TimeoutS: 15}.Poll(), nil)
	if err != nil || len(cmds) != 0 {
		t.Fatalf("held poll = %+v, %v; want nothing after its hold", cmds, err)
	}
	if sleeps < 2 {
		t.Fatalf("the hold re-checked %d times; want a few (every 5 s of 15 s)", sleeps)
	}
	got := counter.Snapshot()
	if got["GetItem"] != 1 {
		t.Errorf("a held poll with %d re-checks read the worker row %d times (%v); want once, for its heartbeat", sleeps, got["GetItem"], got)
	}
	if got["Query"] < sleeps+1 {
		t.Errorf("a held poll with %d re-checks made %d queries (%v); want the claim index read at each", sleeps, got["Query"], got)
	}
}
