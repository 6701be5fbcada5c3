package api_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/api"
	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/api/daemonapi"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/cadence"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/hostkey"
	"github.com/dreamlake/lakeshore/shared/wire"
)

func intp(n int) *int { return &n }

// TestHappyPath walks one daemon through its whole life with one invocation.
func TestHappyPath(t *testing.T) {
	h := newHarness(t)
	w := h.hello("machine-1", "boot-1")

	// A poll without a phase (an old daemon) makes a joining worker active.
	if cmds := h.poll(w, wire.PollRequest{}); len(cmds) != 0 {
		t.Fatalf("first poll answered %+v with nothing queued", cmds)
	}
	if got := h.worker(w.id).State; got != "active" {
		t.Errorf("after a phase-less poll the worker reads %q, want active", got)
	}

	inv := h.submitReq(wire.SubmitRequest{
		Queue: "default", Argv: []string{"echo", "hello world"}, Env: map[string]string{"GREETING": "hi"},
		RunConfig: wire.RunConfig{RunSetup: []string{"mkdir -p out"}, Env: map[string]string{"RC": "1"}, Workdir: "job"},
		TimeoutS:  60,
	})
	if inv.State != wire.StateQueued || inv.Attempt != 0 || inv.MaxAttempts != wire.DefaultMaxAttempts {
		t.Errorf("submitted %+v, want queued, attempt 0, max_attempts 3", inv)
	}
	if inv.HostKey != "" {
		t.Errorf("no host setup but host_key %q", inv.HostKey)
	}
	if !strings.HasSuffix(inv.CreatedAt.Format(time.RFC3339Nano), "Z") || inv.CreatedAt.IsZero() {
		t.Errorf("created_at %v, want a UTC timestamp", inv.CreatedAt)
	}

	// Phase setup claims nothing, even with work queued.
	if cmds := h.poll(w, wire.PollRequest{Phase: wire.PhaseSetup, TimeoutS: 0}); len(cmds) != 0 {
		t.Fatalf("poll in phase setup answered %+v", cmds)
	}
	if got := h.worker(w.id).State; got != "setting_up" {
		t.Errorf("worker in phase setup reads %q, want setting_up", got)
	}
	if got := h.invocation(inv.InvocationID).State; got != wire.StateQueued {
		t.Errorf("invocation %s after a setup poll, want queued", got)
	}

	// Phase ready claims it.
	cmds := h.poll(w, wire.PollRequest{Phase: wire.PhaseReady})
	if len(cmds) != 1 || cmds[0].Type != wire.CommandRun {
		t.Fatalf("ready poll answered %+v, want one run command", cmds)
	}
	run := cmds[0].Invocation
	want := &wire.RunInvocation{
		InvocationID: inv.InvocationID, Attempt: 1, Argv: []string{"echo", "hello world"},
		Env:       map[string]string{"GREETING": "hi"},
		RunConfig: wire.RunConfig{RunSetup: []string{"mkdir -p out"}, Env: map[string]string{"RC": "1"}, Workdir: "job"},
		TimeoutS:  60,
	}
	if !jsonEqual(run, want) {
		t.Errorf("run command %+v, want %+v", run, want)
	}
	got := h.invocation(inv.InvocationID)
	if got.State != wire.StateRunning || got.WorkerID != w.id || got.Attempt != 1 || got.StartedAt == nil {
		t.Errorf("claimed invocation reads %+v", got)
	}
	if ww := h.worker(w.id); ww.State != "active" || ww.Phase != wire.PhaseReady {
		t.Errorf("worker reads state %q phase %q, want active/ready", ww.State, ww.Phase)
	}

	// Ack.
	ack := wire.AckRequest{InvocationID: inv.InvocationID, Attempt: 1, State: wire.StateSucceeded,
		ExitCode: intp(0), ResultBlob: json.RawMessage(`{"answer":42}`), StdoutTail: "hello world\n"}
	if resp := h.ack(w, ack); !resp.Recorded || resp.State != wire.StateSucceeded {
		t.Errorf("ack answered %+v, want recorded succeeded", resp)
	}
	done := h.invocation(inv.InvocationID)
	if done.State != wire.StateSucceeded || done.ExitCode == nil || *done.ExitCode != 0 ||
		string(done.ResultBlob) != `{"answer":42}` || done.StdoutTail != "hello world\n" ||
		done.WorkerID != w.id || done.FinishedAt == nil {
		t.Errorf("acked invocation reads %+v", done)
	}

	// A duplicate ack (a retry, or a different outcome) is a no-op.
	ack.State = wire.StateFailed
	ack.ExitCode = intp(1)
	if resp := h.ack(w, ack); resp.Recorded || resp.State != wire.StateSucceeded {
		t.Errorf("duplicate ack answered %+v, want recorded:false state succeeded", resp)
	}
	q := h.queue("default")
	if q.DoneCount != 1 || q.Counts[wire.StateSucceeded] != 1 || q.Counts[wire.StateQueued] != 0 || q.Queue != "default" {
		t.Errorf("queue stats %+v, want done_count 1, one succeeded", q)
	}

	// Bye, then the worker is gone for good.
	h.bye(w, wire.ByeIdle)
	h.pollResp(w, wire.PollRequest{}).wantError(t, 410, wire.CodeWorkerGone)
	gw := h.worker(w.id)
	if gw.State != "gone" || gw.StoredState != "gone" || !strings.Contains(gw.RetiredWhy, "idle") {
		t.Errorf("after bye the worker reads %+v, want gone with reason idle", gw)
	}
	// A second bye is harmless.
	h.bye(w, wire.ByeIdle)
}

// jsonEqual reports whether a and b marshal to the same JSON.
func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func TestHealthz(t *testing.T) {
	h := newHarness(t)
	var body wire.Health
	h.do("GET", "/v1/healthz", "", nil).want(t, 200, &body)
	if body.Status != "ok" {
		t.Errorf("healthz %+v", body)
	}
}

func TestHelloAnswersTiming(t *testing.T) {
	cases := []struct {
		name       string
		staleAfter time.Duration
		wantStale  float64
		wantPoll   float64
	}{
		{"default", 0, 60, 5},
		{"3s for tests", 3 * time.Second, 3, 0.5},
		{"long", 10 * time.Minute, 600, 5},
		{"30s", 30 * time.Second, 30, 5},
		{"12s", 12 * time.Second, 12, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *apitest.Config) { c.Control.StaleAfter = tc.staleAfter })
			w := h.hello("m", "b")
			if w.hello.StaleAfterS != tc.wantStale || w.hello.PollIntervalS != tc.wantPoll {
				t.Errorf("hello answered stale_after_s %v poll_interval_s %v, want %v and %v",
					w.hello.StaleAfterS, w.hello.PollIntervalS, tc.wantStale, tc.wantPoll)
			}
			if !strings.HasPrefix(w.token, "wtk_") {
				t.Errorf("token %q", w.token)
			}
		})
	}
}

func TestPollIntervalFunction(t *testing.T) {
	for stale, want := range map[time.Duration]time.Duration{
		3 * time.Second:  500 * time.Millisecond,
		60 * time.Second: 5 * time.Second,
		6 * time.Second:  time.Second,
	} {
		if got := cadence.Of(stale).Interval; got != want {
			t.Errorf("cadence.Of(%v).Interval = %v, want %v", stale, got, want)
		}
	}
}

func TestNewRefusesOpenConfig(t *testing.T) {
	h := newHarness(t)
	svc := storetest.Control(h.store)
	cases := []struct {
		name string
		cfg  api.Config
	}{
		{"no use cases", api.Config{Sessions: h.store, Config: daemonapi.Config{EnrollToken: "a", OperatorToken: "b"}}},
		{"no session store", api.Config{Config: daemonapi.Config{Control: svc, EnrollToken: "a", OperatorToken: "b"}}},
		{"no enrollment token", api.Config{Sessions: h.store, Config: daemonapi.Config{Control: svc, OperatorToken: "b"}}},
		{"no operator token", api.Config{Sessions: h.store, Config: daemonapi.Config{Control: svc, EnrollToken: "a"}}},
		{"same tokens", api.Config{Sessions: h.store, Config: daemonapi.Config{Control: svc, EnrollToken: "a", OperatorToken: "a"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := api.New(tc.cfg); err == nil {
				t.Error("New accepted the config")
			}
		})
	}
}

func TestIdempotentSubmit(t *testing.T) {
	h := newHarness(t)
	req := wire.SubmitRequest{Queue: "default", Argv: []string{"make", "all"}, IdempotencyKey: "build-17"}
	first := h.submitReq(req)

	var replay wire.Invocation
	h.do("POST", "/v1/invocations", operatorToken, req).want(t, 200, &replay)
	if replay.InvocationID != first.InvocationID {
		t.Errorf("replay made %s, want the first invocation %s", replay.InvocationID, first.InvocationID)
	}

	// A replay with max_attempts spelled out as its default is the same request.
	req3 := req
	req3.MaxAttempts = 3
	var replay3 wire.Invocation
	h.do("POST", "/v1/invocations", operatorToken, req3).want(t, 200, &replay3)
	if replay3.InvocationID != first.InvocationID {
		t.Errorf("replay with the default spelled out made %s", replay3.InvocationID)
	}

	other := req
	other.Argv = []string{"make", "clean"}
	h.unchanged(t, func() {
		h.do("POST", "/v1/invocations", operatorToken, other).wantError(t, 409, wire.CodeConflict)
	})

	var list wire.InvocationList
	h.do("GET", "/v1/invocations?queue=default", operatorToken, nil).want(t, 200, &list)
	if len(list.Invocations) != 1 {
		t.Errorf("%d invocations after replays, want 1", len(list.Invocations))
	}

	// Without a key, two submits are two invocations.
	a, b := h.submit("x"), h.submit("x")
	if a.InvocationID == b.InvocationID {
		t.Error("two keyless submits share an id")
	}
}

func TestCancelQueued(t *testing.T) {
	h := newHarness(t)
	inv := h.submit("sleep", "100")
	var got wire.Invocation
	h.do("POST", "/v1/invocations/"+inv.InvocationID+"/cancel", operatorToken, nil).want(t, 200, &got)
	if got.State != wire.StateCancelled {
		t.Errorf("cancel answered state %q, want cancelled", got.State)
	}
	if h.invocation(inv.InvocationID).State != wire.StateCancelled {
		t.Error("invocation does not read cancelled")
	}
	if q := h.queue("default"); q.DoneCount != 1 || q.Counts[wire.StateCancelled] != 1 {
		t.Errorf("queue stats %+v, want one cancelled, done_count 1", q)
	}
	// Nothing left to claim.
	w := h.hello("m", "b")
	if cmds := h.poll(w, wire.PollRequest{Phase: wire.PhaseReady}); len(cmds) != 0 {
		t.Errorf("a cancelled invocation was handed out: %+v", cmds)
	}
	// Cancelling a finished invocation is a conflict and changes nothing.
	h.unchanged(t, func() {
		h.do("POST", "/v1/invocations/"+inv.InvocationID+"/cancel", operatorToken, nil).wantError(t, 409, wire.CodeConflict)
	})
}

func TestCancelRunning(t *testing.T) {
	h := newHarness(t)
	w := h.hello("m", "b")
	inv := h.submit("sleep", "100")
	if got := runIDs(h.poll(w, wire.PollRequest{Phase: wire.PhaseReady})); !slices.Equal(got, []string{inv.InvocationID}) {
		t.Fatalf("claimed %v", got)
	}
	var got wire.Invocation
	h.do("POST", "/v1/invocations/"+inv.InvocationID+"/cancel", operatorToken, nil).want(t, 202, &got)
	if got.State != wire.StateRunning || !got.CancelRequested {
		t.Errorf("cancel of a running invocation answered %+v, want running with cancel_requested", got)
	}
	// Cancel again: still 202, idempotent.
	h.do("POST", "/v1/invocations/"+inv.InvocationID+"/cancel", operatorToken, nil).want(t, 202, nil)

	cmds := h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{inv.InvocationID},
		UpdatedCapabilities: &wire.Capabilities{CurrentInvocations: intp(1)}})
	cancels := ofType(cmds, wire.CommandCancel)
	if len(cancels) != 1 || cancels[0].InvocationID != inv.InvocationID {
		t.Fatalf("poll after cancel answered %+v, want a cancel for %s", cmds, inv.InvocationID)
	}
	raw := h.pollResp(w, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{inv.InvocationID},
		UpdatedCapabilities: &wire.Capabilities{CurrentInvocations: intp(1)}})
	if !strings.Contains(string(raw.body), `{"type":"cancel","invocation_id":"`+inv.InvocationID+`","reason":"operator"}`) {
		t.Errorf("cancel command on the wire: %s", raw.body)
	}

	if resp := h.ack(w, wire.AckRequest{InvocationID: inv.InvocationID, Attempt: 1, State: wire.StateCancelled}); !resp.Recorded || resp.State != wire.StateCancelled {
		t.Errorf("ack cancelled answered %+v", resp)
	}
	if q := h.queue("default"); q.DoneCount != 1 || q.Counts[wire.StateCancelled] != 1 {
		t.Errorf("queue stats %+v", q)
	}
}

// TestCancelForInvocationNotHeld checks that a daemon listing an invocation
// it does not hold (unknown, or someone else's) is told to stop it.
func TestCancelForInvocationNotHeld(t *testing.T) {
	h := newHarness(t)
	a, b := h.hello("ma", "b"), h.hello("mb", "b")
	inv := h.submit("sleep", "1")
	if got := runIDs(h.poll(a, wire.PollRequest{Phase: wire.PhaseReady})); len(got) != 1 {
		t.Fatalf("a claimed %v", got)
	}
	unknown := newID("inv")
	cmds := h.poll(b, wire.PollRequest{Phase: wire.PhaseSetup, Invocations: []string{inv.InvocationID, unknown}})
	var got []string
	for _, c := range ofType(cmds, wire.CommandCancel) {
		got = append(got, c.InvocationID)
	}
	slices.Sort(got)
	want := []string{inv.InvocationID, unknown}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("cancels %v, want %v", got, want)
	}
	if h.invocation(inv.InvocationID).State != wire.StateRunning {
		t.Error("b's poll disturbed a's invocation")
	}
}

func TestDrain(t *testing.T) {
	h := newHarness(t)
	w := h.hello("m", "b")
	h.poll(w, wire.PollRequest{Phase: wire.PhaseReady})
	var acc wire.DrainAccepted
	h.do("POST", "/v1/workers/"+w.id+"/drain", operatorToken, nil).want(t, 202, &acc)
	if acc.WorkerID != w.id || acc.State != "draining" {
		t.Errorf("drain answered %+v", acc)
	}
	h.submit("true")

	raw := h.pollResp(w, wire.PollRequest{Phase: wire.PhaseReady})
	var resp wire.PollResponse
	raw.want(t, 200, &resp)
	if len(resp.Commands) != 1 || resp.Commands[0].Type != wire.CommandDrain {
		t.Fatalf("poll after drain answered %s, want only a drain command", raw.body)
	}
	if !strings.Contains(string(raw.body), `{"type":"drain"}`) {
		t.Errorf("drain command on the wire: %s", raw.body)
	}
	// Phase ready does not undo the drain.
	if got := h.worker(w.id).State; got != "draining" {
		t.Errorf("worker reads %q after a ready poll, want draining", got)
	}
	// Once the daemon drains, no more drain commands and still no claims.
	if cmds := h.poll(w, wire.PollRequest{Phase: wire.PhaseDraining, TimeoutS: 0}); len(cmds) != 0 {
		t.Errorf("draining poll answered %+v", cmds)
	}
	// Drain twice is fine.
	h.do("POST", "/v1/workers/"+w.id+"/drain", operatorToken, nil).want(t, 202, nil)

	// A gone worker cannot be drained or given setup.
	h.bye(w, wire.ByeDrain)
	h.unchanged(t, func() {
		h.do("POST", "/v1/workers/"+w.id+"/drain", operatorToken, nil).wantError(t, 409, wire.CodeConflict)
		h.do("POST", "/v1/workers/"+w.id+"/setup", operatorToken, wire.SetupRequest{Argv: []string{"true"}}).wantError(t, 409, wire.CodeConflict)
	})
}

func TestSetupCommands(t *testing.T) {
	h := newHarness(t)
	w := h.hello("m", "b")
	h.poll(w, wire.PollRequest{Phase: wire.PhaseReady})
	inv := h.submit("true")

	var acc wire.SetupAccepted
	h.do("POST", "/v1/workers/"+w.id+"/setup", operatorToken, wire.SetupRequest{Argv: []string{"apt-get", "install", "-y", "jq"}}).want(t, 202, &acc)
	if !strings.HasPrefix(acc.CommandID, "cmd_") {
		t.Fatalf("setup answered %+v", acc)
	}
	var acc2 wire.SetupAccepted
	h.do("POST", "/v1/workers/"+w.id+"/setup", operatorToken, wire.SetupRequest{Argv: []string{"true"}}).want(t, 202, &acc2)

	// The FIFO goes out, in order, and nothing is claimed.
	for range 2 { // repeated until reported
		cmds := h.poll(w, wire.PollRequest{Phase: wire.PhaseReady})
		setups := ofType(cmds, wire.CommandSetup)
		if len(setups) != 2 || setups[0].CommandID != acc.CommandID || setups[1].CommandID != acc2.CommandID ||
			!slices.Equal(setups[0].Argv, []string{"apt-get", "install", "-y", "jq"}) {
			t.Fatalf("poll answered %+v, want both setup commands in order", cmds)
		}
		if runs := ofType(cmds, wire.CommandRun); len(runs) != 0 {
			t.Fatalf("claimed %+v with setup pending", runs)
		}
	}

	// Report the first: the second still blocks claims.
	cmds := h.poll(w, wire.PollRequest{Phase: wire.PhaseSetup, SetupResults: []wire.SetupResult{
		{CommandID: acc.CommandID, Status: wire.SetupFailed, ExitCode: 100, DurationMS: 1234, OutputTail: "E: Unable to locate package jq"},
	}})
	if setups := ofType(cmds, wire.CommandSetup); len(setups) != 1 || setups[0].CommandID != acc2.CommandID {
		t.Fatalf("after one report, poll answered %+v", cmds)
	}
	if runs := ofType(cmds, wire.CommandRun); len(runs) != 0 {
		t.Fatal("claimed with setup pending")
	}

	// Report the second in a ready poll: the same poll may claim.
	cmds = h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, SetupResults: []wire.SetupResult{
		{CommandID: acc2.CommandID, Status: wire.SetupSucceeded, ExitCode: 0, DurationMS: 5},
	}})
	if len(ofType(cmds, wire.CommandSetup)) != 0 {
		t.Errorf("setup re-sent after its report: %+v", cmds)
	}
	if got := runIDs(cmds); !slices.Equal(got, []string{inv.InvocationID}) {
		t.Errorf("after setup, claimed %v, want %s", got, inv.InvocationID)
	}

	var res wire.SetupResults
	h.do("GET", "/v1/workers/"+w.id+"/setup-results", operatorToken, nil).want(t, 200, &res)
	if res.WorkerID != w.id || len(res.SetupResults) != 2 {
		t.Fatalf("setup-results %+v", res)
	}
	first, second := res.SetupResults[0], res.SetupResults[1]
	if first.CommandID != acc.CommandID || first.Status != wire.SetupFailed || first.ExitCode == nil || *first.ExitCode != 100 ||
		first.DurationMS != 1234 || first.OutputTail != "E: Unable to locate package jq" || first.FinishedAt == nil {
		t.Errorf("first setup result %+v", first)
	}
	if second.CommandID != acc2.CommandID || second.Status != wire.SetupSucceeded || second.ExitCode == nil || *second.ExitCode != 0 {
		t.Errorf("second setup result %+v", second)
	}
	if lr := h.worker(w.id).LastSetupResult; lr == nil || lr.CommandID != acc2.CommandID {
		t.Errorf("last_setup_result %+v", lr)
	}

	// A repeated report changes nothing.
	h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, UpdatedCapabilities: &wire.Capabilities{CurrentInvocations: intp(1)},
		SetupResults: []wire.SetupResult{{CommandID: acc.CommandID, Status: wire.SetupSucceeded}}})
	h.do("GET", "/v1/workers/"+w.id+"/setup-results", operatorToken, nil).want(t, 200, &res)
	if res.SetupResults[0].Status != wire.SetupFailed {
		t.Errorf("a repeated report rewrote a setup result: %+v", res.SetupResults[0])
	}
}

// TestSetupResultsOfOtherWorkerIgnored checks a daemon cannot report another
// worker's setup command.
func TestSetupResultsOfOtherWorkerIgnored(t *testing.T) {
	h := newHarness(t)
	a, b := h.hello("ma", "b"), h.hello("mb", "b")
	var acc wire.SetupAccepted
	h.do("POST", "/v1/workers/"+a.id+"/setup", operatorToken, wire.SetupRequest{Argv: []string{"true"}}).want(t, 202, &acc)
	h.poll(b, wire.PollRequest{Phase: wire.PhaseReady, SetupResults: []wire.SetupResult{{CommandID: acc.CommandID, Status: wire.SetupSucceeded}}})
	var res wire.SetupResults
	h.do("GET", "/v1/workers/"+a.id+"/setup-results", operatorToken, nil).want(t, 200, &res)
	if len(res.SetupResults) != 1 || res.SetupResults[0].Status != wire.SetupPending {
		t.Errorf("a's setup results after b's report: %+v", res.SetupResults)
	}
	if cmds := ofType(h.poll(a, wire.PollRequest{Phase: wire.PhaseReady}), wire.CommandSetup); len(cmds) != 1 {
		t.Errorf("a's setup command no longer goes out: %+v", cmds)
	}
}

func TestCapacity(t *testing.T) {
	h := newHarness(t)
	w := h.helloReq(wire.HelloRequest{MachineID: "m", BootID: "b", Lanes: []string{"default"},
		Capabilities: wire.Capabilities{MaxConcurrency: intp(2)}})
	for range 4 {
		h.submit("true")
	}
	first := h.poll(w, wire.PollRequest{Phase: wire.PhaseReady})
	if n := len(ofType(first, wire.CommandRun)); n != 2 {
		t.Fatalf("poll with capacity 2 handed out %d run commands, want 2", n)
	}
	held := runIDs(first)
	// At capacity: nothing more.
	if cmds := h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, Invocations: held,
		UpdatedCapabilities: &wire.Capabilities{CurrentInvocations: intp(2)}}); len(cmds) != 0 {
		t.Errorf("at capacity, poll answered %+v", cmds)
	}
	// Without updated_capabilities the listed invocations are the count.
	if cmds := h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, Invocations: held}); len(cmds) != 0 {
		t.Errorf("listing 2 in flight, poll answered %+v", cmds)
	}
	if got := h.worker(w.id); got.CurrentInvocations != 2 || got.MaxConcurrency != 2 {
		t.Errorf("worker reads %d/%d", got.CurrentInvocations, got.MaxConcurrency)
	}
	// One finishes: one more.
	h.ack(w, wire.AckRequest{InvocationID: held[0], Attempt: 1, State: wire.StateSucceeded})
	cmds := h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, Invocations: held[1:],
		UpdatedCapabilities: &wire.Capabilities{CurrentInvocations: intp(1)}})
	if n := len(ofType(cmds, wire.CommandRun)); n != 1 {
		t.Errorf("with one slot free, poll handed out %d, want 1", n)
	}
	// The daemon may raise its capacity.
	cmds = h.poll(w, wire.PollRequest{Phase: wire.PhaseReady,
		UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: intp(8), CurrentInvocations: intp(2)}})
	if n := len(ofType(cmds, wire.CommandRun)); n != 1 {
		t.Errorf("after raising capacity, poll handed out %d, want the last 1", n)
	}
}

func TestHostKey(t *testing.T) {
	h := newHarness(t)
	setup := []string{"apt-get install -y ffmpeg", "pip install whisper"}
	key := hostkey.Of(setup)
	keyed := h.submitReq(wire.SubmitRequest{Queue: "default", Argv: []string{"transcribe"}, RunConfig: wire.RunConfig{HostSetup: setup}})
	if keyed.HostKey != key {
		t.Fatalf("submit host_key %q, want hostkey.Of(host_setup) %q", keyed.HostKey, key)
	}
	if got := h.invocation(keyed.InvocationID).HostKey; got != key {
		t.Errorf("GET host_key %q", got)
	}

	plain := h.hello("m-plain", "b")
	other := h.helloReq(wire.HelloRequest{MachineID: "m-other", BootID: "b", Lanes: []string{"default"},
		HostKey: hostkey.Of([]string{"apt-get install -y ffmpeg"})})
	if cmds := h.poll(plain, wire.PollRequest{Phase: wire.PhaseReady}); len(cmds) != 0 {
		t.Errorf("a worker with no host key claimed keyed work: %+v", cmds)
	}
	if cmds := h.poll(other, wire.PollRequest{Phase: wire.PhaseReady}); len(cmds) != 0 {
		t.Errorf("a worker with another host key claimed keyed work: %+v", cmds)
	}
	match := h.helloReq(wire.HelloRequest{MachineID: "m-match", BootID: "b", Lanes: []string{"default"}, HostKey: key})
	cmds := h.poll(match, wire.PollRequest{Phase: wire.PhaseReady})
	if got := runIDs(cmds); !slices.Equal(got, []string{keyed.InvocationID}) {
		t.Fatalf("matching worker claimed %v", got)
	}
	if run := ofType(cmds, wire.CommandRun)[0].Invocation; run.HostKey != key || !slices.Equal(run.RunConfig.HostSetup, setup) {
		t.Errorf("run command %+v, want host_key and host_setup", run)
	}

	// A keyed worker also takes work any host may run.
	anyHost := h.submit("echo")
	if got := runIDs(h.poll(match, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{keyed.InvocationID},
		UpdatedCapabilities: &wire.Capabilities{CurrentInvocations: intp(0)}})); !slices.Equal(got, []string{anyHost.InvocationID}) {
		t.Errorf("keyed worker claimed %v of unkeyed work", got)
	}

	// A poll may report a new host key (setup ran): it then matches.
	keyed2 := h.submitReq(wire.SubmitRequest{Queue: "default", Argv: []string{"transcribe"}, RunConfig: wire.RunConfig{HostSetup: setup}})
	if got := runIDs(h.poll(plain, wire.PollRequest{Phase: wire.PhaseReady, HostKey: key})); !slices.Equal(got, []string{keyed2.InvocationID}) {
		t.Errorf("worker with a host key from its poll claimed %v", got)
	}
}

func TestQueuesAndLanes(t *testing.T) {
	h := newHarness(t)
	w := h.helloReq(wire.HelloRequest{MachineID: "m", BootID: "b", Lanes: []string{"gpu", "cpu"},
		Capabilities: wire.Capabilities{MaxConcurrency: intp(4)}})
	gpu := h.submitReq(wire.SubmitRequest{Queue: "gpu", Argv: []string{"train"}})
	cpu := h.submitReq(wire.SubmitRequest{Queue: "cpu", Argv: []string{"etl"}})
	h.submit("other")
	// No queue in the poll: the first lane.
	if got := runIDs(h.poll(w, wire.PollRequest{Phase: wire.PhaseReady})); !slices.Equal(got, []string{gpu.InvocationID}) {
		t.Errorf("lane poll claimed %v, want the gpu invocation", got)
	}
	if got := runIDs(h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, Queue: "cpu"})); !slices.Equal(got, []string{cpu.InvocationID}) {
		t.Errorf("cpu poll claimed %v", got)
	}
	// A worker without lanes claims only when it names a queue.
	nolane := h.helloReq(wire.HelloRequest{MachineID: "m2", BootID: "b"})
	if cmds := h.poll(nolane, wire.PollRequest{Phase: wire.PhaseReady}); len(cmds) != 0 {
		t.Errorf("lane-less worker without a queue claimed %+v", cmds)
	}
	if got := runIDs(h.poll(nolane, wire.PollRequest{Phase: wire.PhaseReady, Queue: "default"})); len(got) != 1 {
		t.Errorf("lane-less worker naming a queue claimed %v", got)
	}
}

func TestRetriedHelloSameWorker(t *testing.T) {
	h := newHarness(t)
	first := h.hello("m", "boot-1")
	again := h.hello("m", "boot-1")
	if again.id != first.id {
		t.Errorf("retried hello made %s, want the same worker %s", again.id, first.id)
	}
	if again.token == first.token {
		t.Error("retried hello returned the same token; a new one should replace it")
	}
	var list wire.WorkerList
	h.do("GET", "/v1/workers", operatorToken, nil).want(t, 200, &list)
	if len(list.Workers) != 1 {
		t.Errorf("%d worker rows after a retried hello, want 1", len(list.Workers))
	}
	h.poll(again, wire.PollRequest{})
}

func TestNewBootRetiresOldWorker(t *testing.T) {
	h := newHarness(t)
	old := h.hello("m", "boot-1")
	inv := h.submit("long-job")
	if got := runIDs(h.poll(old, wire.PollRequest{Phase: wire.PhaseReady})); len(got) != 1 {
		t.Fatalf("claimed %v", got)
	}

	nw := h.hello("m", "boot-2")
	if nw.id == old.id {
		t.Fatal("a new boot kept the old worker id")
	}
	if got := h.worker(old.id).State; got != "gone" {
		t.Errorf("old worker reads %q, want gone", got)
	}
	requeued := h.invocation(inv.InvocationID)
	if requeued.State != wire.StateQueued || requeued.Attempt != 1 || requeued.WorkerID != "" {
		t.Errorf("after the new boot the invocation reads state %q attempt %d worker %q, want queued, attempt 1, no worker",
			requeued.State, requeued.Attempt, requeued.WorkerID)
	}
	h.pollResp(old, wire.PollRequest{Phase: wire.PhaseReady}).wantError(t, 410, wire.CodeWorkerGone)

	cmds := h.poll(nw, wire.PollRequest{Phase: wire.PhaseReady})
	runs := ofType(cmds, wire.CommandRun)
	if len(runs) != 1 || runs[0].Invocation.InvocationID != inv.InvocationID || runs[0].Invocation.Attempt != 2 {
		t.Fatalf("new worker got %+v, want attempt 2 of %s", cmds, inv.InvocationID)
	}
	if got := h.invocation(inv.InvocationID); got.Attempt != 2 || got.WorkerID != nw.id {
		t.Errorf("re-claimed invocation reads attempt %d worker %s", got.Attempt, got.WorkerID)
	}

	// The old worker's late ack for attempt 1 still counts (the work was
	// done) and is counted once; the new worker's ack is then a no-op.
	if resp := h.ack(old, wire.AckRequest{InvocationID: inv.InvocationID, Attempt: 1, State: wire.StateSucceeded}); !resp.Recorded {
		t.Errorf("late ack of attempt 1 answered %+v, want recorded", resp)
	}
	if resp := h.ack(nw, wire.AckRequest{InvocationID: inv.InvocationID, Attempt: 2, State: wire.StateSucceeded}); resp.Recorded {
		t.Errorf("second outcome answered %+v, want recorded:false", resp)
	}
	if q := h.queue("default"); q.DoneCount != 1 {
		t.Errorf("done_count %d, want 1", q.DoneCount)
	}
	// The new worker, still listing it, is told to stop attempt 2.
	cmds = h.poll(nw, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{inv.InvocationID}})
	if c := ofType(cmds, wire.CommandCancel); len(c) != 1 || c[0].InvocationID != inv.InvocationID {
		t.Errorf("poll after the earlier attempt won answered %+v, want a cancel", cmds)
	}
	// And the old machine's boot cannot come back under its old id.
	again := h.hello("m", "boot-1")
	if again.id == old.id {
		t.Error("a hello from the retired boot revived the gone worker")
	}
}

func TestByeRequeuesHeldWork(t *testing.T) {
	h := newHarness(t)
	w := h.hello("m", "b")
	inv := h.submit("x")
	h.poll(w, wire.PollRequest{Phase: wire.PhaseReady})
	h.bye(w, wire.ByeSignal)
	if got := h.invocation(inv.InvocationID); got.State != wire.StateQueued || got.Attempt != 1 {
		t.Errorf("after bye the invocation reads %q attempt %d, want queued attempt 1", got.State, got.Attempt)
	}
}

func TestMaxAttemptsExhausted(t *testing.T) {
	h := newHarness(t)
	inv := h.submitReq(wire.SubmitRequest{Queue: "default", Argv: []string{"x"}, MaxAttempts: 1})
	w := h.hello("m", "b")
	h.poll(w, wire.PollRequest{Phase: wire.PhaseReady})
	h.bye(w, wire.ByeSignal)
	got := h.invocation(inv.InvocationID)
	if got.State != wire.StateFailed || got.Error == nil || got.Error.Type != wire.ErrorTypeWorkerLost {
		t.Errorf("after losing its only attempt the invocation reads %+v, want failed worker_lost", got)
	}
	if q := h.queue("default"); q.DoneCount != 1 || q.Counts[wire.StateFailed] != 1 {
		t.Errorf("queue stats %+v", q)
	}
}

// TestPollOmittingHeldInvocationRequeuesIt pins docs/design.md §5: "a worker's
// running invocations are redelivered ... when a poll's invocations list
// omits one the control plane thinks it holds". Without it, an invocation
// whose run command was lost on the way (the poll answer never arrived)
// stays running on a healthy worker forever: the worker keeps polling, so it
// never reads stale.
func TestPollOmittingHeldInvocationRequeuesIt(t *testing.T) {
	h := newHarness(t)
	w := h.hello("m", "b")
	inv := h.submit("x")
	if got := runIDs(h.poll(w, wire.PollRequest{Phase: wire.PhaseReady})); len(got) != 1 {
		t.Fatalf("claimed %v", got)
	}
	// The daemon never saw the answer: its next poll lists nothing in flight
	// (an explicit empty list, and a count of 0).
	h.do("POST", "/v1/daemon/poll", w.token, map[string]any{
		"worker_id": w.id, "phase": wire.PhaseSetup, "invocations": []string{},
		"updated_capabilities": map[string]int{"current_invocations": 0},
	}).want(t, 200, nil)
	got := h.invocation(inv.InvocationID)
	if got.State == wire.StateRunning && got.WorkerID == w.id && got.Attempt == 1 {
		t.Errorf("invocation still running attempt 1 on %s after a poll that omitted it; want it redelivered", w.id)
	}
}

// TestLostPollAnswersSpendNoAttempt: an overloaded control plane can claim
// work for a poll whose answer never reaches the daemon (its request timed
// out). Each such hand-out is omitted from the worker's next poll and given
// back without spending an attempt, so a job with max_attempts 1 survives
// several lost answers and runs once, to success, when one arrives. Its
// ack carries an attempt number past max_attempts' limit of 20.
func TestLostPollAnswersSpendNoAttempt(t *testing.T) {
	c := newClock()
	h := newHarness(t, withClock(c))
	w := h.hello("m", "b")
	inv := h.submitReq(wire.SubmitRequest{Queue: "default", Argv: []string{"x"}, MaxAttempts: 1})
	lost := wire.MaxAttemptsLimit + 1
	for i := range lost {
		// The daemon never saw these answers: each next poll lists nothing.
		c.Advance(time.Second)
		got := runIDs(h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{}}))
		if len(got) != 1 || got[0] != inv.InvocationID {
			t.Fatalf("poll %d after %d lost answers claimed %v, want %s again", i+1, i, got, inv.InvocationID)
		}
	}
	if got := h.invocation(inv.InvocationID); got.State != wire.StateRunning || got.Attempt != lost {
		t.Fatalf("after %d lost answers: %s attempt %d, want running attempt %d", lost-1, got.State, got.Attempt, lost)
	}
	c.Advance(time.Second)
	h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{inv.InvocationID}})
	ack := h.ack(w, wire.AckRequest{InvocationID: inv.InvocationID, Attempt: lost, State: wire.StateSucceeded, ExitCode: intp(0)})
	got := h.invocation(inv.InvocationID)
	if !ack.Recorded || got.State != wire.StateSucceeded || got.MaxAttempts != lost {
		t.Fatalf("ack of attempt %d: recorded %v, %s, max_attempts %d; want it recorded, succeeded, max_attempts %d",
			lost, ack.Recorded, got.State, got.MaxAttempts, lost)
	}
}

// TestAReceivedAttemptOmittedLaterCounts: a poll listed the attempt, so
// its worker received it; a later poll that omits it (its warm process
// died, or its ack was refused) spends the attempt, as a lost worker's
// does, and the last one fails the invocation.
func TestAReceivedAttemptOmittedLaterCounts(t *testing.T) {
	c := newClock()
	h := newHarness(t, withClock(c))
	w := h.hello("m", "b")
	inv := h.submitReq(wire.SubmitRequest{Queue: "default", Argv: []string{"x"}, MaxAttempts: 1})
	if got := runIDs(h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{}})); len(got) != 1 {
		t.Fatalf("claimed %v", got)
	}
	c.Advance(time.Second)
	h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{inv.InvocationID}})
	c.Advance(time.Second)
	h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{}})
	got := h.invocation(inv.InvocationID)
	if got.State != wire.StateFailed || got.Error == nil || got.Error.Type != "worker_lost" || got.Attempts[0].Outcome != "omitted" {
		t.Fatalf("after its worker omitted a received attempt: %s %+v, attempts %+v; want failed worker_lost, attempt 1 omitted",
			got.State, got.Error, got.Attempts)
	}
}

func TestComputedStaleAndGone(t *testing.T) {
	c := newClock()
	h := newHarness(t, withClock(c), func(cfg *apitest.Config) { cfg.Control.StaleAfter = 3 * time.Second })
	w := h.hello("m", "b")
	h.poll(w, wire.PollRequest{Phase: wire.PhaseReady})

	c.Advance(3 * time.Second)
	if got := h.worker(w.id).State; got != "active" {
		t.Errorf("silent exactly StaleAfter: %q, want active", got)
	}
	c.Advance(time.Millisecond)
	got := h.worker(w.id)
	if got.State != "stale" || got.StoredState != "active" {
		t.Errorf("silent past StaleAfter: state %q stored %q, want stale/active", got.State, got.StoredState)
	}
	var list wire.WorkerList
	h.do("GET", "/v1/workers", operatorToken, nil).want(t, 200, &list)
	if len(list.Workers) != 1 || list.Workers[0].State != "stale" {
		t.Errorf("list reads %+v", list.Workers)
	}
	if got.LastSeenAt == nil || !got.LastSeenAt.Equal(c.Now().Add(-3*time.Second-time.Millisecond)) {
		t.Errorf("last_seen_at %v", got.LastSeenAt)
	}

	// A poll brings it back: stale is computed, not stored.
	h.poll(w, wire.PollRequest{Phase: wire.PhaseReady})
	if got := h.worker(w.id).State; got != "active" {
		t.Errorf("after a poll: %q, want active", got)
	}

	// Gone is never relabelled, however long it stays silent.
	h.bye(w, wire.ByeIdle)
	c.Advance(time.Hour)
	if got := h.worker(w.id).State; got != "gone" {
		t.Errorf("an hour after bye: %q, want gone", got)
	}
}

func TestListInvocations(t *testing.T) {
	h := newHarness(t)
	var made []string
	for i := range 5 {
		q := "a"
		if i%2 == 1 {
			q = "b"
		}
		made = append(made, h.submitReq(wire.SubmitRequest{Queue: q, Argv: []string{"x"}}).InvocationID)
	}
	h.do("POST", "/v1/invocations/"+made[0]+"/cancel", operatorToken, nil).want(t, 200, nil)

	count := func(query string) int {
		var l wire.InvocationList
		h.do("GET", "/v1/invocations"+query, operatorToken, nil).want(t, 200, &l)
		return len(l.Invocations)
	}
	cases := map[string]int{
		"":                              5,
		"?queue=a":                      3,
		"?queue=b":                      2,
		"?queue=nosuch":                 0,
		"?state=cancelled":              1,
		"?queue=a&state=queued":         2,
		"?queue=b&state=cancelled":      0,
		"?state=running":                0,
		"?queue=a&state=cancelled":      1,
		"?limit=500":                    5,
		"?limit=5&queue=a&state=queued": 2,
		"?order=newest":                 5,
		"?order=oldest&state=queued":    4,
		"?queue=a&order=newest":         3,
	}
	for q, want := range cases {
		if got := count(q); got != want {
			t.Errorf("GET /v1/invocations%s: %d, want %d", q, got, want)
		}
	}

	// Paging visits each invocation once.
	for _, base := range []string{"/v1/invocations?limit=2", "/v1/invocations?limit=1&queue=a", "/v1/invocations?limit=2&order=newest"} {
		seen := map[string]bool{}
		cursor := ""
		for page := 0; ; page++ {
			if page > 10 {
				t.Fatal("paging does not end")
			}
			path := base
			if cursor != "" {
				path += "&cursor=" + cursor
			}
			var l wire.InvocationList
			h.do("GET", path, operatorToken, nil).want(t, 200, &l)
			for _, inv := range l.Invocations {
				if seen[inv.InvocationID] {
					t.Errorf("%s: %s twice", base, inv.InvocationID)
				}
				seen[inv.InvocationID] = true
			}
			if l.NextCursor == "" {
				break
			}
			cursor = l.NextCursor
		}
		want := 5
		if strings.Contains(base, "queue=a") {
			want = 3
		}
		if len(seen) != want {
			t.Errorf("%s: paged through %d, want %d", base, len(seen), want)
		}
	}
}

// TestLastSetupResultOnlyFromRecordedResults: a worker's last_setup_result
// reflects what was recorded in its setup history, not the last entry of
// the poll's setup_results: a report for another worker's command, an
// unknown command, or a repeat that RecordSetupResults refused does not
// show up on GET /v1/workers/{id}.
func TestLastSetupResultOnlyFromRecordedResults(t *testing.T) {
	h := newHarness(t)
	a, b := h.hello("ma", "b"), h.hello("mb", "b")
	var accA, accB wire.SetupAccepted
	h.do("POST", "/v1/workers/"+a.id+"/setup", operatorToken, wire.SetupRequest{Argv: []string{"true"}}).want(t, 202, &accA)
	h.do("POST", "/v1/workers/"+b.id+"/setup", operatorToken, wire.SetupRequest{Argv: []string{"false"}}).want(t, 202, &accB)

	t.Run("another worker's command", func(t *testing.T) {
		h.poll(b, wire.PollRequest{Phase: wire.PhaseSetup, SetupResults: []wire.SetupResult{{CommandID: accA.CommandID, Status: wire.SetupSucceeded}}})
		if lr := h.worker(b.id).LastSetupResult; lr != nil {
			t.Errorf("b's last_setup_result %+v names a's command", lr)
		}
	})
	t.Run("unknown command", func(t *testing.T) {
		h.poll(b, wire.PollRequest{Phase: wire.PhaseSetup, SetupResults: []wire.SetupResult{{CommandID: newID("cmd"), Status: wire.SetupSucceeded}}})
		if lr := h.worker(b.id).LastSetupResult; lr != nil {
			t.Errorf("b's last_setup_result %+v names an unknown command", lr)
		}
	})
	t.Run("repeat with another outcome", func(t *testing.T) {
		h.poll(b, wire.PollRequest{Phase: wire.PhaseSetup, SetupResults: []wire.SetupResult{{CommandID: accB.CommandID, Status: wire.SetupFailed, ExitCode: 1}}})
		h.poll(b, wire.PollRequest{Phase: wire.PhaseSetup, SetupResults: []wire.SetupResult{{CommandID: accB.CommandID, Status: wire.SetupSucceeded, ExitCode: 0}}})
		lr := h.worker(b.id).LastSetupResult
		if lr == nil || lr.Status != wire.SetupFailed {
			t.Errorf("last_setup_result %+v, want the recorded (failed) outcome", lr)
		}
	})
}

// TestHostSetupResultShows: a daemon's failed --host-setup command, reported
// without a command id (the control plane never queued it), is the worker's
// last_setup_result on GET /v1/workers/{id}; the worker, in phase setup,
// claims nothing until a later report (its rerun succeeded) comes from ready.
func TestHostSetupResultShows(t *testing.T) {
	h := newHarness(t)
	w := h.hello("m-host", "b")
	inv := h.submit("true")
	failed := wire.SetupResult{Command: "exit 3", Status: wire.SetupFailed, ExitCode: 3, DurationMS: 7, OutputTail: "no disk"}
	cmds := h.poll(w, wire.PollRequest{Queue: "default", Phase: wire.PhaseSetup, SetupResults: []wire.SetupResult{failed}})
	if got := runIDs(cmds); len(got) != 0 {
		t.Fatalf("a worker in setup claimed %v", got)
	}
	got := h.worker(w.id)
	if got.LastSetupResult == nil || *got.LastSetupResult != failed {
		t.Fatalf("last_setup_result %+v, want %+v", got.LastSetupResult, failed)
	}
	if got.State != "setting_up" || got.Phase != wire.PhaseSetup {
		t.Fatalf("worker %s in phase %s, want setting_up in setup", got.State, got.Phase)
	}
	var res wire.SetupResults
	h.do("GET", "/v1/workers/"+w.id+"/setup-results", operatorToken, nil).want(t, 200, &res)
	if len(res.SetupResults) != 0 {
		t.Errorf("a host-setup result made a control-plane setup command: %+v", res.SetupResults)
	}

	rerun := wire.SetupResult{Command: "exit 3", Status: wire.SetupSucceeded}
	cmds = h.poll(w, wire.PollRequest{Queue: "default", Phase: wire.PhaseReady, SetupResults: []wire.SetupResult{rerun}})
	if got := runIDs(cmds); !slices.Equal(got, []string{inv.InvocationID}) {
		t.Fatalf("after the host setup succeeded, claimed %v, want %s", got, inv.InvocationID)
	}
	if lr := h.worker(w.id).LastSetupResult; lr == nil || *lr != rerun {
		t.Errorf("last_setup_result %+v, want %+v", lr, rerun)
	}
}

// TestStoreDownIsUnavailable: when the store does not answer, routes say 503
// with a retryable code and no store details.
func TestStoreDownIsUnavailable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close() // nothing listens there now: connection refused
	db := store.EndpointClient(dead)
	s, err := apitest.Build(apitest.Config{Store: store.New(db, "down-"), Config: api.Config{Config: daemonapi.Config{EnrollToken: enrollToken, OperatorToken: operatorToken,
		Logger: slog.New(slog.DiscardHandler)}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	h := &harness{t: t, url: srv.URL}
	for _, r := range []struct {
		name, method, path, token string
		body                      any
	}{
		{"healthz", "GET", "/v1/healthz", "", nil},
		{"get invocation", "GET", "/v1/invocations/" + newID("inv"), operatorToken, nil},
		{"hello", "POST", "/v1/daemon/hello", enrollToken, wire.HelloRequest{MachineID: "m", BootID: "b"}},
	} {
		t.Run(r.name, func(t *testing.T) {
			d := h.do(r.method, r.path, r.token, r.body).wantError(t, 503, wire.CodeUnavailable)
			if strings.Contains(d.Message, "127.0.0.1") || strings.Contains(d.Message, "dial") {
				t.Errorf("message leaks store details: %q", d.Message)
			}
		})
	}
}

// TestDefaultSleepWaits: without an injected Sleep the long poll really
// waits, up to its cap.
func TestDefaultSleepWaits(t *testing.T) {
	h := newHarness(t, func(c *apitest.Config) { c.Control.StaleAfter = 300 * time.Millisecond })
	w := h.hello("m", "b")
	start := time.Now()
	h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, TimeoutS: 5})
	if d := time.Since(start); d < 90*time.Millisecond || d > 3*time.Second {
		t.Errorf("long poll took %v, want about 100ms (stale_after/3)", d)
	}
}

// TestHeldKeyQueuedWorkSaysWhyItWaits: queued work whose key the
// provisioner holds back answers GET with waiting_reason (how many hosts
// failed and the last one's reason); work of another key says nothing.
func TestHeldKeyQueuedWorkSaysWhyItWaits(t *testing.T) {
	h := newHarness(t)
	held := h.submitReq(wire.SubmitRequest{Queue: "default", Argv: []string{"true"}, RunConfig: wire.RunConfig{HostSetup: []string{"exit 1"}}})
	other := h.submitReq(wire.SubmitRequest{Queue: "default", Argv: []string{"true"}})
	key := domain.ProvisionKey{Queue: "default", HostKey: held.HostKey}
	if err := h.store.SaveKeyHold(context.Background(), &domain.KeyHold{Key: key, Failures: 3, Stopped: true,
		Until: time.Now().Add(time.Hour), Last: domain.Host{Key: key, Reason: "its host setup failed: \"exit 1\" exited 1"}}); err != nil {
		t.Fatal(err)
	}
	got := h.invocation(held.InvocationID)
	if !strings.Contains(got.WaitingReason, "3 hosts launched for it failed") || !strings.Contains(got.WaitingReason, "host setup failed") {
		t.Fatalf("waiting_reason %q; want the failures and the last reason", got.WaitingReason)
	}
	if r := h.invocation(other.InvocationID).WaitingReason; r != "" {
		t.Fatalf("work of another key says it waits: %q", r)
	}
	// Only queued work waits: once cancelled, the held key's work says nothing.
	h.do("POST", "/v1/invocations/"+held.InvocationID+"/cancel", operatorToken, nil)
	if got := h.invocation(held.InvocationID); got.State != wire.StateCancelled || got.WaitingReason != "" {
		t.Fatalf("cancelled work: state %s, waiting_reason %q; want cancelled and no reason", got.State, got.WaitingReason)
	}
}

// TestReleaseHoldLetsTheKeyLaunch: POST /v1/hosts/release resets a held
// key's hold (its queued work no longer says it waits), says how many
// failures it counted, answers released false when nothing held the key,
// and refuses a malformed key and a worker's token, changing nothing.
func TestReleaseHoldLetsTheKeyLaunch(t *testing.T) {
	h := newHarness(t)
	held := h.submitReq(wire.SubmitRequest{Queue: "default", Argv: []string{"true"}, RunConfig: wire.RunConfig{HostSetup: []string{"exit 1"}}})
	key := domain.ProvisionKey{Queue: "default", HostKey: held.HostKey}
	if err := h.store.SaveKeyHold(context.Background(), &domain.KeyHold{Key: key, Failures: 3, Stopped: true,
		Until: time.Now().Add(time.Hour), Last: domain.Host{Key: key, Reason: "its host setup failed"}}); err != nil {
		t.Fatal(err)
	}
	release := wire.ReleaseHoldRequest{Queue: "default", HostKey: held.HostKey}
	w := h.hello("m", "b")
	if r := h.do("POST", "/v1/hosts/release", w.token, release); r.status != 401 && r.status != 403 {
		t.Fatalf("a worker's token released a hold: %d", r.status)
	}
	for _, bad := range []wire.ReleaseHoldRequest{{Queue: ""}, {Queue: "default", HostKey: "hk1_nothex"}} {
		if r := h.do("POST", "/v1/hosts/release", operatorToken, bad); r.status != 400 {
			t.Fatalf("release of %+v: %d; want 400", bad, r.status)
		}
	}
	if got := h.invocation(held.InvocationID); got.WaitingReason == "" {
		t.Fatal("refused releases let the held key's work go")
	}
	var out wire.HoldReleased
	h.do("POST", "/v1/hosts/release", operatorToken, release).want(t, 200, &out)
	if !out.Released || out.Failures != 3 || out.Note == "" {
		t.Fatalf("release: %+v; want released, 3 failures, a note", out)
	}
	if got := h.invocation(held.InvocationID); got.WaitingReason != "" {
		t.Fatalf("released key's work still says it waits: %q", got.WaitingReason)
	}
	if hold, _, err := h.store.KeyHold(context.Background(), key); err != nil || hold.Failures != 0 || hold.Waiting(time.Now()) {
		t.Fatalf("stored hold after release: %+v %v; want none", hold, err)
	}
	h.do("POST", "/v1/hosts/release", operatorToken, release).want(t, 200, &out)
	if out.Released || out.Failures != 0 {
		t.Fatalf("second release: %+v; want nothing released", out)
	}
}
