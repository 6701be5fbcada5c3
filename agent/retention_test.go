package agent

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/process"
	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestRunDirectoryWaitsForItsAck: with --keep-runs 0 a finished run's
// directory stays while the control plane refuses its ack (503), however
// often retention sweeps, and goes once the ack is answered.
func TestRunDirectoryWaitsForItsAck(t *testing.T) {
	p := apitest.New(t)
	target, err := url.Parse(p.URL)
	if err != nil {
		t.Fatal(err)
	}
	var refusing atomic.Bool
	var refused atomic.Int32
	refusing.Store(true)
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/daemon/ack" && refusing.Load() {
			refused.Add(1)
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	inv, _, err := operator(p).Submit(context.Background(), wire.SubmitRequest{Queue: "q", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	a := newFakeTimeAgent(t, p, "keeper", func(c *Config) {
		c.ControlPlane = front.URL
		c.KeepRuns, c.KeepRunsSize = 0, 0
		c.PollInterval = 100 * time.Millisecond
	})
	sweeps := make(chan process.SweepResult, 100)
	a.testRetentionSwept = func(res process.SweepResult) {
		select {
		case sweeps <- res:
		default:
		}
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	t.Cleanup(func() {
		a.Stop()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("the agent did not stop")
		}
	})
	dir := filepath.Join(a.cfg.Workdir, inv.InvocationID, "1")

	// A sweep after the ack was refused holds the run and keeps its directory.
	deadline := time.After(30 * time.Second)
	for held := false; !held; {
		select {
		case res := <-sweeps:
			held = res.Held == 1 && refused.Load() > 0
		case <-deadline:
			t.Fatalf("no sweep holding the run after its ack was refused (%d refusals)", refused.Load())
		}
	}
	if _, err := os.Lstat(dir); err != nil {
		t.Fatalf("the run directory of an unanswered ack: %v", err)
	}

	refusing.Store(false)
	for gone := false; !gone; {
		select {
		case <-sweeps:
			_, err := os.Lstat(filepath.Join(a.cfg.Workdir, inv.InvocationID))
			gone = errors.Is(err, os.ErrNotExist)
		case <-time.After(30 * time.Second):
			t.Fatal("the run directory stayed after its ack was answered")
		}
	}
	got, err := operator(p).GetInvocation(context.Background(), inv.InvocationID)
	if err != nil || got.State != wire.StateSucceeded {
		t.Fatalf("invocation %+v %v", got, err)
	}
}
