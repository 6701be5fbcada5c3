package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// sleepRecorder is an injected api.Config.Sleep that records every wait.
type sleepRecorder struct {
	mu    sync.Mutex
	waits []time.Duration
	// then, if set, runs on each call and its result is returned; else the
	// call returns at once.
	then func(ctx context.Context, call int, d time.Duration) error
}

func (s *sleepRecorder) Sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.waits = append(s.waits, d)
	call := len(s.waits)
	then := s.then
	s.mu.Unlock()
	if then != nil {
		return then(ctx, call, d)
	}
	return nil
}

func (s *sleepRecorder) total() (time.Duration, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sum time.Duration
	for _, d := range s.waits {
		sum += d
	}
	return sum, len(s.waits)
}

func withSleep(s *sleepRecorder) option {
	return func(c *apitest.Config) { c.Control.Sleep = s.Sleep }
}

// guard bounds a test that would otherwise hang on a bug; it is never
// what the test waits for when the code is right.
const guard = 10 * time.Second

func TestLongPollTimeoutZeroAnswersAtOnce(t *testing.T) {
	rec := &sleepRecorder{}
	h := newHarness(t, withSleep(rec))
	w := h.hello("m", "b")
	if cmds := h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, TimeoutS: 0}); len(cmds) != 0 {
		t.Errorf("poll answered %+v with nothing queued", cmds)
	}
	if _, n := rec.total(); n != 0 {
		t.Errorf("timeout_s 0 slept %d times, want none", n)
	}
}

func TestLongPollReturnsWhenWorkArrives(t *testing.T) {
	sleeping := make(chan struct{})
	resume := make(chan struct{})
	rec := &sleepRecorder{then: func(ctx context.Context, call int, d time.Duration) error {
		if call == 1 {
			close(sleeping)
			select {
			case <-resume:
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		}
		return nil
	}}
	h := newHarness(t, withSleep(rec))
	w := h.hello("m", "b")
	h.poll(w, wire.PollRequest{Phase: wire.PhaseReady}) // active

	type result struct {
		cmds []wire.Command
		err  error
	}
	done := make(chan result, 1)
	go func() {
		done <- h.pollNoFatal(w, wire.PollRequest{Phase: wire.PhaseReady, TimeoutS: 10})
	}()
	select {
	case <-sleeping:
	case r := <-done:
		t.Fatalf("poll answered %+v (%v) before waiting", r.cmds, r.err)
	case <-time.After(guard):
		t.Fatal("the long poll never slept")
	}
	inv := h.submit("arrived", "late")
	close(resume)

	var r result
	select {
	case r = <-done:
	case <-time.After(guard):
		t.Fatal("the long poll did not answer after work arrived")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := runIDs(r.cmds); len(got) != 1 || got[0] != inv.InvocationID {
		t.Errorf("long poll answered %+v, want a run of %s", r.cmds, inv.InvocationID)
	}
	if _, n := rec.total(); n != 1 {
		t.Errorf("slept %d times, want exactly 1 (the answer should follow the first re-check)", n)
	}
}

// pollNoFatal polls from any goroutine (t.Fatal must stay on the test's
// own), reporting failures as an error.
func (h *harness) pollNoFatal(w worker, req wire.PollRequest) (r struct {
	cmds []wire.Command
	err  error
}) {
	req.WorkerID = w.id
	body, _ := json.Marshal(req)
	hreq, err := http.NewRequest("POST", h.url+"/v1/daemon/poll", bytes.NewReader(body))
	if err != nil {
		r.err = err
		return r
	}
	hreq.Header.Set("Authorization", "Bearer "+w.token)
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		r.err = err
		return r
	}
	defer resp.Body.Close()
	var pr wire.PollResponse
	if resp.StatusCode != 200 {
		r.err = fmt.Errorf("poll: status %d", resp.StatusCode)
		return r
	}
	if err := json.NewDecoder(resp.Body).Decode(&pr); err != nil {
		r.err = err
		return r
	}
	r.cmds = pr.Commands
	return r
}

func TestLongPollWaitIsCapped(t *testing.T) {
	cases := []struct {
		name        string
		staleAfter  time.Duration
		maxPollWait time.Duration
		timeoutS    float64
		want        time.Duration
	}{
		{"capped at stale_after/3", 600 * time.Millisecond, 10 * time.Second, 20, 200 * time.Millisecond},
		{"capped at MaxPollWait", time.Minute, 250 * time.Millisecond, 20, 250 * time.Millisecond},
		{"timeout_s under both caps", time.Minute, 20 * time.Second, 0.15, 150 * time.Millisecond},
		{"timeout_s over MaxPollTimeoutS", 1200 * time.Millisecond, 0, 3600, 400 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// This Sleep really waits: the router's deadline is on the wall clock.
			rec := &sleepRecorder{then: func(ctx context.Context, _ int, d time.Duration) error {
				select {
				case <-time.After(d):
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}}
			h := newHarness(t, withSleep(rec), func(c *apitest.Config) {
				c.Control.StaleAfter = tc.staleAfter
				c.Control.MaxPollWait = tc.maxPollWait
			})
			w := h.hello("m", "b")
			start := time.Now()
			if cmds := h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, TimeoutS: tc.timeoutS}); len(cmds) != 0 {
				t.Fatalf("poll answered %+v", cmds)
			}
			elapsed := time.Since(start)
			sum, n := rec.total()
			if sum > tc.want {
				t.Errorf("slept %v in %d waits, want at most %v", sum, n, tc.want)
			}
			// The first wait alone is min(100ms, cap): at least half of
			// every cap here, however slow the machine.
			if sum < tc.want/2 {
				t.Errorf("slept only %v in %d waits, want about %v", sum, n, tc.want)
			}
			if elapsed > tc.want+2*time.Second {
				t.Errorf("poll took %v, want about %v", elapsed, tc.want)
			}
		})
	}
}

// TestLongPollWaitIsCappedWithInstantSleep: the wait cap must hold in terms
// of the injected Sleep, not only of the wall clock. Config.Sleep exists so
// tests (and a Lambda adapter) can replace the real wait; with a Sleep that
// returns at once the router should still ask for no more than
// min(MaxPollWait, StaleAfter/3) in all, instead of spinning on the store
// until the wall-clock deadline passes.
func TestLongPollWaitIsCappedWithInstantSleep(t *testing.T) {
	const maxCalls = 200 // stop a spinning loop early; the right code needs about 4
	rec := &sleepRecorder{then: func(ctx context.Context, call int, d time.Duration) error {
		if call >= maxCalls {
			return context.Canceled
		}
		return nil
	}}
	h := newHarness(t, withSleep(rec), func(c *apitest.Config) { c.Control.StaleAfter = 3 * time.Second })
	w := h.hello("m", "b")
	if cmds := h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, TimeoutS: 20}); len(cmds) != 0 {
		t.Fatalf("poll answered %+v", cmds)
	}
	sum, n := rec.total()
	if want := time.Second; sum > want {
		t.Errorf("asked the injected Sleep for %v in %d calls, want at most min(MaxPollWait, StaleAfter/3) = %v", sum, n, want)
	}
}

// TestLongPollNotWhenCommandsPending: a poll that already carries commands
// answers at once instead of waiting for work.
func TestLongPollNotWhenCommandsPending(t *testing.T) {
	rec := &sleepRecorder{}
	h := newHarness(t, withSleep(rec))
	w := h.hello("m", "b")
	h.do("POST", "/v1/workers/"+w.id+"/drain", operatorToken, nil).want(t, 202, nil)
	cmds := h.poll(w, wire.PollRequest{Phase: wire.PhaseReady, TimeoutS: 10})
	if len(cmds) != 1 || cmds[0].Type != wire.CommandDrain {
		t.Errorf("poll answered %+v", cmds)
	}
	if _, n := rec.total(); n != 0 {
		t.Errorf("slept %d times with a drain to deliver", n)
	}
}

// pausedPoll starts a long poll by w and calls during() while the router is
// in its first wait, then lets it finish and reports its answer.
func pausedPoll(t *testing.T, h *harness, rec *sleepRecorder, w worker, req wire.PollRequest, during func()) []wire.Command {
	t.Helper()
	sleeping := make(chan struct{})
	resume := make(chan struct{})
	rec.mu.Lock()
	rec.then = func(ctx context.Context, call int, d time.Duration) error {
		if call == 1 {
			close(sleeping)
			select {
			case <-resume:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	rec.mu.Unlock()
	type result struct {
		cmds []wire.Command
		err  error
	}
	done := make(chan result, 1)
	go func() { done <- h.pollNoFatal(w, req) }()
	select {
	case <-sleeping:
	case r := <-done:
		t.Fatalf("poll answered %+v (%v) before waiting", r.cmds, r.err)
	case <-time.After(guard):
		t.Fatal("the long poll never slept")
	}
	during()
	close(resume)
	select {
	case r := <-done:
		if r.err != nil {
			return nil // refused (e.g. 410): no commands
		}
		return r.cmds
	case <-time.After(guard):
		t.Fatal("the long poll did not answer")
	}
	return nil
}

// TestLongPollDoesNotClaimForRetiredWorker: a worker retired while its long
// poll waits (its machine said hello from a new boot: the old process is
// dead) must not be handed work when the wait ends. Today the wait loop
// claims with the worker row it read before waiting, so the invocation goes
// to a gone worker; the hello that retired it has already requeued what it
// held, so nothing hands this one back until a reaper sweep.
func TestLongPollDoesNotClaimForRetiredWorker(t *testing.T) {
	rec := &sleepRecorder{}
	h := newHarness(t, withSleep(rec))
	old := h.hello("m", "boot-1")
	h.poll(old, wire.PollRequest{Phase: wire.PhaseReady})
	var inv wire.Invocation
	cmds := pausedPoll(t, h, rec, old, wire.PollRequest{Phase: wire.PhaseReady, TimeoutS: 10}, func() {
		h.hello("m", "boot-2")
		inv = h.submit("x")
	})
	if runs := ofType(cmds, wire.CommandRun); len(runs) != 0 {
		t.Errorf("a retired worker's long poll was handed %+v", runs)
	}
	if got := h.invocation(inv.InvocationID); got.State != wire.StateQueued {
		t.Errorf("invocation reads %s on %s, want queued (its claimer was gone)", got.State, got.WorkerID)
	}
}

// TestLongPollDoesNotClaimAfterDrain: a drain requested while a long poll
// waits stops that poll from claiming ("it claims nothing more").
func TestLongPollDoesNotClaimAfterDrain(t *testing.T) {
	rec := &sleepRecorder{}
	h := newHarness(t, withSleep(rec))
	w := h.hello("m", "b")
	h.poll(w, wire.PollRequest{Phase: wire.PhaseReady})
	var inv wire.Invocation
	cmds := pausedPoll(t, h, rec, w, wire.PollRequest{Phase: wire.PhaseReady, TimeoutS: 10}, func() {
		h.do("POST", "/v1/workers/"+w.id+"/drain", operatorToken, nil).want(t, 202, nil)
		inv = h.submit("x")
	})
	if runs := ofType(cmds, wire.CommandRun); len(runs) != 0 {
		t.Errorf("a drained worker's long poll was handed %+v", runs)
	}
	if got := h.invocation(inv.InvocationID); got.State != wire.StateQueued {
		t.Errorf("invocation reads %s, want queued", got.State)
	}
}
