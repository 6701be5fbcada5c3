package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

const (
	enrollToken   = apitest.EnrollToken
	operatorToken = apitest.OperatorToken
)

// controlPlane serves the real router over a fresh embedded store on
// 127.0.0.1 and returns its URL.
func controlPlane(t *testing.T) string {
	t.Helper()
	return apitest.New(t).URL
}

func ptr[T any](v T) *T { return &v }

// hello enrolls a daemon on machine and returns a client holding its worker
// token and its worker id.
func hello(t *testing.T, base, machine string) (*client.Client, string) {
	t.Helper()
	enroll := client.New(base, enrollToken)
	res, err := enroll.Hello(t.Context(), wire.HelloRequest{
		MachineID:    machine,
		BootID:       "boot-1",
		Label:        machine,
		Lanes:        []string{"default"},
		Capabilities: wire.Capabilities{MaxConcurrency: ptr(1)},
	})
	if err != nil {
		t.Fatalf("hello: %v", err)
	}
	if !strings.HasPrefix(res.WorkerID, "wrk_") || res.Token == "" || res.StaleAfterS <= 0 || res.PollIntervalS <= 0 {
		t.Fatalf("hello answer = %+v", res)
	}
	return enroll.WithToken(res.Token), res.WorkerID
}

func TestFullFlow(t *testing.T) {
	base := controlPlane(t)
	ctx := t.Context()
	op := client.New(base, operatorToken, client.WithUserAgent("client-test"))

	h, err := op.Healthz(ctx)
	if err != nil || h.Status != "ok" {
		t.Fatalf("healthz = %+v, %v", h, err)
	}

	// Submit, then replay the same idempotency key.
	sub := wire.SubmitRequest{Queue: "default", Argv: []string{"echo", "hi"}, IdempotencyKey: "k1",
		Env: map[string]string{"A": "1"}, TimeoutS: 30}
	inv, created, err := op.Submit(ctx, sub)
	if err != nil || !created || inv.State != wire.StateQueued || !strings.HasPrefix(inv.InvocationID, "inv_") {
		t.Fatalf("submit = %+v, created %v, %v", inv, created, err)
	}
	again, created, err := op.Submit(ctx, sub)
	if err != nil || created || again.InvocationID != inv.InvocationID {
		t.Fatalf("replayed submit = %s, created %v, %v; want %s, false", again.InvocationID, created, err, inv.InvocationID)
	}
	got, err := op.GetInvocation(ctx, inv.InvocationID)
	if err != nil || got.State != wire.StateQueued || got.MaxAttempts != wire.DefaultMaxAttempts || got.Env["A"] != wire.Redacted {
		t.Fatalf("get = %+v, %v", got, err)
	}
	list, err := op.ListInvocations(ctx, client.ListInvocationsParams{Queue: "default", State: wire.StateQueued})
	if err != nil || len(list.Invocations) != 1 || list.Invocations[0].InvocationID != inv.InvocationID {
		t.Fatalf("list = %+v, %v", list, err)
	}

	// A daemon enrolls, claims it and acks it.
	daemon, workerID := hello(t, base, "m1")
	poll, err := daemon.Poll(ctx, wire.PollRequest{WorkerID: workerID, Queue: "default", Phase: wire.PhaseReady})
	if err != nil {
		t.Fatalf("poll: %v", err)
	}
	if len(poll.Commands) != 1 || poll.Commands[0].Type != wire.CommandRun ||
		poll.Commands[0].Invocation.InvocationID != inv.InvocationID || poll.Commands[0].Invocation.Attempt != 1 ||
		poll.Commands[0].Invocation.Env["A"] != "1" {
		t.Fatalf("poll commands = %+v (the worker gets the env values the operator view redacts)", poll.Commands)
	}
	w, err := op.GetWorker(ctx, workerID)
	if err != nil || w.WorkerID != workerID || w.State != "active" || w.Label != "m1" {
		t.Fatalf("get worker = %+v, %v", w, err)
	}
	workers, err := op.ListWorkers(ctx, 10, "")
	if err != nil || len(workers.Workers) != 1 || workers.Workers[0].WorkerID != workerID {
		t.Fatalf("list workers = %+v, %v", workers, err)
	}
	running, err := op.GetInvocation(ctx, inv.InvocationID)
	if err != nil || running.State != wire.StateRunning || running.WorkerID != workerID {
		t.Fatalf("running invocation = %+v, %v", running, err)
	}

	ack := wire.AckRequest{WorkerID: workerID, InvocationID: inv.InvocationID, Attempt: 1,
		State: wire.StateSucceeded, ExitCode: ptr(0), ResultBlob: []byte(`{"n":1}`), StdoutTail: "hi\n"}
	ar, err := daemon.Ack(ctx, ack)
	if err != nil || !ar.Recorded || ar.State != wire.StateSucceeded {
		t.Fatalf("ack = %+v, %v", ar, err)
	}
	ar, err = daemon.Ack(ctx, ack)
	if err != nil || ar.Recorded {
		t.Fatalf("second ack = %+v, %v; want recorded false", ar, err)
	}
	done, err := op.GetInvocation(ctx, inv.InvocationID)
	if err != nil || done.State != wire.StateSucceeded || done.ExitCode == nil || *done.ExitCode != 0 ||
		string(done.ResultBlob) != `{"n":1}` || done.FinishedAt == nil {
		t.Fatalf("finished invocation = %+v, %v", done, err)
	}

	// Cancel a queued one.
	queued, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "default", Argv: []string{"sleep", "1"}})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	cancelled, err := op.CancelInvocation(ctx, queued.InvocationID)
	if err != nil || cancelled.State != wire.StateCancelled {
		t.Fatalf("cancel = %+v, %v", cancelled, err)
	}
	stats, err := op.QueueStats(ctx, "default")
	if err != nil || stats.DoneCount != 2 || stats.Counts[wire.StateSucceeded] != 1 || stats.Counts[wire.StateCancelled] != 1 {
		t.Fatalf("queue stats = %+v, %v", stats, err)
	}

	// Setup: queued by the operator, handed out on poll, reported back.
	acc, err := op.AddSetup(ctx, workerID, []string{"true"})
	if err != nil || !strings.HasPrefix(acc.CommandID, "cmd_") {
		t.Fatalf("add setup = %+v, %v", acc, err)
	}
	poll, err = daemon.Poll(ctx, wire.PollRequest{WorkerID: workerID, Queue: "default", Phase: wire.PhaseReady})
	if err != nil || len(poll.Commands) != 1 || poll.Commands[0].Type != wire.CommandSetup || poll.Commands[0].CommandID != acc.CommandID {
		t.Fatalf("poll after setup = %+v, %v", poll, err)
	}
	_, err = daemon.Poll(ctx, wire.PollRequest{WorkerID: workerID, Queue: "default", Phase: wire.PhaseReady,
		SetupResults: []wire.SetupResult{{CommandID: acc.CommandID, Status: wire.SetupSucceeded, DurationMS: 5}}})
	if err != nil {
		t.Fatalf("poll with setup result: %v", err)
	}
	sr, err := op.SetupResults(ctx, workerID)
	if err != nil || sr.WorkerID != workerID || len(sr.SetupResults) != 1 || sr.SetupResults[0].Status != wire.SetupSucceeded {
		t.Fatalf("setup results = %+v, %v", sr, err)
	}

	// Drain: the next poll carries the command.
	dr, err := op.DrainWorker(ctx, workerID)
	if err != nil || dr.WorkerID != workerID || dr.State != "draining" {
		t.Fatalf("drain = %+v, %v", dr, err)
	}
	poll, err = daemon.Poll(ctx, wire.PollRequest{WorkerID: workerID, Queue: "default", Phase: wire.PhaseReady})
	if err != nil || len(poll.Commands) != 1 || poll.Commands[0].Type != wire.CommandDrain {
		t.Fatalf("poll after drain = %+v, %v", poll, err)
	}

	// Bye, and the worker is gone: its next poll is 410.
	if err := daemon.Bye(ctx, wire.ByeRequest{WorkerID: workerID, Reason: wire.ByeDrain}); err != nil {
		t.Fatalf("bye: %v", err)
	}
	_, err = daemon.Poll(ctx, wire.PollRequest{WorkerID: workerID, Queue: "default"})
	if !errors.Is(err, wire.ErrWorkerGone) {
		t.Fatalf("poll after bye: err = %v, want worker_gone", err)
	}
}

func TestListPaging(t *testing.T) {
	base := controlPlane(t)
	ctx := t.Context()
	op := client.New(base, operatorToken)
	want := map[string]bool{}
	for range 5 {
		inv, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "paged", Argv: []string{"true"}})
		if err != nil {
			t.Fatalf("submit: %v", err)
		}
		want[inv.InvocationID] = true
	}
	for _, queue := range []string{"paged", ""} { // a query, then a scan
		seen := map[string]bool{}
		cursor := ""
		for pages := 0; ; pages++ {
			if pages > 10 {
				t.Fatalf("queue %q: cursor never ran out", queue)
			}
			page, err := op.ListInvocations(ctx, client.ListInvocationsParams{Queue: queue, Limit: 2, Cursor: cursor})
			if err != nil {
				t.Fatalf("list: %v", err)
			}
			if len(page.Invocations) > 2 {
				t.Fatalf("page of %d with limit 2", len(page.Invocations))
			}
			for _, inv := range page.Invocations {
				if seen[inv.InvocationID] {
					t.Fatalf("queue %q: %s listed twice", queue, inv.InvocationID)
				}
				seen[inv.InvocationID] = true
			}
			if cursor = page.NextCursor; cursor == "" {
				break
			}
		}
		if len(seen) != len(want) {
			t.Fatalf("queue %q: listed %d invocations, want %d", queue, len(seen), len(want))
		}
	}
}

// checkCode asserts err is an unwrapped *wire.Error of code that does not
// quote any token.
func checkCode(t *testing.T, what string, err error, sentinel *wire.Error) {
	t.Helper()
	we, ok := err.(*wire.Error)
	if !ok {
		t.Fatalf("%s: err = %T %v, want *wire.Error", what, err, err)
	}
	if !errors.Is(err, sentinel) {
		t.Fatalf("%s: code %q, want %q (%v)", what, we.Code, sentinel.Code, err)
	}
	if we.Message == "" {
		t.Errorf("%s: empty message", what)
	}
	for _, tok := range []string{enrollToken, operatorToken, "wtk_"} {
		if strings.Contains(err.Error(), tok) {
			t.Errorf("%s: error %q quotes a token", what, err)
		}
	}
}

func TestErrorAnswers(t *testing.T) {
	base := controlPlane(t)
	ctx := t.Context()
	op := client.New(base, operatorToken)
	daemonA, idA := hello(t, base, "mA")
	_, idB := hello(t, base, "mB")

	_, err := client.New(base, "wrong-token").GetInvocation(ctx, "inv_01J00000000000000000000000")
	checkCode(t, "bad operator token", err, wire.ErrUnauthorized)

	_, err = op.WithToken("").ListWorkers(ctx, 0, "")
	checkCode(t, "no token", err, wire.ErrUnauthorized)

	_, err = op.Hello(ctx, wire.HelloRequest{MachineID: "m", BootID: "b"})
	checkCode(t, "hello with the operator token", err, wire.ErrUnauthorized)

	_, err = daemonA.Poll(ctx, wire.PollRequest{WorkerID: idB})
	checkCode(t, "poll for another worker", err, wire.ErrForbidden)

	_, err = op.GetInvocation(ctx, "inv_01J00000000000000000000000")
	checkCode(t, "unknown invocation", err, wire.ErrNotFound)

	_, err = op.GetWorker(ctx, "wrk_01J00000000000000000000000")
	checkCode(t, "unknown worker", err, wire.ErrNotFound)

	_, err = op.GetInvocation(ctx, "not-an-id")
	checkCode(t, "malformed id", err, wire.ErrInvalid)

	_, _, err = op.Submit(ctx, wire.SubmitRequest{Queue: "default"})
	checkCode(t, "submit without argv", err, wire.ErrInvalid)

	inv, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "default", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.CancelInvocation(ctx, inv.InvocationID); err != nil {
		t.Fatal(err)
	}
	_, err = op.CancelInvocation(ctx, inv.InvocationID)
	checkCode(t, "cancel a cancelled invocation", err, wire.ErrConflict)

	if err := daemonA.Bye(ctx, wire.ByeRequest{WorkerID: idA, Reason: wire.ByeIdle}); err != nil {
		t.Fatalf("bye: %v", err)
	}
	_, err = daemonA.Poll(ctx, wire.PollRequest{WorkerID: idA})
	checkCode(t, "poll after bye", err, wire.ErrWorkerGone)
	if client.Retryable(err) {
		t.Errorf("Retryable(410) = true")
	}
}

func TestNonJSONErrorBodies(t *testing.T) {
	long := strings.Repeat("x", 5000)
	cases := []struct {
		name   string
		status int
		body   string
		want   wire.Code
	}{
		{"bad gateway page", http.StatusBadGateway, "<html>\n<h1>502 Bad Gateway</h1></html>", wire.CodeUnavailable},
		{"unavailable", http.StatusServiceUnavailable, "try later", wire.CodeUnavailable},
		{"gateway timeout", http.StatusGatewayTimeout, "", wire.CodeUnavailable},
		{"throttled", http.StatusTooManyRequests, `{"message":"Too Many Requests"}`, wire.CodeUnavailable},
		{"internal", http.StatusInternalServerError, long, wire.CodeInternal},
		{"api gateway 401", http.StatusUnauthorized, `{"message":"Unauthorized"}`, wire.CodeUnauthorized},
		{"proxy 404", http.StatusNotFound, "not found", wire.CodeNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			}))
			defer hs.Close()
			_, err := client.New(hs.URL, "tok").Healthz(t.Context())
			we, ok := err.(*wire.Error)
			if !ok {
				t.Fatalf("err = %T %v, want *wire.Error", err, err)
			}
			if we.Code != tc.want {
				t.Fatalf("code = %q, want %q (%v)", we.Code, tc.want, err)
			}
			if len(we.Message) > 300 {
				t.Errorf("message not clipped: %d bytes", len(we.Message))
			}
			if strings.Contains(we.Message, "\n") {
				t.Errorf("message has a newline: %q", we.Message)
			}
			if got, want := client.Retryable(err), wire.Status(tc.want) >= 500; got != want {
				t.Errorf("Retryable = %v, want %v", got, want)
			}
		})
	}
}

func TestRequestHeaders(t *testing.T) {
	type seen struct{ auth, ua, ctype, path, query string }
	got := make(chan seen, 1)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.Header.Get("Authorization"), r.Header.Get("User-Agent"), r.Header.Get("Content-Type"), r.URL.Path, r.URL.RawQuery}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"invocations":[],"next_cursor":"c2","added_later":true}`)
	}))
	defer hs.Close()
	c := client.New(hs.URL+"/stage/", "tok-1", client.WithUserAgent("nymph/test"), client.WithHTTPClient(hs.Client()))
	list, err := c.ListInvocations(t.Context(), client.ListInvocationsParams{Queue: "q", State: "queued", Limit: 7, Cursor: "c1"})
	if err != nil || list.NextCursor != "c2" {
		t.Fatalf("list = %+v, %v", list, err)
	}
	s := <-got
	if s.auth != "Bearer tok-1" || s.ua != "nymph/test" || s.path != "/stage/v1/invocations" ||
		s.query != "cursor=c1&limit=7&queue=q&state=queued" {
		t.Fatalf("request = %+v", s)
	}

	c2 := c.WithToken("tok-2")
	if err := c2.Bye(t.Context(), wire.ByeRequest{}); err != nil {
		t.Fatal(err)
	}
	s = <-got
	if s.auth != "Bearer tok-2" || s.ctype != "application/json" || c.Token != "tok-1" {
		t.Fatalf("WithToken: request %+v, original token %q", s, c.Token)
	}
}

func TestTransportErrors(t *testing.T) {
	hs := httptest.NewServer(http.NotFoundHandler())
	base := hs.URL
	hs.Close()
	c := client.New(base, "very-secret-token")
	_, err := c.Poll(t.Context(), wire.PollRequest{WorkerID: "wrk_x"})
	if err == nil || !strings.HasPrefix(err.Error(), "poll: ") {
		t.Fatalf("err = %v, want a poll: transport error", err)
	}
	if strings.Contains(err.Error(), "very-secret-token") {
		t.Fatalf("error quotes the token: %v", err)
	}
	if _, ok := err.(*wire.Error); ok {
		t.Fatalf("transport error is a *wire.Error: %v", err)
	}
	if !client.Retryable(err) {
		t.Errorf("Retryable(transport error) = false")
	}
}

func TestContextCancel(t *testing.T) {
	release := make(chan struct{})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer hs.Close()
	defer close(release)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := client.New(hs.URL, "tok").Poll(ctx, wire.PollRequest{WorkerID: "wrk_x", TimeoutS: 20})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("poll ignored its context for %s", time.Since(start))
	}
	if client.Retryable(err) {
		t.Errorf("Retryable(deadline) = true")
	}
}

func TestBadSuccessBody(t *testing.T) {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "<html>ok</html>")
	}))
	defer hs.Close()
	_, err := client.New(hs.URL, "tok").GetWorker(t.Context(), "wrk_x")
	if err == nil || !strings.HasPrefix(err.Error(), "get worker: decode answer") {
		t.Fatalf("err = %v", err)
	}
}
