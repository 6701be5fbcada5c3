package agent

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// holdPolls is a transport that, once armed, holds the next poll until
// released, and records whether that poll's context ended first.
type holdPolls struct {
	armed     atomic.Bool
	once      sync.Once
	held      chan struct{} // closed once a poll is held
	release   chan struct{}
	cancelled atomic.Bool
}

func (h *holdPolls) RoundTrip(r *http.Request) (*http.Response, error) {
	if h.armed.Load() && strings.HasSuffix(r.URL.Path, "/v1/daemon/poll") {
		hold := false
		h.once.Do(func() { hold = true })
		if hold {
			close(h.held)
			select {
			case <-h.release:
			case <-r.Context().Done():
				h.cancelled.Store(true)
			}
		}
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestStopLeavesAPollInFlight: a stop (SIGTERM) that comes while a poll is
// in flight does not cut that poll off. The loop's requests run on a
// context a stop leaves alone, so the heartbeats of the drain and its
// terminating poll go out; only boot and hello's retries give way to a
// stop. (Were a stop to cancel the loop's context, a poll in flight would
// fail with "context canceled" and the terminating poll would be lost now
// and then, as TestStoreFaultsOneFault/bye_lost shows under -race
// -count=20.)
func TestStopLeavesAPollInFlight(t *testing.T) {
	p := apitest.New(t)
	h := &holdPolls{held: make(chan struct{}), release: make(chan struct{})}
	logs := newLogRecorder()
	dir := t.TempDir()
	a, err := New(Config{
		ControlPlane: p.URL, EnrollToken: apitest.EnrollToken, Queue: "q",
		Workdir: filepath.Join(dir, "work"), StateDir: filepath.Join(dir, "state"),
		MachineID: "held-poll", IntrospectAddr: "off", PollInterval: 100 * time.Millisecond,
		Grace: 10 * time.Second, KillAfter: time.Second,
		HTTP: &http.Client{Transport: h}, Logger: logs.logger(), Notifier: nopNotifier{},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	logs.wait(t, "ready", func(r logRecord) bool { return r.Msg == "phase" && r.Attrs["phase"] == wire.PhaseReady })
	h.armed.Store(true)
	select {
	case <-h.held:
	case <-time.After(30 * time.Second):
		t.Fatal("no poll within 30 s")
	}
	a.Stop()
	// With a stop that cancels the loop's context, the held poll's context
	// ends within milliseconds; two seconds is generous.
	time.Sleep(2 * time.Second) // the window such a stop would need, not synchronisation
	close(h.release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after the stop")
	}
	if h.cancelled.Load() {
		t.Fatal("the stop cut off the poll in flight")
	}
	if failed := logs.find(func(r logRecord) bool { return r.Msg == "poll failed" }); len(failed) > 0 {
		t.Fatalf("polls failed around the stop: %v", failed)
	}
	if byes := logs.find(func(r logRecord) bool { return r.Msg == "bye failed" }); len(byes) > 0 {
		t.Fatalf("bye failed: %v", byes)
	}
}
