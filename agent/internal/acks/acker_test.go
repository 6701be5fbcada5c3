package acks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

func TestAckerSubmitRecorded(t *testing.T) {
	plane := apitest.New(t)
	w := ackerTestClaim(t, plane, "machine-1", 1)
	k, s, rec, log := ackerTestNew(t, t.TempDir())

	a := w.ack(0, plane.URL)
	if err := k.Submit(context.Background(), a); err != nil {
		t.Fatalf("Submit: %v", err)
	}
	ackerTestFlush(t, k)

	answers, sleeps := rec.got()
	if len(answers) != 1 || answers[0].err != nil || !answers[0].resp.Recorded || answers[0].resp.State != wire.StateSucceeded {
		t.Fatalf("answers %+v, want one recorded succeeded", answers)
	}
	if len(sleeps) != 0 {
		t.Errorf("slept %v with the control plane up", sleeps)
	}
	if answers[0].ack.SpooledAt.IsZero() {
		t.Error("Submit did not stamp SpooledAt")
	}
	inv := ackerTestInvocation(t, plane, a.Ack.InvocationID)
	if inv.State != wire.StateSucceeded || inv.StdoutTail != "done\n" {
		t.Errorf("invocation reads %+v, want succeeded", inv)
	}
	if n := ackerTestSpoolLen(t, s); n != 0 {
		t.Errorf("spool holds %d acks after the answer", n)
	}
	if p := k.Pending(); len(p) != 0 {
		t.Errorf("Pending = %v after the answer", p)
	}

	var answered map[string]any
	for _, l := range log.lines(t) {
		if l["msg"] == "ack answered" {
			answered = l
		}
	}
	if answered == nil {
		t.Fatalf("no 'ack answered' line:\n%s", log)
	}
	for key, want := range map[string]any{
		"worker_id": w.workerID, "invocation_id": a.Ack.InvocationID, "attempt": float64(a.Ack.Attempt), "recorded": true,
	} {
		if answered[key] != want {
			t.Errorf("log %s = %v, want %v", key, answered[key], want)
		}
	}
	if strings.Contains(log.String(), w.token) {
		t.Errorf("log holds the worker token:\n%s", log)
	}

	// The same attempt again (a retried Submit) is answered recorded:false
	// by the control plane and counts once.
	if err := k.Submit(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	ackerTestFlush(t, k)
	answers, _ = rec.got()
	if len(answers) != 2 || answers[1].resp.Recorded {
		t.Errorf("second ack answered %+v, want recorded:false", answers[len(answers)-1])
	}
}

func TestAckerResendAfterRestart(t *testing.T) {
	plane := apitest.New(t)
	w := ackerTestClaim(t, plane, "machine-1", 2)
	state := t.TempDir()

	// The first process spooled two acks and died before sending them.
	first := spoolTestOpen(t, state)
	for i := range 2 {
		a := w.ack(i, plane.URL)
		a.SpooledAt = time.Now().UTC()
		if err := first.Put(a); err != nil {
			t.Fatal(err)
		}
	}

	// A new process: new Spool over the same dir, new Acker.
	k, s, rec, _ := ackerTestNew(t, state)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := k.Resend(ctx); err != nil {
		t.Fatalf("Resend: %v", err)
	}
	answers, _ := rec.got()
	if len(answers) != 2 {
		t.Fatalf("Resend returned with %d answers, want 2", len(answers))
	}
	for _, a := range answers {
		if a.err != nil || !a.resp.Recorded {
			t.Errorf("resent ack answered %+v, want recorded", a)
		}
	}
	for _, run := range w.claimed {
		if inv := ackerTestInvocation(t, plane, run.InvocationID); inv.State != wire.StateSucceeded {
			t.Errorf("%s reads %s after Resend, want succeeded", run.InvocationID, inv.State)
		}
	}
	if n := ackerTestSpoolLen(t, s); n != 0 {
		t.Errorf("spool holds %d acks after Resend", n)
	}
	if p := k.Pending(); len(p) != 0 {
		t.Errorf("Pending = %v after Resend", p)
	}
	// Nothing left: a second Resend is a no-op.
	if err := k.Resend(ctx); err != nil {
		t.Errorf("empty Resend: %v", err)
	}
}

func TestAckerRetriesUntilAnswered(t *testing.T) {
	cases := []struct {
		name     string
		status   int
		wireBody bool
	}{
		{"503 from the control plane", http.StatusServiceUnavailable, true},
		{"502 from a proxy", http.StatusBadGateway, false},
		{"429 throttled", http.StatusTooManyRequests, false},
		{"500 internal", http.StatusInternalServerError, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plane := apitest.New(t)
			w := ackerTestClaim(t, plane, "machine-1", 1)
			front, flaky := ackerTestFlakyServer(t, plane.URL, 2, tc.status, tc.wireBody)
			k, s, rec, log := ackerTestNew(t, t.TempDir())

			if err := k.Submit(context.Background(), w.ack(0, front.URL)); err != nil {
				t.Fatal(err)
			}
			ackerTestFlush(t, k)

			answers, sleeps := rec.got()
			if len(answers) != 1 || answers[0].err != nil || !answers[0].resp.Recorded {
				t.Fatalf("answers %+v, want one recorded", answers)
			}
			if got := flaky.acks.Load(); got != 3 {
				t.Errorf("%d ack requests, want 3 (two failures, one answer)", got)
			}
			// Full jitter at rand 0.5 over caps of 200 ms, then 400 ms.
			if want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}; !slices.Equal(sleeps, want) {
				t.Errorf("slept %v, want %v", sleeps, want)
			}
			if n := ackerTestSpoolLen(t, s); n != 0 {
				t.Errorf("spool holds %d acks", n)
			}
			if strings.Contains(log.String(), w.token) {
				t.Errorf("log holds the worker token:\n%s", log)
			}
		})
	}
}

func TestAckerRetriesAHungTry(t *testing.T) {
	var tries atomic.Int32
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the body: only then does the server notice the client
		// hanging up and cancel r.Context.
		_, _ = io.Copy(io.Discard, r.Body)
		if tries.Add(1) == 1 {
			select { // hang until the acker gives this try up
			case <-r.Context().Done():
			case <-done:
			}
			return
		}
		_ = json.NewEncoder(w).Encode(wire.AckResponse{Recorded: true, State: wire.StateSucceeded})
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(done) })
	rec := &ackerTestRecorder{}
	s := spoolTestOpen(t, t.TempDir())
	k := New(s, Options{
		AttemptTimeout: 50 * time.Millisecond, Sleep: rec.sleep, OnAnswered: rec.onAnswered,
		Logger: (&spoolTestLog{}).logger(),
	})
	if err := k.Submit(context.Background(), ackerTestAt(spoolTestAck("inv_01HUNG", 1, time.Time{}), srv.URL)); err != nil {
		t.Fatal(err)
	}
	ackerTestFlush(t, k)
	answers, _ := rec.got()
	if len(answers) != 1 || answers[0].err != nil || !answers[0].resp.Recorded {
		t.Fatalf("answers %+v, want recorded after a timed-out try", answers)
	}
	if tries.Load() != 2 {
		t.Errorf("%d tries, want 2", tries.Load())
	}
}

// ackerTestAt reports a sent to url.
func ackerTestAt(a SpooledAck, url string) SpooledAck {
	a.ControlPlane = url
	return a
}

func TestAckerForbiddenIsDropped(t *testing.T) {
	plane := apitest.New(t)
	owner := ackerTestClaim(t, plane, "machine-1", 1)
	other := ackerTestClaim(t, plane, "machine-2", 0)
	k, s, rec, log := ackerTestNew(t, t.TempDir())

	// The other worker's token acking the owner's invocation: 403.
	a := owner.ack(0, plane.URL)
	a.Token = other.token
	ackerTestRefused(t, k, s, rec, log, plane, a, wire.ErrForbidden, func(l map[string]any) bool {
		return l["code"] == string(wire.CodeForbidden) && l["status"] == float64(403)
	})
	for _, tok := range []string{owner.token, other.token} {
		if strings.Contains(log.String(), tok) {
			t.Errorf("log holds a worker token:\n%s", log)
		}
	}
}

func TestAckerFinalAnswersAreDropped(t *testing.T) {
	for _, status := range []int{400, 401, 403, 404, 409, 410, 413} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			var tries atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tries.Add(1)
				http.Error(w, "no", status)
			}))
			t.Cleanup(srv.Close)
			k, s, rec, log := ackerTestNew(t, t.TempDir())
			if err := k.Submit(context.Background(), ackerTestAt(spoolTestAck("inv_01FINAL", 1, time.Time{}), srv.URL)); err != nil {
				t.Fatal(err)
			}
			ackerTestFlush(t, k)
			answers, sleeps := rec.got()
			if len(answers) != 1 || answers[0].err == nil || wire.Status(wire.CodeOf(answers[0].err)) != status {
				t.Fatalf("answers %+v, want one error with status %d", answers, status)
			}
			if tries.Load() != 1 || len(sleeps) != 0 {
				t.Errorf("%d tries and sleeps %v, want one try", tries.Load(), sleeps)
			}
			if n := ackerTestSpoolLen(t, s); n != 0 {
				t.Errorf("spool holds %d acks", n)
			}
			if strings.Contains(log.String(), "secret-worker-token") {
				t.Errorf("log holds the token:\n%s", log)
			}
		})
	}
}

func TestAckerPendingAndFlush(t *testing.T) {
	arrived := make(chan string, 4)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req wire.AckRequest
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &req)
		arrived <- req.InvocationID
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_ = json.NewEncoder(w).Encode(wire.AckResponse{Recorded: true, State: req.State})
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	k, s, rec, _ := ackerTestNew(t, t.TempDir())

	if got := k.Flush(context.Background()); got != 0 {
		t.Errorf("Flush with nothing pending = %d", got)
	}
	for _, id := range []string{"inv_01B", "inv_01A"} {
		if err := k.Submit(context.Background(), ackerTestAt(spoolTestAck(id, 1, time.Time{}), srv.URL)); err != nil {
			t.Fatal(err)
		}
	}
	// A duplicate of a pending attempt changes nothing.
	dup := ackerTestAt(spoolTestAck("inv_01A", 1, time.Time{}), srv.URL)
	dup.Ack.State = wire.StateCancelled
	if err := k.Submit(context.Background(), dup); err != nil {
		t.Fatal(err)
	}
	// Submit returned: both are on disk before any answer.
	if n := ackerTestSpoolLen(t, s); n != 2 {
		t.Errorf("spool holds %d acks right after Submit, want 2", n)
	}
	for range 2 {
		<-arrived
	}
	if got, want := k.Pending(), []string{"inv_01A", "inv_01B"}; !slices.Equal(got, want) {
		t.Errorf("Pending = %v, want %v", got, want)
	}
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if got := k.Flush(short); got != 2 {
		t.Errorf("Flush with both held = %d, want 2", got)
	}

	close(release)
	ackerTestFlush(t, k)
	if p := k.Pending(); len(p) != 0 {
		t.Errorf("Pending = %v after Flush", p)
	}
	answers, _ := rec.got()
	if len(answers) != 2 {
		t.Fatalf("answers %+v, want 2", answers)
	}
	for _, a := range answers {
		if a.ack.Ack.InvocationID == "inv_01A" && a.resp.State != wire.StateFailed {
			t.Errorf("inv_01A answered %+v: the duplicate Submit replaced the first outcome", a.resp)
		}
	}
	if n := ackerTestSpoolLen(t, s); n != 0 {
		t.Errorf("spool holds %d acks after Flush", n)
	}
}

func TestAckerContextEndLeavesSpoolForResend(t *testing.T) {
	var up atomic.Bool
	tried := make(chan struct{}, 100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case tried <- struct{}{}:
		default:
		}
		if !up.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		_ = json.NewEncoder(w).Encode(wire.AckResponse{Recorded: true, State: wire.StateFailed})
	}))
	t.Cleanup(srv.Close)
	state := t.TempDir()
	var log spoolTestLog
	rec := &ackerTestRecorder{}
	var fast atomic.Bool
	s := spoolTestOpen(t, state)
	k := New(s, Options{
		Logger:     log.logger(),
		OnAnswered: rec.onAnswered,
		// Until fast is set a wait between tries lasts until ctx ends, so
		// only ctx stops the sender.
		Sleep: func(ctx context.Context, d time.Duration) error {
			if fast.Load() {
				return ctx.Err()
			}
			<-ctx.Done()
			return ctx.Err()
		},
	})

	ctx, cancel := context.WithCancel(context.Background())
	if err := k.Submit(ctx, ackerTestAt(spoolTestAck("inv_01LATE", 1, time.Time{}), srv.URL)); err != nil {
		t.Fatal(err)
	}
	<-tried
	cancel()
	ackerTestFlush(t, k) // the sender gives up; nothing is being sent
	if answers, _ := rec.got(); len(answers) != 0 {
		t.Errorf("answers %+v after ctx ended unanswered", answers)
	}
	if n := ackerTestSpoolLen(t, s); n != 1 {
		t.Fatalf("spool holds %d acks, want the unanswered one", n)
	}

	// A bounded Resend while the control plane is still down gives up and
	// says so; the ack stays spooled.
	shortCtx, shortCancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer shortCancel()
	if err := k.Resend(shortCtx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Resend against a down control plane = %v, want deadline exceeded", err)
	}

	// The next Resend (here on the same Acker, possibly while the first
	// one's sender is still stopping) delivers it once the plane is back.
	up.Store(true)
	fast.Store(true)
	long, longCancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer longCancel()
	if err := k.Resend(long); err != nil {
		t.Fatalf("Resend: %v", err)
	}
	if answers, _ := rec.got(); len(answers) != 1 || !answers[0].resp.Recorded {
		t.Errorf("answers %+v, want one recorded", answers)
	}
	if n := ackerTestSpoolLen(t, s); n != 0 {
		t.Errorf("spool holds %d acks after Resend", n)
	}
}
