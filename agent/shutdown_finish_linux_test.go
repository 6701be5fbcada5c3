package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/health"
	"github.com/dreamlake/lakeshore/agent/internal/process"
	"github.com/dreamlake/lakeshore/agent/internal/process/proctest"
	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestFinishCountsRunsTheLoopSawAbandoned: a body killed by terminate whose
// end the loop handles (runFinished) before it gets to finish is still
// counted in bye's inflight_abandoned.
func TestFinishCountsRunsTheLoopSawAbandoned(t *testing.T) {
	p := apitest.New(t)
	logs := newLogRecorder()
	a, st := newFinishAgent(t, p, logs, nil)
	run := a.runner.Start(wire.RunInvocation{InvocationID: "inv_killed", Attempt: 1, Argv: []string{"sleep", "60"}}, st.sess.workerID)
	r := &running{run: run, session: st.sess}
	st.runs["inv_killed"] = r
	select {
	case <-run.Started():
	case <-time.After(proctest.Wait):
		t.Fatal("the body did not start")
	}
	a.terminate(st)
	select {
	case <-r.run.Done():
	case <-time.After(proctest.Wait):
		t.Fatal("the body did not end after terminate")
	}
	if o := r.run.Outcome(); !o.Abandoned {
		t.Fatalf("outcome %+v; want abandoned", o)
	}
	a.runFinished(context.Background(), st, r) // the loop saw it end first
	if err := a.finish(st); err != nil {
		t.Fatalf("finish: %v", err)
	}
	if rec := exitRecord(t, logs); rec.Attrs["inflight_abandoned"] != int64(1) {
		t.Fatalf("exit %v; want inflight_abandoned 1", rec)
	}
}

// TestFinishDeadlineCoversEveryRun: runs that never end (their leader stuck
// where SIGKILL cannot reach it) are each given up at the one deadline:
// finish returns, counts them abandoned and fails the shutdown.
func TestFinishDeadlineCoversEveryRun(t *testing.T) {
	p := apitest.New(t)
	logs := newLogRecorder()
	a, st := newFinishAgent(t, p, logs, nil)
	a.finishSlack = 100 * time.Millisecond
	a.enter(st, phaseTerminating)
	for _, id := range []string{"inv_stuck_1", "inv_stuck_2"} {
		st.runs[id] = &running{run: &stuckBody{id: id, attempt: 2, done: make(chan struct{})}, session: st.sess}
	}
	done := make(chan error, 1)
	go func() { done <- a.finish(st) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("finish: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("finish still waiting 30 s after its deadline of kill-after + slack")
	}
	if rec := exitRecord(t, logs); rec.Attrs["inflight_abandoned"] != int64(2) {
		t.Fatalf("exit %v; want inflight_abandoned 2", rec)
	}
	if s := a.Health().Snapshot(); s.LiveReason != health.FailedShutdown {
		t.Errorf("live reason %q; want %q", s.LiveReason, health.FailedShutdown)
	}
	errs := logs.find(func(r logRecord) bool {
		return r.Level == slog.LevelError && strings.HasPrefix(r.Msg, "cleanup not confirmed") && r.Attrs["attempt"] == int64(2)
	})
	if len(errs) != 2 {
		t.Fatalf("error records %v; want one for each stuck run", errs)
	}
}

// TestAgentLoopPanicIsARuntimeFailure: a panic in the loop is recovered:
// health reads failed:runtime, the running body is killed, and Run
// returns ErrLoopPanicked (no bye: the worker is left to go stale, as a
// crashed one).
func TestAgentLoopPanicIsARuntimeFailure(t *testing.T) {
	p := apitest.New(t)
	op := operator(p)
	if _, _, err := op.Submit(context.Background(), wire.SubmitRequest{Queue: "q",
		Argv: []string{"/bin/sh", "-c", `echo $$ > "$NYMPH_WORKDIR/pid"; exec sleep 60`}}); err != nil {
		t.Fatal(err)
	}
	logs := newLogRecorder()
	a := newFakeTimeAgent(t, p, "panicky", func(c *Config) {
		c.KillAfter = 200 * time.Millisecond
		c.PollInterval = 100 * time.Millisecond
		c.Logger = logs.logger()
	})
	var bodyPid int
	a.testHookRunStarted = func(id string) { // on the loop's goroutine
		bodyPid = proctest.Pid(t, filepath.Join(a.cfg.Workdir, id, "1", "pid"))
		panic("boom")
	}
	err := a.Run(context.Background())
	if !errors.Is(err, ErrLoopPanicked) {
		t.Fatalf("Run = %v; want ErrLoopPanicked", err)
	}
	if ExitCode(err) != ExitFailure {
		t.Errorf("exit code %d; want %d", ExitCode(err), ExitFailure)
	}
	if s := a.Health().Snapshot(); s.Live || s.LiveReason != health.FailedRuntime || s.Ready {
		t.Errorf("health after a loop panic: ready %v live %v %q; want not live, %q", s.Ready, s.Live, s.LiveReason, health.FailedRuntime)
	}
	proctest.AssertGone(t, "body of the panicked daemon", bodyPid)
	if recs := logs.find(func(r logRecord) bool {
		return r.Level == slog.LevelError && strings.Contains(r.Msg, "panicked") && r.Attrs["panic"] == "boom"
	}); len(recs) != 1 {
		t.Errorf("panic records %v; want one", recs)
	}
	if w := workerOf(t, p, "panicky"); w.State == "gone" {
		t.Errorf("worker %+v; a crashed daemon says no bye", w)
	}
}

// TestAgentStartupErrorIsARuntimeFailure: an error that ends Run before
// the loop (here an unusable state dir) reads failed:runtime.
func TestAgentStartupErrorIsARuntimeFailure(t *testing.T) {
	p := apitest.New(t)
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	a := newFakeTimeAgent(t, p, "bad-state-dir", func(c *Config) { c.StateDir = notDir })
	if err := a.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "state dir") {
		t.Fatalf("Run = %v; want the state dir's error", err)
	}
	if s := a.Health().Snapshot(); s.Live || s.LiveReason != health.FailedRuntime {
		t.Errorf("live = %v %q; want false %q", s.Live, s.LiveReason, health.FailedRuntime)
	}
}

// ackHolder is the daemon's HTTP transport in a test: it holds every ack
// unanswered until opened, and records the order in which acks are answered
// and bye is sent.
type ackHolder struct {
	base     http.RoundTripper
	held     chan struct{} // closed when the first ack is held
	heldOnce sync.Once
	release  chan struct{} // closed by open
	openOnce sync.Once
	mu       sync.Mutex
	events   []string
}

func newAckHolder() *ackHolder {
	return &ackHolder{base: &http.Transport{DisableKeepAlives: true}, held: make(chan struct{}), release: make(chan struct{})}
}

// open lets held acks (and later ones) through.
func (h *ackHolder) open() { h.openOnce.Do(func() { close(h.release) }) }

func (h *ackHolder) record(e string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, e)
}

func (h *ackHolder) log() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.events)
}

func (h *ackHolder) RoundTrip(r *http.Request) (*http.Response, error) {
	switch r.URL.Path {
	case "/v1/daemon/ack":
		h.record("ack held")
		h.heldOnce.Do(func() { close(h.held) })
		select {
		case <-h.release:
		case <-r.Context().Done():
			h.record("ack given up")
			return nil, fmt.Errorf("held ack: %w", r.Context().Err())
		}
		resp, err := h.base.RoundTrip(r)
		if err != nil {
			h.record("ack failed")
			return nil, fmt.Errorf("held ack: %w", err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			h.record("ack failed")
			return nil, fmt.Errorf("held ack: read the answer: %w", err)
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		var ar wire.AckResponse
		_ = json.Unmarshal(body, &ar)
		h.record(fmt.Sprintf("ack answered %d recorded=%v", resp.StatusCode, ar.Recorded))
		return resp, nil
	case "/v1/daemon/bye":
		h.record("bye")
		h.open() // a daemon that did not wait must still be able to end
	}
	return h.base.RoundTrip(r)
}

// TestAgentFlushesAHeldAckBeforeBye: the body has ended and its outcome is
// known, but its ack is held unanswered when the daemon is told to stop.
// The daemon flushes the ack before bye: the control plane answers it
// (recorded) before bye hands anything back, the invocation succeeds at
// attempt 1, and bye's inflight_abandoned is 0. The ack is let through only
// once the final flush has started (a hook), so a daemon that said bye
// without waiting would send it while the ack is still held.
func TestAgentFlushesAHeldAckBeforeBye(t *testing.T) {
	p, srvLogs := shutdownPlane(t)
	op := operator(p)
	ctx := context.Background()
	inv, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	logs := newLogRecorder()
	h := newAckHolder()
	t.Cleanup(h.open)
	a := newFakeTimeAgent(t, p, "held-ack", func(c *Config) {
		c.PollInterval = 100 * time.Millisecond
		c.HTTP = &http.Client{Transport: h, Timeout: requestTimeout}
		c.Logger = logs.logger()
	})
	a.testHookFlushing = h.open
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case <-h.held:
	case <-time.After(30 * time.Second):
		a.Stop()
		a.Stop()
		<-done
		t.Fatal("no ack within 30 s")
	}
	a.Stop() // the ack is still held
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of the stop")
	}
	events := h.log()
	answered := slices.IndexFunc(events, func(e string) bool { return strings.HasPrefix(e, "ack answered") })
	bye := slices.Index(events, "bye")
	if answered < 0 || bye < 0 || answered > bye || events[answered] != "ack answered 200 recorded=true" {
		t.Fatalf("transport events %q; want the held ack answered (200, recorded) before bye", events)
	}
	got, err := op.GetInvocation(ctx, inv.InvocationID)
	if err != nil || got.State != wire.StateSucceeded || got.Attempt != 1 {
		t.Fatalf("invocation %+v %v; want succeeded at attempt 1: its outcome was known before bye", got, err)
	}
	w := workerOf(t, p, "held-ack")
	if b := byeOf(t, srvLogs, w.WorkerID); b.Attrs["inflight_abandoned"] != int64(0) || b.Attrs["reason"] != wire.ByeSignal {
		t.Fatalf("bye %v; want reason signal, inflight_abandoned 0", b)
	}
	if left := logs.find(func(r logRecord) bool { return strings.HasPrefix(r.Msg, "acks still unanswered at bye") }); len(left) != 0 {
		t.Fatalf("logged %v", left)
	}
}

// stuckBody is a run whose leader is stuck where SIGKILL cannot reach it:
// it never ends, and its cleanup is never confirmed.
type stuckBody struct {
	id      string
	attempt int
	done    chan struct{} // never closed
}

func (b *stuckBody) InvocationID() string       { return b.id }
func (b *stuckBody) Attempt() int               { return b.attempt }
func (b *stuckBody) Done() <-chan struct{}      { return b.done }
func (b *stuckBody) Outcome() process.Outcome   { return process.Outcome{} }
func (b *stuckBody) Cancel()                    {}
func (b *stuckBody) Kill()                      {}
func (b *stuckBody) LogFiles() (string, string) { return "", "" }

func (b *stuckBody) Pid() int                            { return 0 }
func (b *stuckBody) Signal(syscall.Signal) bool          { return false }
func (b *stuckBody) Unconfirmed() (pgid int, pids []int) { return 0, nil }
