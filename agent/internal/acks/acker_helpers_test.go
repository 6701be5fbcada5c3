package acks

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/process"
	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// ackerTestWorker is a daemon that said hello to a test control plane and
// claimed invocations.
type ackerTestWorker struct {
	plane    *apitest.Plane
	workerID string
	token    string
	claimed  []*wire.RunInvocation
}

// ackerTestClaim says hello as machine on plane, submits n invocations and
// claims them with a ready poll.
func ackerTestClaim(t *testing.T, plane *apitest.Plane, machine string, n int) ackerTestWorker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	enroll := client.New(plane.URL, apitest.EnrollToken)
	capacity := 10
	h, err := enroll.Hello(ctx, wire.HelloRequest{
		MachineID: machine, BootID: "boot-1", Lanes: []string{"default"},
		Capabilities: wire.Capabilities{MaxConcurrency: &capacity},
	})
	if err != nil {
		t.Fatalf("hello: %v", err)
	}
	op := client.New(plane.URL, apitest.OperatorToken)
	for range n {
		if _, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "default", Argv: []string{"true"}}); err != nil {
			t.Fatalf("submit: %v", err)
		}
	}
	w := ackerTestWorker{plane: plane, workerID: h.WorkerID, token: h.Token}
	wc := enroll.WithToken(h.Token)
	for len(w.claimed) < n {
		resp, err := wc.Poll(ctx, wire.PollRequest{WorkerID: h.WorkerID, Queue: "default", Phase: wire.PhaseReady})
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		for _, c := range resp.Commands {
			if c.Type == wire.CommandRun {
				w.claimed = append(w.claimed, c.Invocation)
			}
		}
	}
	return w
}

// ack reports the spooled ack of the i-th claimed invocation, sent to url.
func (w ackerTestWorker) ack(i int, url string) SpooledAck {
	code := 0
	run := w.claimed[i]
	return SpooledAck{
		ControlPlane: url,
		WorkerID:     w.workerID,
		Token:        w.token,
		Ack: process.Outcome{State: wire.StateSucceeded, ExitCode: &code, StdoutTail: "done\n"}.
			Ack(w.workerID, run.InvocationID, run.Attempt, wire.PhaseReady),
	}
}

// invocation reads an invocation as the operator sees it.
func ackerTestInvocation(t *testing.T, plane *apitest.Plane, id string) wire.Invocation {
	t.Helper()
	inv, err := client.New(plane.URL, apitest.OperatorToken).GetInvocation(context.Background(), id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return inv
}

// ackerTestAnswer is one OnAnswered call.
type ackerTestAnswer struct {
	ack  SpooledAck
	resp wire.AckResponse
	err  error
}

// ackerTestRecorder collects OnAnswered calls and instant sleeps.
type ackerTestRecorder struct {
	mu      sync.Mutex
	answers []ackerTestAnswer
	sleeps  []time.Duration
}

func (r *ackerTestRecorder) onAnswered(a SpooledAck, resp wire.AckResponse, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answers = append(r.answers, ackerTestAnswer{a, resp, err})
}

func (r *ackerTestRecorder) sleep(ctx context.Context, d time.Duration) error {
	r.mu.Lock()
	r.sleeps = append(r.sleeps, d)
	r.mu.Unlock()
	return ctx.Err()
}

func (r *ackerTestRecorder) got() ([]ackerTestAnswer, []time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.answers), slices.Clone(r.sleeps)
}

// ackerTestNew returns an Acker over a fresh spool with instant sleeps,
// jitter fixed at one half, and its recorder and log.
func ackerTestNew(t *testing.T, stateDir string) (*Acker, *Spool, *ackerTestRecorder, *spoolTestLog) {
	t.Helper()
	var log spoolTestLog
	rec := &ackerTestRecorder{}
	s := spoolTestOpen(t, stateDir, WithSpoolLogger(log.logger()))
	k := New(s, Options{
		Logger:     log.logger(),
		Sleep:      rec.sleep,
		Rand:       func() float64 { return 0.5 },
		OnAnswered: rec.onAnswered,
	})
	return k, s, rec, &log
}

func ackerTestFlush(t *testing.T, k *Acker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if left := k.Flush(ctx); left != 0 {
		t.Fatalf("Flush left %d acks pending (%v)", left, k.Pending())
	}
}

func ackerTestSpoolLen(t *testing.T, s *Spool) int {
	t.Helper()
	acks, err := s.List()
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return len(acks)
}

// ackerTestFlaky fronts target and answers the first fail acks with
// status (a wire error body when wireBody) instead of passing them on.
type ackerTestFlaky struct {
	acks atomic.Int32
}

func ackerTestFlakyServer(t *testing.T, target string, fail int, status int, wireBody bool) (*httptest.Server, *ackerTestFlaky) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	f := &ackerTestFlaky{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/daemon/ack" && int(f.acks.Add(1)) <= fail {
			if wireBody {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				_ = json.NewEncoder(w).Encode(wire.ErrorBody{Error: wire.ErrorDetail{Code: wire.CodeUnavailable, Message: "store did not answer"}})
				return
			}
			http.Error(w, "<html>upstream trouble</html>", status)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, f
}

// ackerTestRefused submits a to k, which the control plane answers with a
// final refusal matching want, and checks what a refusal leaves: one
// answer, no retry, nothing spooled, the invocation still running, and a
// warning line of its invocation that warned accepts.
func ackerTestRefused(t *testing.T, k *Acker, s *Spool, rec *ackerTestRecorder, log *spoolTestLog, plane *apitest.Plane,
	a SpooledAck, want error, warned func(line map[string]any) bool) {
	t.Helper()
	if err := k.Submit(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	ackerTestFlush(t, k)
	answers, sleeps := rec.got()
	if len(answers) != 1 || !errors.Is(answers[0].err, want) {
		t.Fatalf("answers %+v, want one %v", answers, want)
	}
	if len(sleeps) != 0 {
		t.Errorf("a final refusal was retried (slept %v)", sleeps)
	}
	if n := ackerTestSpoolLen(t, s); n != 0 {
		t.Errorf("spool holds %d acks after a final refusal", n)
	}
	if inv := ackerTestInvocation(t, plane, a.Ack.InvocationID); inv.State != wire.StateRunning {
		t.Errorf("invocation reads %s after a refused ack, want running", inv.State)
	}
	for _, l := range log.lines(t) {
		if l["level"] == "WARN" && l["invocation_id"] == a.Ack.InvocationID && warned(l) {
			return
		}
	}
	t.Errorf("no warning of the refusal:\n%s", log)
}
