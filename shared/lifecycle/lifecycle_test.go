package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// secret is the run's secret path segment; no error may show it.
const secret = "3q9testsecret"

// bound is how long a test waits for something that should happen at once;
// only a broken implementation reaches it.
const bound = 10 * time.Second

// fakeNymph implements the lifecycle endpoint's contract for one run.
type fakeNymph struct {
	srv     *httptest.Server
	closing chan struct{}
	waits   chan struct{} // one send per held wait request that arrived

	mu        sync.Mutex
	view      View
	drained   chan struct{} // closed when the phase becomes draining
	requeues  int
	earlyWait int                 // answer this many waits at once, not draining
	failWait  int                 // answer this many waits with 503
	status    int                 // when set, answer every request with this status
	published []map[string]string // publish requests' bodies
}

func newFakeNymph(t *testing.T) *fakeNymph {
	t.Helper()
	f := &fakeNymph{
		closing: make(chan struct{}),
		waits:   make(chan struct{}, 100),
		drained: make(chan struct{}),
		view: View{Phase: PhaseReady, HostKey: "hk1_abc", WorkerID: "w-1",
			InvocationID: "inv-1", Attempt: 2},
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	// Cleanups run last-first: release held waits, then close.
	t.Cleanup(f.srv.Close)
	t.Cleanup(func() { close(f.closing) })
	return f
}

func (f *fakeNymph) url() string { return f.srv.URL + "/v1/lifecycle/" + secret }

// client reaches the fake the way std reaches nymph.
func (f *fakeNymph) client() *client {
	return &client{url: f.url, hc: f.srv.Client()}
}

// drainNow starts the drain with a grace window ending at deadline.
func (f *fakeNymph) drainNow(deadline time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.view.Phase, f.view.Deadline = PhaseDraining, deadline
	close(f.drained)
}

func (f *fakeNymph) answer(w http.ResponseWriter, code int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(body)
}

func (f *fakeNymph) serve(w http.ResponseWriter, r *http.Request) {
	base := "/v1/lifecycle/" + secret
	f.mu.Lock()
	status := f.status
	f.mu.Unlock()
	if status != 0 {
		f.answer(w, status, map[string]string{"error": "refused"})
		return
	}
	switch {
	case r.URL.Path == base && r.Method == http.MethodGet:
		if r.URL.Query().Get("wait") == "draining" {
			f.mu.Lock()
			early, fail := f.earlyWait > 0, f.failWait > 0 && f.earlyWait == 0
			if early {
				f.earlyWait--
			} else if fail {
				f.failWait--
			}
			drained := f.drained
			f.mu.Unlock()
			if fail {
				f.answer(w, http.StatusServiceUnavailable, map[string]string{"error": "restarting"})
				return
			}
			if !early {
				f.waits <- struct{}{}
				select {
				case <-drained:
				case <-r.Context().Done():
					return
				case <-f.closing:
				}
			}
		}
		f.mu.Lock()
		v := f.view
		f.mu.Unlock()
		// An extra field a client must ignore.
		f.answer(w, http.StatusOK, struct {
			View
			Extra string `json:"extra"`
		}{v, "ignored"})
	case r.URL.Path == base+"/requeue" && r.Method == http.MethodPost:
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.view.Phase != PhaseDraining {
			f.answer(w, http.StatusConflict, map[string]string{"error": "not draining"})
			return
		}
		f.requeues++
		f.answer(w, http.StatusAccepted, f.view)
	case r.URL.Path == base+"/publish" && r.Method == http.MethodPost:
		var req map[string]string
		if r.Header.Get("Content-Type") != "application/json" || json.NewDecoder(r.Body).Decode(&req) != nil {
			f.answer(w, http.StatusBadRequest, map[string]string{"error": "bad JSON"})
			return
		}
		f.mu.Lock()
		f.published = append(f.published, req)
		f.mu.Unlock()
		if strings.HasSuffix(req["path"], "/missing") {
			f.answer(w, http.StatusNotFound, map[string]string{"error": "does not exist in the run directory"})
			return
		}
		f.answer(w, http.StatusCreated, map[string]any{"name": req["name"], "attempt": 2, "size": 5, "sha256": "ab12",
			"content_type": "text/plain", "created_at": "2026-12-03T13:00:00Z", "counted": false})
	default:
		f.answer(w, http.StatusNotFound, map[string]string{"error": "unknown URL"})
	}
}

// deadURL is a loopback URL nothing listens on.
func deadURL(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.NotFoundHandler())
	u := srv.URL + "/v1/lifecycle/" + secret
	srv.Close()
	return u
}

func unsetEnv(t *testing.T) {
	t.Setenv(EnvURL, "") // restores the variable after the test
	os.Unsetenv(EnvURL)
}

func noSecret(t *testing.T, err error) {
	t.Helper()
	if err != nil && strings.Contains(err.Error(), secret) {
		t.Errorf("error shows the secret URL: %v", err)
	}
}

func TestGet(t *testing.T) {
	f := newFakeNymph(t)
	t.Setenv(EnvURL, f.url())
	v, err := Get(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := View{Phase: PhaseReady, HostKey: "hk1_abc", WorkerID: "w-1", InvocationID: "inv-1", Attempt: 2}
	if v != want {
		t.Errorf("Get = %+v, want %+v", v, want)
	}
	if Phase() != PhaseReady || HostKey() != "hk1_abc" {
		t.Errorf("Phase, HostKey = %q, %q", Phase(), HostKey())
	}
}

func TestNotUnderNymph(t *testing.T) {
	unsetEnv(t)
	if _, err := Get(t.Context()); !errors.Is(err, ErrNotUnderNymph) {
		t.Errorf("Get: %v, want ErrNotUnderNymph", err)
	}
	if _, err := WaitDraining(t.Context()); !errors.Is(err, ErrNotUnderNymph) {
		t.Errorf("WaitDraining: %v, want ErrNotUnderNymph", err)
	}
	if err := Requeue(t.Context()); !errors.Is(err, ErrNotUnderNymph) {
		t.Errorf("Requeue: %v, want ErrNotUnderNymph", err)
	}
	if Phase() != "" || HostKey() != "" {
		t.Errorf("Phase, HostKey = %q, %q outside nymph", Phase(), HostKey())
	}
	c := &client{url: func() string { return "" }, hc: http.DefaultClient}
	c.onShutdown(func(context.Context) { t.Error("hook ran outside nymph") })
	if c.watching || len(c.hooks) != 0 {
		t.Error("OnShutdown outside nymph registered a hook")
	}
}

func TestDeadOrBadURLFailsSoft(t *testing.T) {
	for _, u := range []string{deadURL(t), "ftp://x/" + secret, "::" + secret} {
		t.Setenv(EnvURL, u)
		if Phase() != "" || HostKey() != "" {
			t.Errorf("Phase, HostKey = %q, %q, want empty", Phase(), HostKey())
		}
		_, err := Get(t.Context())
		if err == nil {
			t.Fatal("Get succeeded")
		}
		noSecret(t, err)
		if err := Requeue(t.Context()); err == nil {
			t.Error("Requeue succeeded")
		} else {
			noSecret(t, err)
		}
	}
}

func TestWaitDraining(t *testing.T) {
	f := newFakeNymph(t)
	f.mu.Lock()
	f.earlyWait, f.failWait = 1, 1 // answered early once, then an error: both retried
	f.mu.Unlock()
	c := f.client()
	deadline := time.Now().Add(time.Hour).Truncate(time.Second)
	got := make(chan View, 1)
	go func() {
		v, err := c.waitDraining(t.Context())
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	waitFor(t, f.waits, "a held wait")
	f.drainNow(deadline)
	select {
	case v := <-got:
		if v.Phase != PhaseDraining || !v.Deadline.Equal(deadline) {
			t.Errorf("WaitDraining = %+v, want draining until %v", v, deadline)
		}
	case <-time.After(bound):
		t.Fatal("WaitDraining did not return after the drain started")
	}
}

func TestWaitDrainingEnds(t *testing.T) {
	f := newFakeNymph(t)
	c := f.client()
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { _, err := c.waitDraining(ctx); errc <- err }()
	waitFor(t, f.waits, "a held wait")
	cancel()
	if err := waitErr(t, errc); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitDraining after cancel: %v", err)
	}

	// A refusal for good (403: not a process of this run) is not retried.
	f.mu.Lock()
	f.status = http.StatusForbidden
	f.mu.Unlock()
	go func() { _, err := c.waitDraining(t.Context()); errc <- err }()
	err := waitErr(t, errc)
	var se *StatusError
	if !errors.As(err, &se) || se.Code != http.StatusForbidden || se.Message != "refused" {
		t.Errorf("WaitDraining refused: %v", err)
	}
	noSecret(t, err)
}

func TestOnShutdown(t *testing.T) {
	f := newFakeNymph(t)
	c := f.client()
	deadline := time.Now().Add(time.Hour).Truncate(time.Second)
	ran := make(chan string, 3)
	hook := func(name string) func(context.Context) {
		return func(ctx context.Context) {
			if d, ok := ctx.Deadline(); !ok || !d.Equal(deadline) {
				t.Errorf("hook %s: deadline %v, %v; want %v", name, d, ok, deadline)
			}
			ran <- name
		}
	}
	c.onShutdown(hook("first"))
	c.onShutdown(hook("second"))
	waitFor(t, f.waits, "the watcher's held wait")
	select {
	case name := <-ran:
		t.Fatalf("hook %s ran before the drain", name)
	default:
	}
	f.drainNow(deadline)
	for _, want := range []string{"first", "second"} {
		if got := waitFor(t, ran, "hook "+want); got != want {
			t.Errorf("hook %s ran, want %s", got, want)
		}
	}
	// Registered after the drain was seen: runs at once.
	c.onShutdown(hook("late"))
	if got := waitFor(t, ran, "the late hook"); got != "late" {
		t.Errorf("hook %s ran, want late", got)
	}
}

func TestRequeue(t *testing.T) {
	f := newFakeNymph(t)
	c := f.client()
	err := c.requeue(t.Context())
	var se *StatusError
	if !errors.As(err, &se) || se.Code != http.StatusConflict || se.Message != "not draining" {
		t.Fatalf("Requeue while ready: %v, want a 409 with the server's message", err)
	}
	if !strings.Contains(err.Error(), "not draining") {
		t.Errorf("error %q lacks the server's message", err)
	}
	noSecret(t, err)

	f.drainNow(time.Now().Add(time.Hour))
	if err := c.requeue(t.Context()); err != nil {
		t.Fatalf("Requeue while draining: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.requeues != 1 {
		t.Errorf("server saw %d requeues, want 1", f.requeues)
	}
}

func TestUnknownURL(t *testing.T) {
	f := newFakeNymph(t)
	c := &client{url: func() string { return f.srv.URL + "/v1/lifecycle/other/" }, hc: f.srv.Client()}
	_, err := c.get(t.Context())
	var se *StatusError
	if !errors.As(err, &se) || se.Code != http.StatusNotFound {
		t.Errorf("Get on an unknown URL: %v, want 404", err)
	}
}

func waitFor[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(bound):
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

func waitErr(t *testing.T, c <-chan error) error {
	t.Helper()
	return waitFor(t, c, "WaitDraining to return")
}
