package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

const (
	testEnrollToken   = apitest.EnrollToken
	testOperatorToken = apitest.OperatorToken
)

// testPlane is a real control plane (router over a fresh embedded store) on
// 127.0.0.1, with a client for its operator routes.
type testPlane struct {
	url   string
	op    *client.Client
	plane *apitest.Plane
}

func newTestPlane(t *testing.T) testPlane {
	t.Helper()
	// The commands fall back to these; a developer's shell must not leak in.
	t.Setenv(envURL, "")
	t.Setenv(envToken, "")
	plane := apitest.New(t)
	return testPlane{url: plane.URL, op: client.New(plane.URL, testOperatorToken), plane: plane}
}

// run executes the CLI in-process with the plane's URL and operator token
// and returns what it printed.
func (p testPlane) run(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	return runCLI(t.Context(), append([]string{args[0], "--url", p.url, "--token", testOperatorToken}, args[1:]...)...)
}

func runCLI(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err = root.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// mustRun is run that fails the test on an error.
func (p testPlane) mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := p.run(t, args...)
	if err != nil {
		t.Fatalf("lakeshore %s: %v\nstderr: %s", strings.Join(args, " "), err, errOut)
	}
	return out
}

// worker enrolls a fake daemon serving queue "default".
func (p testPlane) worker(t *testing.T, machine string) (*client.Client, string) {
	t.Helper()
	enroll := client.New(p.url, testEnrollToken)
	one := 1
	res, err := enroll.Hello(t.Context(), wire.HelloRequest{MachineID: machine, BootID: "b1", Label: machine,
		Lanes: []string{"default"}, Capabilities: wire.Capabilities{MaxConcurrency: &one}})
	if err != nil {
		t.Fatalf("hello: %v", err)
	}
	return enroll.WithToken(res.Token), res.WorkerID
}

// runOne polls until the worker is handed a run command, then acks it with
// state and exit code. It reports what it ran, or an error.
func runOne(ctx context.Context, c *client.Client, workerID, state string, exit int) (string, error) {
	for ctx.Err() == nil {
		res, err := c.Poll(ctx, wire.PollRequest{WorkerID: workerID, Queue: "default", Phase: wire.PhaseReady, TimeoutS: 1})
		if err != nil {
			return "", err
		}
		for _, cmd := range res.Commands {
			if cmd.Type != wire.CommandRun {
				continue
			}
			ack := wire.AckRequest{WorkerID: workerID, InvocationID: cmd.Invocation.InvocationID,
				Attempt: cmd.Invocation.Attempt, State: state, ExitCode: &exit}
			if state == wire.StateFailed {
				ack.Error = &wire.ErrorInfo{Type: "exit_code", Message: "boom"}
			}
			if _, err := c.Ack(ctx, ack); err != nil {
				return "", err
			}
			return cmd.Invocation.InvocationID, nil
		}
	}
	return "", ctx.Err()
}

func TestSubmitAndGet(t *testing.T) {
	p := newTestPlane(t)
	submit := []string{"submit", "--queue", "batch", "--env", "A=1", "--env", "B=x=y", "--host-setup", "apt-get install -y jq",
		"--run-setup", "make deps", "--timeout", "90s", "--max-attempts", "2", "--idempotency-key", "k-1", "--",
		"python", "-c", "print('hi')"}
	out := p.mustRun(t, submit...)
	id := strings.TrimSpace(out)
	if !strings.HasPrefix(id, "inv_") || strings.Contains(id, "\n") {
		t.Fatalf("submit printed %q, want one invocation id", out)
	}
	inv, err := p.op.GetInvocation(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := p.plane.Store.GetInvocation(t.Context(), id)
	if err != nil || stored.Env["A"] != "1" || stored.Env["B"] != "x=y" {
		t.Fatalf("stored env %v, %v: want A=1 B=x=y", stored.Env, err)
	}
	if inv.Queue != "batch" || strings.Join(inv.Argv, "|") != "python|-c|print('hi')" || inv.Env["A"] != wire.Redacted ||
		inv.Env["B"] != wire.Redacted || inv.TimeoutS != 90 || inv.MaxAttempts != 2 || inv.IdempotencyKey != "k-1" ||
		len(inv.RunConfig.HostSetup) != 1 || len(inv.RunConfig.RunSetup) != 1 || !strings.HasPrefix(inv.HostKey, "hk1_") {
		t.Fatalf("submitted invocation = %+v", inv)
	}

	// The same key again: the same invocation, said so on stderr.
	out, errOut, err := p.run(t, submit...)
	if err != nil || strings.TrimSpace(out) != id || !strings.Contains(errOut, "used before") {
		t.Fatalf("replay: out %q, stderr %q, err %v", out, errOut, err)
	}

	_, _, err = p.run(t, "submit", "--queue", "batch", "--idempotency-key", "k-1", "--", "other")
	if !errors.Is(err, wire.ErrConflict) {
		t.Errorf("same key, other request: err = %v, want conflict", err)
	}

	// Flags end at the first argument, so ARGV's own flags need no "--".
	out = p.mustRun(t, "submit", "-o", "json", "echo", "-n", "--queue")
	var js wire.Invocation
	if err := json.Unmarshal([]byte(out), &js); err != nil || js.Queue != "default" || strings.Join(js.Argv, " ") != "echo -n --queue" {
		t.Fatalf("submit -o json: %q (%v)", out, err)
	}
	if !strings.Contains(out, "\n  \"invocation_id\"") {
		t.Errorf("json output is not indented: %q", out)
	}

	text := p.mustRun(t, "get", id)
	for _, want := range []string{"ID:", id, "State:", "queued", "Attempt:", "0/2", "python -c 'print('\\''hi'\\'')'", "Host key:"} {
		if !strings.Contains(text, want) {
			t.Errorf("get text lacks %q:\n%s", want, text)
		}
	}
	out = p.mustRun(t, "get", id, "--output", "json")
	js = wire.Invocation{}
	if err := json.Unmarshal([]byte(out), &js); err != nil || js.InvocationID != id || js.State != wire.StateQueued {
		t.Fatalf("get -o json: %q (%v)", out, err)
	}

	_, _, err = p.run(t, "get", "cmd_01J00000000000000000000000")
	if err == nil || !strings.Contains(err.Error(), "neither") {
		t.Errorf("get cmd_…: err = %v", err)
	}
	_, _, err = p.run(t, "get", "inv_01J00000000000000000000000")
	if !errors.Is(err, wire.ErrNotFound) {
		t.Errorf("get unknown: err = %v, want not_found", err)
	}
	_, _, err = p.run(t, "submit", "--env", "novalue", "--", "true")
	if err == nil || !strings.Contains(err.Error(), "K=V") {
		t.Errorf("submit --env novalue: err = %v", err)
	}
	_, _, err = p.run(t, "submit", "--output", "yaml", "--", "true")
	if err == nil || !strings.Contains(err.Error(), "--output") {
		t.Errorf("--output yaml: err = %v", err)
	}
}

func TestSubmitWait(t *testing.T) {
	p := newTestPlane(t)
	daemon, workerID := p.worker(t, "m1")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	type result struct {
		id  string
		err error
	}
	done := make(chan result, 1)
	go func() {
		id, err := runOne(ctx, daemon, workerID, wire.StateSucceeded, 0)
		done <- result{id, err}
	}()
	out, errOut, err := runCLI(ctx, "submit", "--url", p.url, "--token", testOperatorToken, "--wait", "--", "echo", "hi")
	if err != nil {
		t.Fatalf("submit --wait: %v\nstderr: %s", err, errOut)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("worker: %v", r.err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || lines[0] != r.id || !strings.HasPrefix(lines[1], r.id+" succeeded exit_code=0 attempt=1/3 worker="+workerID) {
		t.Fatalf("stdout = %q", out)
	}
	if !strings.Contains(errOut, r.id+" succeeded") {
		t.Errorf("stderr progress lacks the final state: %q", errOut)
	}

	// A failure: exit non-zero, with state, exit code and error.
	go func() {
		id, err := runOne(ctx, daemon, workerID, wire.StateFailed, 3)
		done <- result{id, err}
	}()
	out, _, err = runCLI(ctx, "submit", "--url", p.url, "--token", testOperatorToken, "--wait", "-o", "json", "--", "false")
	r = <-done
	if r.err != nil {
		t.Fatalf("worker: %v", r.err)
	}
	if err == nil {
		t.Fatal("submit --wait of a failing invocation returned no error")
	}
	for _, want := range []string{r.id, "failed", "exit code 3", "exit_code: boom"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	var final wire.Invocation
	if jerr := json.Unmarshal([]byte(out), &final); jerr != nil || final.State != wire.StateFailed {
		t.Errorf("json output = %q (%v)", out, jerr)
	}

	// Nobody runs this one: --wait-timeout gives up.
	_, _, err = p.run(t, "submit", "--wait", "--wait-timeout", "300ms", "--queue", "nobody", "--", "true")
	if err == nil || !strings.Contains(err.Error(), "still queued") || !strings.Contains(err.Error(), "--wait-timeout") {
		t.Errorf("wait timeout: err = %v", err)
	}
}

func TestLsAndWatch(t *testing.T) {
	p := newTestPlane(t)
	daemon, workerID := p.worker(t, "m-ls")
	var ids []string
	for range 3 {
		ids = append(ids, strings.TrimSpace(p.mustRun(t, "submit", "--", "true")))
	}
	ranID, err := runOne(t.Context(), daemon, workerID, wire.StateSucceeded, 0)
	if err != nil {
		t.Fatal(err)
	}

	text := p.mustRun(t, "ls", "invocations")
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) != 4 || strings.Join(strings.Fields(lines[0]), " ") != "ID QUEUE STATE ATTEMPT WORKER EXIT AGE" {
		t.Fatalf("ls invocations:\n%s", text)
	}
	// Columns are aligned: every row's STATE starts where the header's does.
	col := strings.Index(lines[0], "STATE")
	for i, id := range ids {
		row := lines[i+1]
		if !strings.HasPrefix(row, id) {
			t.Errorf("row %d = %q, want %s first (oldest first)", i, row, id)
		}
		if id == ranID && !strings.Contains(row[col:], "succeeded  1/3") {
			t.Errorf("row of the run invocation = %q", row)
		}
		if id != ranID && !strings.HasPrefix(row[col:], "queued") {
			t.Errorf("row %q: STATE not aligned at column %d", row, col)
		}
	}

	out := p.mustRun(t, "ls", "invocations", "--state", "queued", "-o", "json")
	var list wire.InvocationList
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Invocations) != 2 {
		t.Fatalf("ls --state queued -o json: %q (%v)", out, err)
	}

	out, errOut, err := p.run(t, "ls", "invocations", "--limit", "1")
	if err != nil || strings.Count(out, "inv_") != 1 || !strings.Contains(errOut, "--cursor") {
		t.Fatalf("ls --limit 1: out %q, stderr %q, err %v", out, errOut, err)
	}
	out = p.mustRun(t, "ls", "invocations", "--limit", "1", "--all", "--queue", "default", "-o", "json")
	list = wire.InvocationList{}
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Invocations) != 3 || list.NextCursor != "" {
		t.Fatalf("ls --all: %q (%v)", out, err)
	}

	text = p.mustRun(t, "ls", "workers")
	lines = strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "ID LABEL STATE PHASE HOST RUNNING/MAX LAST SEEN NOTE" {
		t.Fatalf("ls workers:\n%s", text)
	}
	if f := strings.Fields(lines[1]); len(f) < 7 || f[0] != workerID || f[1] != "m-ls" || f[2] != "active" || f[3] != "ready" || f[5] != "0/1" {
		t.Fatalf("worker row = %q", lines[1])
	}
	out = p.mustRun(t, "ls", "workers", "-o", "json")
	var wl wire.WorkerList
	if err := json.Unmarshal([]byte(out), &wl); err != nil || len(wl.Workers) != 1 || wl.Workers[0].WorkerID != workerID {
		t.Fatalf("ls workers -o json: %q (%v)", out, err)
	}
	if text := p.mustRun(t, "get", workerID); !strings.Contains(text, "m-ls") || !strings.Contains(text, "Running/max:") {
		t.Errorf("get worker:\n%s", text)
	}

	// Cancel what is left, and watch sees the queue done.
	for _, id := range ids {
		if id == ranID {
			continue
		}
		if out := p.mustRun(t, "cancel", id); strings.TrimSpace(out) != id+" cancelled" {
			t.Errorf("cancel printed %q", out)
		}
	}
	out = p.mustRun(t, "watch", "--interval", "10ms", "--until-done")
	want := "queue=default queued=0 running=0 succeeded=1 failed=0 cancelled=2 done=3 | " + workerID + "(m-ls) active 0/1"
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 1 || !strings.HasSuffix(lines[0], want) {
		t.Fatalf("watch --until-done printed %q, want a line ending %q", out, want)
	}
	out = p.mustRun(t, "watch", "--until-done", "-o", "json")
	var snap watchSnapshot
	if err := json.Unmarshal([]byte(out), &snap); err != nil || snap.Queue.DoneCount != 3 || len(snap.Workers) != 1 {
		t.Fatalf("watch -o json: %q (%v)", out, err)
	}
}

func TestWatchStops(t *testing.T) {
	p := newTestPlane(t)
	p.mustRun(t, "submit", "--", "true")
	args := []string{"watch", "--url", p.url, "--token", testOperatorToken, "--interval", "20ms"}

	// A plain watch ends quietly when interrupted.
	ctx, cancel := context.WithTimeout(t.Context(), 150*time.Millisecond)
	defer cancel()
	out, _, err := runCLI(ctx, args...)
	if err != nil || !strings.Contains(out, "queue=default queued=1 running=0") || !strings.Contains(out, "| no workers") {
		t.Fatalf("watch: out %q, err %v", out, err)
	}
	if n := strings.Count(out, "\n"); n < 2 {
		t.Errorf("watch printed %d lines in 150ms at 20ms; want a line per tick", n)
	}

	// --until-done interrupted before the queue is done is a failure, so a
	// script's timeout is not mistaken for success.
	ctx, cancel = context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, _, err = runCLI(ctx, append(args, "--until-done")...)
	if err == nil || !strings.Contains(err.Error(), "before queue default was done") {
		t.Fatalf("watch --until-done interrupted: err = %v", err)
	}
}

func TestDrainAndSetup(t *testing.T) {
	p := newTestPlane(t)
	daemon, workerID := p.worker(t, "m-drain")

	cmdID := strings.TrimSpace(p.mustRun(t, "setup", workerID, "--", "apt-get", "install", "-y", "jq"))
	if !strings.HasPrefix(cmdID, "cmd_") {
		t.Fatalf("setup printed %q", cmdID)
	}
	text := p.mustRun(t, "setup", workerID)
	if !strings.Contains(text, cmdID) || !strings.Contains(text, "pending") || !strings.Contains(text, "apt-get install -y jq") {
		t.Errorf("setup list:\n%s", text)
	}

	out := p.mustRun(t, "drain", workerID)
	if !strings.HasPrefix(out, workerID+" draining: it claims nothing more") {
		t.Fatalf("drain printed %q", out)
	}
	w, err := p.op.GetWorker(t.Context(), workerID)
	if err != nil || w.State != "draining" {
		t.Fatalf("worker after drain = %+v, %v", w, err)
	}
	res, err := daemon.Poll(t.Context(), wire.PollRequest{WorkerID: workerID, Phase: wire.PhaseReady})
	if err != nil || len(res.Commands) == 0 || res.Commands[0].Type != wire.CommandDrain {
		t.Fatalf("poll after drain = %+v, %v", res, err)
	}
	out = p.mustRun(t, "drain", workerID, "-o", "json")
	var d wire.DrainAccepted
	if err := json.Unmarshal([]byte(out), &d); err != nil || d.WorkerID != workerID {
		t.Fatalf("drain -o json: %q (%v)", out, err)
	}
	_, _, err = p.run(t, "drain", "wrk_01J00000000000000000000000")
	if !errors.Is(err, wire.ErrNotFound) {
		t.Errorf("drain unknown worker: err = %v", err)
	}
}

func TestAuthAndConfig(t *testing.T) {
	p := newTestPlane(t)

	_, _, err := runCLI(t.Context(), "ls", "workers", "--url", p.url, "--token", "not-the-token")
	if !errors.Is(err, wire.ErrUnauthorized) {
		t.Fatalf("bad token: err = %v, want unauthorized", err)
	}
	if strings.Contains(err.Error(), "not-the-token") {
		t.Errorf("error quotes the token: %v", err)
	}

	_, _, err = runCLI(t.Context(), "ls", "workers", "--url", p.url)
	if err == nil || !strings.Contains(err.Error(), envToken) {
		t.Fatalf("no token: err = %v", err)
	}

	// The environment stands in for --url and --token.
	t.Setenv(envURL, p.url)
	t.Setenv(envToken, testOperatorToken)
	out, _, err := runCLI(t.Context(), "ls", "invocations")
	if err != nil || !strings.HasPrefix(out, "ID") {
		t.Fatalf("env config: out %q, err %v", out, err)
	}
	// A flag beats the environment.
	_, _, err = runCLI(t.Context(), "ls", "invocations", "--token", "other")
	if !errors.Is(err, wire.ErrUnauthorized) {
		t.Fatalf("--token over env: err = %v", err)
	}

	// Nothing listens there: a transport error naming the call.
	_, _, err = runCLI(t.Context(), "get", "inv_01J00000000000000000000000", "--url", "http://127.0.0.1:1")
	if err == nil || !strings.HasPrefix(err.Error(), "get invocation: ") {
		t.Fatalf("unreachable: err = %v", err)
	}
}

// TestRunningShowsWhatIsHeld: a worker that claimed two invocations but
// reported none running at its polls shows 2/2 in ls workers, get and
// watch, as many as the queue counts running.
func TestRunningShowsWhatIsHeld(t *testing.T) {
	p := newTestPlane(t)
	enroll := client.New(p.url, testEnrollToken)
	two, none := 2, 0
	res, err := enroll.Hello(t.Context(), wire.HelloRequest{MachineID: "m-held", BootID: "b1", Label: "m-held",
		Lanes: []string{"default"}, Capabilities: wire.Capabilities{MaxConcurrency: &two}})
	if err != nil {
		t.Fatalf("hello: %v", err)
	}
	daemon, workerID := enroll.WithToken(res.Token), res.WorkerID
	for range 2 {
		p.mustRun(t, "submit", "--", "true")
	}
	claimed := 0
	for polls := 0; claimed < 2; polls++ {
		if polls == 50 {
			t.Fatalf("claimed %d of 2 invocations in %d polls", claimed, polls)
		}
		// Each poll reports nothing running: the report lags the claims.
		r, err := daemon.Poll(t.Context(), wire.PollRequest{WorkerID: workerID, Queue: "default", Phase: wire.PhaseReady,
			TimeoutS: 1, UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: &two, CurrentInvocations: &none}})
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		for _, cmd := range r.Commands {
			if cmd.Type == wire.CommandRun {
				claimed++
			}
		}
	}
	if w, err := p.op.GetWorker(t.Context(), workerID); err != nil || w.CurrentInvocations != 0 {
		t.Fatalf("the worker's reported current_invocations = %d (%v), want the 0 it reported", w.CurrentInvocations, err)
	}

	text := p.mustRun(t, "ls", "workers")
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if f := strings.Fields(lines[len(lines)-1]); len(lines) != 2 || len(f) < 6 || f[5] != "2/2" {
		t.Errorf("ls workers shows running/max other than the 2/2 it holds:\n%s", text)
	}
	if text := p.mustRun(t, "get", workerID); !strings.Contains(text, "2/2") {
		t.Errorf("get worker shows running/max other than the 2/2 it holds:\n%s", text)
	}
	snap, err := takeSnapshot(t.Context(), p.op, "default")
	if err != nil {
		t.Fatal(err)
	}
	want := "running=2 succeeded=0 failed=0 cancelled=0 done=0 | " + workerID + "(m-held) active 2/2"
	if line := snap.line(); !strings.HasSuffix(line, want) {
		t.Errorf("watch line = %q, want it to end %q", line, want)
	}
}

// TestReleaseHold: release-hold names the key by an invocation waiting on
// it or by --queue and --host-key, resets its hold (get no longer says it
// waits), and says when nothing held it.
func TestReleaseHold(t *testing.T) {
	p := newTestPlane(t)
	inv, _, err := p.op.Submit(t.Context(), wire.SubmitRequest{Queue: "default", Argv: []string{"true"}, RunConfig: wire.RunConfig{HostSetup: []string{"exit 1"}}})
	if err != nil {
		t.Fatal(err)
	}
	key := domain.ProvisionKey{Queue: "default", HostKey: inv.HostKey}
	hold := func() {
		t.Helper()
		h, _, err := p.plane.Store.KeyHold(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		h.Failures, h.Stopped, h.Until, h.Last = 3, true, time.Now().Add(time.Hour), domain.Host{Key: key, Reason: "its host setup failed"}
		if err := p.plane.Store.SaveKeyHold(t.Context(), &h); err != nil {
			t.Fatal(err)
		}
	}
	hold()
	if got := p.mustRun(t, "get", inv.InvocationID); !strings.Contains(got, "release-hold") {
		t.Fatalf("get of held work does not say how to release it:\n%s", got)
	}
	if out := p.mustRun(t, "release-hold", inv.InvocationID); !strings.Contains(out, "3 failed hosts in a row no longer hold it back") {
		t.Fatalf("release-hold printed %q", out)
	}
	if got := p.mustRun(t, "get", inv.InvocationID); strings.Contains(got, "Waiting") {
		t.Fatalf("get after release still says it waits:\n%s", got)
	}
	hold()
	out := p.mustRun(t, "release-hold", "--queue", "default", "--host-key", inv.HostKey, "-o", "json")
	var r wire.HoldReleased
	if err := json.Unmarshal([]byte(out), &r); err != nil || !r.Released || r.Failures != 3 {
		t.Fatalf("release-hold -o json: %q (%v)", out, err)
	}
	if out := p.mustRun(t, "release-hold", "--queue", "default"); !strings.Contains(out, "nothing held its launches back") {
		t.Fatalf("release of a key not held printed %q", out)
	}
	for _, args := range [][]string{{"release-hold"}, {"release-hold", inv.InvocationID, "--queue", "default"}} {
		if _, _, err := p.run(t, args...); err == nil {
			t.Errorf("lakeshore %v: no error", args)
		}
	}
}

// TestSubmitInputAndResident: --input takes a JSON value or @FILE, and
// refuses what is not JSON before anything is sent; --resident sets
// run_config.resident; both reach the stored invocation.
func TestSubmitInputAndResident(t *testing.T) {
	p := newTestPlane(t)
	file := filepath.Join(t.TempDir(), "in.json")
	if err := os.WriteFile(file, []byte(`{"from": "file"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		flag, want string
		resident   bool
	}{
		{`{"prompt":"hi","n":[1,2]}`, `{"prompt":"hi","n":[1,2]}`, true},
		{"@" + file, `{"from":"file"}`, false},
	} {
		args := []string{"submit", "--input", c.flag}
		if c.resident {
			args = append(args, "--resident")
		}
		id := strings.TrimSpace(p.mustRun(t, append(args, "--", "python3", "body.py")...))
		stored, err := p.plane.Store.GetInvocation(t.Context(), id)
		if err != nil || string(stored.Input) != c.want || stored.RunConfig.Resident != c.resident {
			t.Errorf("--input %s resident %v: stored input %s resident %v (%v)", c.flag, c.resident, stored.Input, stored.RunConfig.Resident, err)
		}
	}
	for _, bad := range []string{"not json", "@" + filepath.Join(t.TempDir(), "missing")} {
		if _, _, err := p.run(t, "submit", "--input", bad, "--", "true"); err == nil || !strings.Contains(err.Error(), "--input") {
			t.Errorf("--input %q: err = %v, want a refusal naming --input", bad, err)
		}
	}
}
