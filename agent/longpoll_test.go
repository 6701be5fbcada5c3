package agent

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/wake"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// pollCounter counts the poll requests a daemon sends.
type pollCounter struct {
	base http.RoundTripper
	sent atomic.Int64
}

func (c *pollCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/v1/daemon/poll") {
		c.sent.Add(1)
	}
	return c.base.RoundTrip(r)
}

// TestIdleLongPollIsWoken: where the control plane offers long polls, an
// idle daemon's poll is held, and work submitted meanwhile starts from
// that very poll: the run command answers the held request, no later poll
// is needed. The control plane's re-check never fires here (its Sleep
// blocks until the poll ends), so only the wake can answer the held poll.
func TestIdleLongPollIsWoken(t *testing.T) {
	hub := &wake.Hub{}
	p := apitest.New(t, func(c *apitest.Config) {
		c.Control.LongPoll, c.Control.Wake = true, hub
		c.Control.Sleep = func(ctx context.Context, _ time.Duration) error { <-ctx.Done(); return ctx.Err() }
	})
	polls := &pollCounter{base: http.DefaultTransport}
	started := make(chan int64, 1)
	a := newFakeTimeAgent(t, p, "held", func(c *Config) { c.HTTP = &http.Client{Transport: polls} })
	a.testHookRunStarted = func(string) {
		select {
		case started <- polls.sent.Load():
		default:
		}
	}
	runAgent(t, a)

	waittest.Until(t, 30*time.Second, "a held poll", func() bool { return hub.Waiting(wake.Key("q", "")) == 1 })
	held := polls.sent.Load()
	inv, _, err := operator(p).Submit(context.Background(), wire.SubmitRequest{Queue: "q", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-started:
		if at != held {
			t.Fatalf("the run started after poll %d; want it from poll %d, the one held when %s was submitted", at, held, inv.InvocationID)
		}
	case <-time.After(time.Minute):
		t.Fatal("the submitted invocation never started")
	}
}

// TestIdleDaemonPollsOncePerInterval: an idle daemon makes at most about
// one poll per poll interval, whether the control plane holds its long
// polls for the whole interval or answers them at once (an older control
// plane, or one whose store re-check failed): the daemon waits out the
// rest of the interval itself. Never fewer matters less than never more:
// the bound is an upper one, which a slow machine only makes easier.
func TestIdleDaemonPollsOncePerInterval(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sleep func(context.Context, time.Duration) error
	}{
		{"held", nil},
		{"answered at once", func(context.Context, time.Duration) error { return context.Canceled }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := apitest.New(t, func(c *apitest.Config) {
				c.Control.LongPoll, c.Control.StaleAfter = true, 3*time.Second // a 0.5 s interval and hold
				if tc.sleep != nil {
					c.Control.Sleep = tc.sleep
				}
			})
			polls := &pollCounter{base: http.DefaultTransport}
			a := newFakeTimeAgent(t, p, "idle-"+strings.ReplaceAll(tc.name, " ", "-"), func(c *Config) { c.HTTP = &http.Client{Transport: polls} })
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx) }()
			waittest.Until(t, 30*time.Second, "ready", func() bool { return a.Health().Snapshot().Phase == wire.PhaseReady })
			from, start := polls.sent.Load(), time.Now()
			time.Sleep(3 * time.Second)
			n, took := polls.sent.Load()-from, time.Since(start)
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			// 0.5 s apart, less 10 % jitter: at most took/0.45 s, plus the
			// one in flight at each end.
			if max := int64(took/(450*time.Millisecond)) + 2; n > max {
				t.Fatalf("%d polls in %s idle; want at most %d (one per 0.5 s interval)", n, took.Round(time.Millisecond), max)
			}
			if n < 2 {
				t.Fatalf("%d polls in %s idle: the daemon stopped heartbeating", n, took.Round(time.Millisecond))
			}
		})
	}
}

// TestSessionLongPoll: the hold an idle poll asks for is what hello offers,
// at most the poll interval and half the request deadline; nothing when
// hello offers none.
func TestSessionLongPoll(t *testing.T) {
	for _, tc := range []struct {
		name         string
		longPollS    float64
		flagInterval time.Duration
		want         time.Duration
	}{
		{"none offered", 0, 0, 0},
		{"the interval", 5, 0, 5 * time.Second},
		{"a shorter --poll-interval", 5, 2 * time.Second, 2 * time.Second},
		{"under the request deadline", 20, 20 * time.Second, requestTimeout / 2},
	} {
		a := &Agent{cfg: Config{ControlPlane: "http://127.0.0.1:1", PollInterval: tc.flagInterval}}
		s, err := a.newSession(wire.HelloResponse{WorkerID: "w", StaleAfterS: 60, PollIntervalS: 5, LongPollS: tc.longPollS})
		if err != nil || s.longPoll != tc.want {
			t.Errorf("%s: long poll %s, %v; want %s", tc.name, s.longPoll, err, tc.want)
		}
	}
}

// TestStopCutsAHeldPoll: a stop while the idle daemon's poll is held
// starts the drain at once instead of after the hold (here the control
// plane would hold it until the request deadline, 20 s): the daemon says
// bye and Run returns well before that, with no poll failure recorded.
func TestStopCutsAHeldPoll(t *testing.T) {
	hub := &wake.Hub{}
	p := apitest.New(t, func(c *apitest.Config) {
		c.Control.LongPoll, c.Control.Wake = true, hub
		c.Control.Sleep = func(ctx context.Context, _ time.Duration) error { <-ctx.Done(); return ctx.Err() }
	})
	a := newFakeTimeAgent(t, p, "cut", func(c *Config) { c.HTTP = &http.Client{} })
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	waittest.Until(t, 30*time.Second, "a held poll", func() bool { return hub.Waiting(wake.Key("q", "")) == 1 })
	a.Stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stop waited for the held poll")
	}
	if w := workerOf(t, p, "cut"); w.State != "gone" || w.RetiredWhy != "bye: signal" {
		t.Fatalf("worker after the stop: %+v", w)
	}
	if r := a.Health().Snapshot().Roles["poll"]; r.LastResult != "ok" {
		t.Fatalf("the cut poll was recorded as %q, want ok", r.LastResult)
	}
}

// TestSessionKeepsTheCadence: the session keeps the cadence of the stale
// window hello answered (cadence.Of): a --poll-interval longer than a third
// of it is refused, the wake interval never passes that third nor falls
// under the interval, and a control plane that sends no window bounds
// neither.
func TestSessionKeepsTheCadence(t *testing.T) {
	for _, tc := range []struct {
		name         string
		staleS       float64
		flagInterval time.Duration
		wakeS        float64
		wantErr      bool
		wantWake     time.Duration
	}{
		{"a third of the window is allowed", 30, 10 * time.Second, 20, false, 10 * time.Second},
		{"over a third is refused", 30, 10*time.Second + time.Millisecond, 20, true, 0},
		{"the wake interval caps at a third", 30, 2 * time.Second, 60, false, 10 * time.Second},
		{"the wake interval never under the interval", 60, 5 * time.Second, 1, false, 5 * time.Second},
		{"no window: no bound", 0, time.Minute, 90, false, 90 * time.Second},
	} {
		a := &Agent{cfg: Config{ControlPlane: "http://127.0.0.1:1", PollInterval: tc.flagInterval}}
		s, err := a.newSession(wire.HelloResponse{WorkerID: "w", StaleAfterS: tc.staleS, PollIntervalS: 5,
			WakeURL: "ws://127.0.0.1:1/wake", WakePollIntervalS: tc.wakeS})
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: error %v, want one %v", tc.name, err, tc.wantErr)
			continue
		}
		if !tc.wantErr && s.wakeInterval != tc.wantWake {
			t.Errorf("%s: wake interval %s, want %s", tc.name, s.wakeInterval, tc.wantWake)
		}
	}
}
