package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/syncbuf"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// nymphProc is a running bin/nymph.
type nymphProc struct {
	cmd  *exec.Cmd
	logs *syncbuf.Buffer
	done chan struct{}
	err  error
}

// startNymph runs bin/nymph against d with its own workdir and state dir.
func startNymph(t testing.TB, d *devServer, machine string, extra ...string) *nymphProc {
	t.Helper()
	return startNymphIn(t, d, machine, t.TempDir(), extra...)
}

// startNymphIn runs bin/nymph with its workdir and state dir under dir, so
// a second process can take over the first one's spool.
func startNymphIn(t testing.TB, d *devServer, machine, dir string, extra ...string) *nymphProc {
	t.Helper()
	return startNymphEnv(t, d, machine, dir, nil, extra...)
}

// startNymphEnv is startNymphIn with extra environment for the daemon.
func startNymphEnv(t testing.TB, d *devServer, machine, dir string, env []string, extra ...string) *nymphProc {
	t.Helper()
	return startNymphCmd(t, d, machine, dir, env, nil, extra...)
}

// startNymphCmd is startNymphEnv with the daemon run under wrap (a command
// prefix such as `ip netns exec NAME`; it must exec nymph in its place).
func startNymphCmd(t testing.TB, d *devServer, machine, dir string, env, wrap []string, extra ...string) *nymphProc {
	t.Helper()
	args := append([]string{
		"--control-plane", d.URL, "--enroll-token", d.EnrollToken, "--queue", "q",
		"--label", machine, "--machine-id", machine, "--workdir", filepath.Join(dir, "work"),
		"--state-dir", filepath.Join(dir, "state"), "--introspect-addr", "off",
		"--grace", "5s", "--kill-after", "1s", "--log-level", "debug",
	}, extra...)
	argv := append(append(append([]string(nil), wrap...), bin(t, "nymph")), args...)
	return launchNymph(t, machine, argv, append([]string{"NYMPH_TEST_SECRET_IN_DAEMON_ENV=leak"}, env...), nil)
}

// launchNymph starts argv (nymph, or a wrapper that execs it) with env
// added to the test's environment, as cred's user if set, and kills it when
// the test ends.
func launchNymph(t testing.TB, machine string, argv, env []string, cred *syscall.Credential) *nymphProc {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	p := &nymphProc{cmd: cmd, logs: &syncbuf.Buffer{}, done: make(chan struct{})}
	cmd.Stderr = p.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start nymph: %v", err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		if t.Failed() {
			t.Logf("nymph %s log:\n%s", machine, p.logs.String())
		}
	})
	return p
}

// wait waits up to limit for the process to exit and reports its exit code.
func (p *nymphProc) wait(t testing.TB, limit time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(limit):
		t.Fatalf("nymph did not exit within %s", limit)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	return 0
}

// waitLog waits up to limit for the daemon's log to contain text: the
// daemon saying it did something is the hook a test synchronises on.
func (p *nymphProc) waitLog(t *testing.T, limit time.Duration, text string) {
	t.Helper()
	waittest.Until(t, limit, "nymph logs "+text, func() bool { return strings.Contains(p.logs.String(), text) })
}

// waitPolls waits until the worker labelled label has polled n more times
// (its last_seen_at moved n times): what a test waits for when it proves
// that something did not happen on the worker's polls.
func waitPolls(t *testing.T, op *client.Client, label string, n int) {
	t.Helper()
	var last time.Time
	moves := -1 // the first reading is the baseline
	waittest.Until(t, time.Minute, fmt.Sprintf("%d polls by %s", n, label), func() bool {
		w, ok := workerNamed(context.Background(), op, label)
		if !ok || w.LastSeenAt == nil {
			return false
		}
		if !w.LastSeenAt.Equal(last) {
			last = *w.LastSeenAt
			moves++
		}
		return moves >= n
	})
}

func workerNamed(ctx context.Context, op *client.Client, label string) (wire.Worker, bool) {
	ws, err := op.ListWorkers(ctx, 100, "")
	if err != nil {
		return wire.Worker{}, false
	}
	var found wire.Worker
	ok := false
	for _, w := range ws.Workers {
		if w.Label == label && (!ok || w.CreatedAt.After(found.CreatedAt)) {
			found, ok = w, true
		}
	}
	return found, ok
}

func submitSh(t *testing.T, op *client.Client, script string, timeoutS int, setup ...string) wire.Invocation {
	t.Helper()
	inv, _, err := op.Submit(context.Background(), wire.SubmitRequest{
		Queue: "q", Argv: []string{"/bin/sh", "-c", script}, TimeoutS: timeoutS,
		RunConfig: wire.RunConfig{HostSetup: setup},
	})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	return inv
}

func waitTerminal(t *testing.T, op *client.Client, id string, limit time.Duration) wire.Invocation {
	t.Helper()
	var inv wire.Invocation
	waittest.Until(t, limit, "invocation "+id+" terminal", func() bool {
		var err error
		inv, err = op.GetInvocation(context.Background(), id)
		return err == nil && wire.Terminal(inv.State)
	})
	return inv
}

// TestAgentRunsWork: several nymph processes run successes, failures and
// timeouts, report results, and keep secrets out of bodies.
func TestAgentRunsWork(t *testing.T) {
	t.Parallel()
	forEachPlane(t, func(t *testing.T, b backend) {
		d := startDev(t, b, "--stale-after", "3s")
		op := d.Operator()
		for i := range 3 {
			startNymph(t, d, fmt.Sprintf("m%d", i), "--capacity", "2")
		}
		ok := submitSh(t, op, `echo "hello $NYMPH_ATTEMPT"; echo '{"answer": 42}' > "$NYMPH_RESULT_FILE"`, 0)
		fail := submitSh(t, op, `echo oops >&2; exit 3`, 0)
		slow := submitSh(t, op, `sleep 30`, 1)
		env := submitSh(t, op, `env | grep -c -E 'ENROLL|TOKEN|NYMPH_TEST_SECRET' || true; [ -n "$NYMPH_WORKER_ID" ] && [ -n "$NYMPH_INVOCATION_ID" ]`, 0)

		got := waitTerminal(t, op, ok.InvocationID, 30*time.Second)
		if got.State != wire.StateSucceeded || string(got.ResultBlob) != `{"answer":42}` || !strings.Contains(got.StdoutTail, "hello 1") {
			t.Errorf("success: %+v", got)
		}
		got = waitTerminal(t, op, fail.InvocationID, 30*time.Second)
		if got.State != wire.StateFailed || got.ExitCode == nil || *got.ExitCode != 3 || !strings.Contains(got.StderrTail, "oops") {
			t.Errorf("failure: %+v", got)
		}
		got = waitTerminal(t, op, slow.InvocationID, 30*time.Second)
		if got.State != wire.StateFailed || got.Error == nil || got.Error.Type != wire.ErrorTypeTimeout {
			t.Errorf("timeout: %+v", got)
		}
		got = waitTerminal(t, op, env.InvocationID, 30*time.Second)
		if got.State != wire.StateSucceeded || strings.TrimSpace(got.StdoutTail) != "0" {
			t.Errorf("body environment: %+v (stdout %q: want no token or daemon secret visible)", got, got.StdoutTail)
		}
		if st, _ := op.QueueStats(context.Background(), "q"); st.DoneCount != 4 {
			t.Errorf("done_count %d, want 4", st.DoneCount)
		}
	})
}

// TestAgentExits: keep-alive idle expiry and SIGTERM both end with bye, so
// the worker reads gone at once (no stale wait), and exit 0.
func TestAgentExits(t *testing.T) {
	t.Parallel()
	forEachPlane(t, func(t *testing.T, b backend) {
		d := startDev(t, b, "--stale-after", "60s")
		op := d.Operator()
		ctx := context.Background()

		idle := startNymph(t, d, "idle", "--keep-alive", "1s")
		if code := idle.wait(t, 30*time.Second); code != 0 {
			t.Fatalf("keep-alive exit code %d", code)
		}
		if w, ok := workerNamed(ctx, op, "idle"); !ok || w.State != "gone" || w.RetiredWhy != "bye: idle" {
			t.Fatalf("after keep-alive: %+v", w)
		}

		busy := startNymph(t, d, "busy")
		waittest.Until(t, 20*time.Second, "busy worker active", func() bool {
			w, ok := workerNamed(ctx, op, "busy")
			return ok && w.State == "active" && w.Phase == wire.PhaseReady
		})
		inv := submitSh(t, op, `sleep 60`, 0)
		waittest.Until(t, 20*time.Second, "claimed", func() bool {
			got, _ := op.GetInvocation(ctx, inv.InvocationID)
			return got.State == wire.StateRunning
		})
		if err := busy.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		// --grace 5s, --kill-after 1s: the body is killed and handed back.
		if code := busy.wait(t, 30*time.Second); code != 0 {
			t.Fatalf("SIGTERM exit code %d", code)
		}
		w, _ := workerNamed(ctx, op, "busy")
		if w.State != "gone" || w.RetiredWhy != "bye: signal" {
			t.Fatalf("after SIGTERM: state %q bye %q, want gone at once (60 s stale window not waited)", w.State, w.RetiredWhy)
		}
		if got, _ := op.GetInvocation(ctx, inv.InvocationID); got.State != wire.StateQueued || got.Attempt != 1 {
			t.Fatalf("abandoned invocation: %s attempt %d, want queued again", got.State, got.Attempt)
		}
	})
}

// TestAgentHostSetupGates: a worker with --host-setup claims only work
// whose host key matches, and only after its setup ran.
func TestAgentHostSetupGates(t *testing.T) {
	t.Parallel()
	forEachPlane(t, func(t *testing.T, b backend) {
		d := startDev(t, b, "--stale-after", "3s")
		op := d.Operator()
		setup := "echo prepared > /tmp/.lakeshore-test-host-setup-$$; sleep 1"
		keyed := submitSh(t, op, `echo keyed`, 0, setup)
		plain := submitSh(t, op, `echo plain`, 0, "something-else")

		startNymph(t, d, "setup-host", "--host-setup", setup)
		got := waitTerminal(t, op, keyed.InvocationID, 30*time.Second)
		if got.State != wire.StateSucceeded {
			t.Fatalf("keyed work: %+v", got)
		}
		waitPolls(t, op, "setup-host", 4) // a mismatched key must stay queued through several polls
		if got, _ := op.GetInvocation(context.Background(), plain.InvocationID); got.State != wire.StateQueued {
			t.Fatalf("work for another host key was claimed: %+v", got)
		}
	})
}

// logLines parses the daemon's JSON log and returns the records whose msg
// is msg.
func (p *nymphProc) logLines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(p.logs.String(), "\n") {
		var rec map[string]any
		if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// TestAgentLogsOperatorCancel: an operator cancels a running invocation;
// the cancel command says why (reason operator) and nymph logs that reason
// with the invocation and attempt, so a reader of its log can tell an
// operator's cancel from a superseded attempt's (tests/stale_return_test.go).
// The invocation ends cancelled, as the operator asked.
func TestAgentLogsOperatorCancel(t *testing.T) {
	t.Parallel()
	d := startDev(t, backends[0], "--stale-after", "60s")
	op := d.Operator()
	ctx := context.Background()
	n := startNymph(t, d, "cancelled")
	g := newExitGate(t)
	inv := submitSh(t, op, g.started()+g.await(), 0) // runs until cancelled (at most two minutes)
	g.waitStarted(t)
	if c, err := op.CancelInvocation(ctx, inv.InvocationID); err != nil || !c.CancelRequested {
		t.Fatalf("cancel: %+v %v", c, err)
	}
	n.waitLog(t, 30*time.Second, `"msg":"cancel"`)
	recs := n.logLines(t, "cancel")
	if len(recs) != 1 || recs[0]["invocation_id"] != inv.InvocationID || recs[0]["reason"] != wire.CancelOperator || recs[0]["attempt"] != float64(1) {
		t.Fatalf("cancel log records %v; want one for %s attempt 1 with reason %q", recs, inv.InvocationID, wire.CancelOperator)
	}
	got := waitTerminal(t, op, inv.InvocationID, 30*time.Second)
	if got.State != wire.StateCancelled || !got.CancelRequested || got.Attempt != 1 {
		t.Fatalf("invocation %+v; want cancelled at attempt 1, by the operator", got)
	}
	if strings.Contains(n.logs.String(), `"reason":"`+wire.CancelSuperseded+`"`) {
		t.Fatal("an operator's cancel was logged as superseded")
	}
}
