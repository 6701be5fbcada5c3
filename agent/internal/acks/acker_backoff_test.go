package acks

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

func TestAckerSubmitValidates(t *testing.T) {
	k, s, _, _ := ackerTestNew(t, t.TempDir())
	mismatch := spoolTestAck("inv_01X", 1, time.Time{})
	mismatch.Ack.WorkerID = "wrk_01SOMEONEELSE"
	noToken := spoolTestAck("inv_01X", 1, time.Time{})
	noToken.Token = ""
	for name, a := range map[string]SpooledAck{"worker ids differ": mismatch, "no token": noToken} {
		if err := k.Submit(context.Background(), a); err == nil {
			t.Errorf("%s: Submit accepted it", name)
		}
	}
	if n := ackerTestSpoolLen(t, s); n != 0 || len(k.Pending()) != 0 {
		t.Errorf("refused Submits left %d spooled, %v pending", n, k.Pending())
	}

	// Only one of the worker ids given: the other is filled in.
	var got wire.AckRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&got)
		_ = json.NewEncoder(w).Encode(wire.AckResponse{Recorded: true})
	}))
	t.Cleanup(srv.Close)
	a := ackerTestAt(spoolTestAck("inv_01Y", 1, time.Time{}), srv.URL)
	a.Ack.WorkerID = ""
	if err := k.Submit(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	ackerTestFlush(t, k)
	if got.WorkerID != a.WorkerID {
		t.Errorf("sent worker_id %q, want %q", got.WorkerID, a.WorkerID)
	}
}

func TestAckerBackoff(t *testing.T) {
	k := New(nil, Options{Rand: func() float64 { return 1 }})
	cases := []struct {
		try  int
		want time.Duration
	}{
		{0, 200 * time.Millisecond},
		{1, 400 * time.Millisecond},
		{2, 800 * time.Millisecond},
		{7, 25600 * time.Millisecond},
		{8, 30 * time.Second},
		{1000, 30 * time.Second},
	}
	for _, tc := range cases {
		if got := k.backoff(tc.try); got != tc.want {
			t.Errorf("backoff(%d) at rand 1 = %v, want %v", tc.try, got, tc.want)
		}
	}
	k.rand = func() float64 { return 0 }
	if got := k.backoff(5); got != 0 {
		t.Errorf("backoff at rand 0 = %v, want 0 (full jitter)", got)
	}
	k.rand = func() float64 { return 0.25 }
	if got := k.backoff(3); got != 400*time.Millisecond {
		t.Errorf("backoff(3) at rand 0.25 = %v, want 400ms", got)
	}
}
