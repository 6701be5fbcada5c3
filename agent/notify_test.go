package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/notify"
	"github.com/dreamlake/lakeshore/agent/internal/notify/notifytest"
	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/syncbuf"
)

// TestAgentNotifiesOverSocket: a real agent against a real control plane,
// with NOTIFY_SOCKET set: READY=1 once the worker is registered (visible to
// an operator), STOPPING=1 once when a signal starts the drain, with the
// stop budget as EXTEND_TIMEOUT_USEC.
func TestAgentNotifiesOverSocket(t *testing.T) {
	p := apitest.New(t)
	socket := filepath.Join(t.TempDir(), "notify")
	msgs := notifytest.Listen(t, socket)
	t.Setenv(notify.SocketEnv, socket) // the default: what systemd sets
	dir := t.TempDir()
	a, err := New(Config{
		ControlPlane: p.URL, EnrollToken: apitest.EnrollToken, Queue: "q",
		Workdir: filepath.Join(dir, "work"), StateDir: filepath.Join(dir, "state"),
		MachineID: "notified", IntrospectAddr: "off", Grace: 3 * time.Second, KillAfter: time.Second,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()

	ready := notifytest.Lines(notifytest.Next(t, msgs, 10*time.Second))
	if ready["READY"] != "1" || !strings.HasPrefix(ready["STATUS"], "registered as wrk_") {
		t.Fatalf("first notification %v, want READY=1 with the worker id", ready)
	}
	w := workerOf(t, p, "notified")
	if !strings.Contains(ready["STATUS"], w.WorkerID) {
		t.Fatalf("READY status %q does not name worker %s", ready["STATUS"], w.WorkerID)
	}

	a.Stop()
	for {
		m := notifytest.Lines(notifytest.Next(t, msgs, 10*time.Second))
		if m["STOPPING"] == "1" {
			if want := fmt.Sprint(StopBudget(3*time.Second, time.Second).Microseconds()); m["EXTEND_TIMEOUT_USEC"] != want {
				t.Errorf("EXTEND_TIMEOUT_USEC %q, want %s", m["EXTEND_TIMEOUT_USEC"], want)
			}
			if !strings.Contains(m["STATUS"], "draining (signal)") {
				t.Errorf("STOPPING status %q", m["STATUS"])
			}
			break
		}
		if m["READY"] != "" {
			t.Fatalf("a second READY: %v", m)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not exit after Stop")
	}
	for {
		select {
		case m := <-msgs:
			if l := notifytest.Lines(m); l["STOPPING"] != "" || l["READY"] != "" {
				t.Fatalf("after STOPPING: %q (STOPPING and READY go once)", m)
			}
			continue
		case <-time.After(200 * time.Millisecond):
		}
		break
	}
}

// TestAgentBrokenNotifySocket: a socket that is not there costs one warning
// and nothing else: the agent runs and exits as usual.
func TestAgentBrokenNotifySocket(t *testing.T) {
	p := apitest.New(t)
	var logs syncbuf.Buffer
	n, _ := notify.NewSD(filepath.Join(t.TempDir(), "gone"))
	dir := t.TempDir()
	a, err := New(Config{
		ControlPlane: p.URL, EnrollToken: apitest.EnrollToken, Queue: "q",
		Workdir: filepath.Join(dir, "work"), StateDir: filepath.Join(dir, "state"),
		MachineID: "unheard", IntrospectAddr: "off", KeepAlive: time.Second,
		Logger:   slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Notifier: n,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if w := workerOf(t, p, "unheard"); w.State != "gone" || w.RetiredWhy != "bye: idle" {
		t.Fatalf("worker: %+v", w)
	}
	if got := strings.Count(logs.String(), "could not notify the service manager"); got != 1 {
		t.Fatalf("%d warnings about the socket, want 1:\n%s", got, logs.String())
	}
}

// notifyRecorder is a Notifier that keeps what it is told.
type notifyRecorder struct {
	mu   sync.Mutex
	msgs []string
	err  error
}

func (r *notifyRecorder) Notify(state string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, state)
	return r.err
}

func (r *notifyRecorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...)
}

// TestAgentNotifiesPhasesOnFakeTime: the whole life on fake time, with a
// drain command from the operator: READY=1 after hello, STATUS for setup and
// ready, STOPPING=1 (drain) once, then terminating.
func TestAgentNotifiesPhasesOnFakeTime(t *testing.T) {
	p := apitest.New(t)
	rec := &notifyRecorder{}
	synctest.Test(t, func(t *testing.T) {
		a := newFakeTimeAgent(t, p, "commanded", func(c *Config) { c.Notifier = rec })
		done := make(chan error)
		go func() { done <- a.Run(context.Background()) }()
		time.Sleep(time.Minute)
		id := a.Health().Snapshot().WorkerID
		if _, err := operator(p).DrainWorker(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	})
	var got []string
	for _, m := range rec.got() {
		l := notifytest.Lines(m)
		switch {
		case l["READY"] == "1":
			got = append(got, "READY "+l["STATUS"])
		case l["STOPPING"] == "1":
			got = append(got, "STOPPING "+l["STATUS"])
		default:
			got = append(got, l["STATUS"])
		}
	}
	id := workerOf(t, p, "commanded").WorkerID
	want := []string{
		"READY registered as " + id + ", queue q",
		"phase setup, worker " + id + ", 0 in flight",
		"phase ready, worker " + id + ", 0 in flight",
		"STOPPING phase draining (drain), worker " + id + ", 0 in flight",
		"phase terminating (drain), worker " + id + ", 0 in flight",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("notifications:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestAgentNotifiesReadyOnce: after a 410 the agent says hello again as a
// new worker; the service manager hears its id in STATUS, not a second
// READY=1. A notifier that always fails changes nothing.
func TestAgentNotifiesReadyOnce(t *testing.T) {
	p := apitest.New(t)
	rec := &notifyRecorder{err: errors.New("refused")}
	synctest.Test(t, func(t *testing.T) {
		a := newFakeTimeAgent(t, p, "twice", func(c *Config) { c.KeepAlive = 10 * time.Minute; c.Notifier = rec })
		done := make(chan error)
		go func() { done <- a.Run(context.Background()) }()
		time.Sleep(time.Minute)
		letGo(t, p, a.Health().Snapshot().WorkerID)
		time.Sleep(time.Minute)
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	})
	var ready, registered, stopping int
	for _, m := range rec.got() {
		l := notifytest.Lines(m)
		if l["READY"] == "1" {
			ready++
		}
		if l["STOPPING"] == "1" {
			stopping++
		}
		if strings.HasPrefix(l["STATUS"], "registered as ") {
			registered++
		}
	}
	if ready != 1 || registered != 2 || stopping != 1 {
		t.Fatalf("READY=1 ×%d, registrations ×%d, STOPPING=1 ×%d; want 1, 2, 1:\n%q", ready, registered, stopping, rec.got())
	}
}

func TestBudgets(t *testing.T) {
	// Start: an earlier process's bodies killed (10 s kill-after + 2 s) +
	// resend 15 s + IMDS 1 s + 8 hellos of 15 s + backoffs
	// (0.5+1+2+4+8+10+10 s) × 1.1.
	if got, want := StartBudget(), 12*time.Second+15*time.Second+time.Second+8*15*time.Second+39050*time.Millisecond; got != want {
		t.Errorf("StartBudget() = %s, want %s", got, want)
	}
	if got, want := HelloBackoffTotal(), 31950*time.Millisecond; got != want {
		t.Errorf("HelloBackoffTotal() = %s, want %s", got, want)
	}
	// Stop with the defaults: 30 s grace + 2 polls of 15 s + (10+5) + (2+10) + 2 + 1.
	if got, want := StopBudget(DefaultGrace, DefaultKillAfter), 90*time.Second; got != want {
		t.Errorf("StopBudget(defaults) = %s, want %s", got, want)
	}
}
