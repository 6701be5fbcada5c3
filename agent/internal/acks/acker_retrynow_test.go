package acks

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// ackerTestOutage is a control plane that answers acks 503 while up is
// unset when they arrive, and counts the failures; hold, when set, holds
// each try (after it is decided) until it is closed.
type ackerTestOutage struct {
	up, failed atomic.Int32
	hold       chan struct{}
	arrived    chan struct{} // one send per try, before it is held
}

func ackerTestOutageServer(t *testing.T, o *ackerTestOutage) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		up := o.up.Load() != 0
		if o.arrived != nil {
			o.arrived <- struct{}{}
		}
		if o.hold != nil {
			<-o.hold
		}
		if !up {
			o.failed.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(wire.ErrorBody{Error: wire.ErrorDetail{Code: wire.CodeUnavailable, Message: "down"}})
			return
		}
		_ = json.NewEncoder(w).Encode(wire.AckResponse{Recorded: true, State: wire.StateSucceeded})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// ackerTestSlowAcker is an Acker whose backoff is an hour on real timers:
// an ack answered within the test was retried early, never waited out.
func ackerTestSlowAcker(t *testing.T) (*Acker, *ackerTestRecorder, context.Context) {
	t.Helper()
	rec := &ackerTestRecorder{}
	k := New(spoolTestOpen(t, t.TempDir()), Options{
		MinBackoff: time.Hour, MaxBackoff: time.Hour, Rand: func() float64 { return 0.99 },
		OnAnswered: rec.onAnswered, Logger: (&spoolTestLog{}).logger(),
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // senders still waiting when a test fails give up
	return k, rec, ctx
}

// ackerTestWaitFailed waits (bounded) until o has failed n tries.
func ackerTestWaitFailed(t *testing.T, o *ackerTestOutage, n int32) {
	t.Helper()
	waittest.UntilState(t, 20*time.Second, fmt.Sprintf("%d failed tries", n), func() (bool, string) {
		failed := o.failed.Load()
		return failed >= n, fmt.Sprintf("%d tries failed", failed)
	})
}

// TestAckerRetryNowCutsTheBackoff: acks waiting out a long backoff after
// an outage are all tried again the moment RetryNow says the control
// plane answered another request.
func TestAckerRetryNowCutsTheBackoff(t *testing.T) {
	o := &ackerTestOutage{}
	srv := ackerTestOutageServer(t, o)
	k, rec, ctx := ackerTestSlowAcker(t)
	for i := range 3 {
		if err := k.Submit(ctx, ackerTestAt(spoolTestAck(fmt.Sprintf("inv_01WAIT%d", i), 1, time.Time{}), srv.URL)); err != nil {
			t.Fatal(err)
		}
	}
	ackerTestWaitFailed(t, o, 3)
	o.up.Store(1)
	k.RetryNow()
	ackerTestFlush(t, k)
	if answers, _ := rec.got(); len(answers) != 3 {
		t.Fatalf("answers %+v; want all three", answers)
	}
}

// TestAckerAnAnsweredAckRetriesTheOthers: the first ack the control plane
// answers after an outage brings the queued ones with it.
func TestAckerAnAnsweredAckRetriesTheOthers(t *testing.T) {
	o := &ackerTestOutage{}
	srv := ackerTestOutageServer(t, o)
	k, rec, ctx := ackerTestSlowAcker(t)
	for i := range 2 {
		if err := k.Submit(ctx, ackerTestAt(spoolTestAck(fmt.Sprintf("inv_01QUEUED%d", i), 1, time.Time{}), srv.URL)); err != nil {
			t.Fatal(err)
		}
	}
	ackerTestWaitFailed(t, o, 2)
	o.up.Store(1)
	if err := k.Submit(ctx, ackerTestAt(spoolTestAck("inv_01FRESH", 1, time.Time{}), srv.URL)); err != nil {
		t.Fatal(err)
	}
	ackerTestFlush(t, k)
	if answers, _ := rec.got(); len(answers) != 3 {
		t.Fatalf("answers %+v; want all three", answers)
	}
}

// TestAckerRetryNowDuringATry: a RetryNow that comes while a try is under
// way (and about to fail) is not lost: the ack goes again at once.
func TestAckerRetryNowDuringATry(t *testing.T) {
	o := &ackerTestOutage{hold: make(chan struct{}), arrived: make(chan struct{}, 4)}
	srv := ackerTestOutageServer(t, o)
	k, rec, ctx := ackerTestSlowAcker(t)
	if err := k.Submit(ctx, ackerTestAt(spoolTestAck("inv_01INFLIGHT", 1, time.Time{}), srv.URL)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-o.arrived:
	case <-time.After(20 * time.Second):
		t.Fatal("the ack was not tried")
	}
	k.RetryNow()  // the poll that just succeeded
	o.up.Store(1) // the next try will be answered …
	close(o.hold) // … but the one under way fails (503)
	ackerTestFlush(t, k)
	if answers, _ := rec.got(); len(answers) != 1 || o.failed.Load() != 1 {
		t.Fatalf("answers %+v after %d failed tries; want one answer after one failure", answers, o.failed.Load())
	}
}
