package lifecycle

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// call makes one request of the endpoint and decodes its JSON answer.
func call(t *testing.T, method, url string) (int, map[string]any) {
	t.Helper()
	return callWith(t, method, url, nil)
}

// callWith is call sending body.
func callWith(t *testing.T, method, url string, body io.Reader) (int, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s answered %d, not JSON: %q", method, resp.StatusCode, b)
	}
	return resp.StatusCode, m
}

// TestRunView: a run's view through its phases, the wait for the drain,
// the requeue (only while draining, once), and the URL gone once the run
// is; the caller is this test process, found in the socket table as a
// member of the run's "group".
func TestRunView(t *testing.T) {
	self := os.Getpid()
	s, err := Listen("127.0.0.1:0", Config{Members: func(pgid int) []int {
		if pgid == 4242 {
			return []int{self}
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	started := make(chan struct{})
	var requeues atomic.Int32
	h, err := s.Add(Run{HostKey: "hk1_abc", WorkerID: "wrk_1", InvocationID: "inv_1", Attempt: 2})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := call(t, "GET", h.URL()); code != http.StatusForbidden {
		t.Fatalf("before the run has processes: %d", code)
	}
	h.Attach(started, func() int { return 4242 }, func() { requeues.Add(1) })
	if !strings.HasPrefix(h.URL(), "http://127.0.0.1:") {
		t.Fatalf("URL %s is not loopback", h.URL())
	}

	if code, v := call(t, "GET", h.URL()); code != 200 || v["phase"] != PhaseSetup || v["host_key"] != "hk1_abc" ||
		v["worker_id"] != "wrk_1" || v["invocation_id"] != "inv_1" || v["attempt"] != 2.0 || v["deadline"] != nil {
		t.Fatalf("in setup: %d %v", code, v)
	}
	close(started)
	if _, v := call(t, "GET", h.URL()); v["phase"] != PhaseReady {
		t.Fatalf("after the body started: %v", v)
	}
	if code, v := call(t, "POST", h.URL()+"/requeue"); code != http.StatusConflict || !strings.Contains(v["error"].(string), "not draining") {
		t.Fatalf("requeue while ready: %d %v", code, v)
	}
	if code, _ := call(t, "POST", h.URL()); code != http.StatusMethodNotAllowed {
		t.Fatalf("POST to the view: %d", code)
	}
	if code, _ := call(t, "GET", h.URL()+"?wait=ready"); code != http.StatusBadRequest {
		t.Fatalf("wait=ready: %d", code)
	}

	waited := make(chan map[string]any, 1)
	go func() {
		_, v := call(t, "GET", h.URL()+"?wait=draining")
		waited <- v
	}()
	select {
	case v := <-waited:
		t.Fatalf("the wait returned before the drain: %v", v)
	case <-time.After(200 * time.Millisecond):
	}
	deadline := time.Now().Add(time.Minute).UTC().Truncate(time.Second)
	s.Drain(deadline)
	select {
	case v := <-waited:
		if v["phase"] != PhaseDraining || v["deadline"] != deadline.Format(time.RFC3339) {
			t.Fatalf("the wait answered %v, want draining until %s", v, deadline.Format(time.RFC3339))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the wait did not return after the drain started")
	}
	for range 2 {
		if code, v := call(t, "POST", h.URL()+"/requeue"); code != http.StatusAccepted || v["phase"] != PhaseDraining {
			t.Fatalf("requeue while draining: %d %v", code, v)
		}
	}
	if n := requeues.Load(); n != 1 || !h.Requeued() {
		t.Fatalf("requeue hook called %d times, Requeued %v; want once, true", n, h.Requeued())
	}

	base := h.URL()[:strings.LastIndex(h.URL(), "/")+1]
	if code, _ := call(t, "GET", base+"not-this-runs-secret"); code != http.StatusNotFound {
		t.Fatalf("a wrong secret while the run is open: %d", code)
	}
	h.Close()
	if code, _ := call(t, "GET", h.URL()); code != http.StatusNotFound {
		t.Fatalf("after the run ended: %d", code)
	}
}

// TestRunViewRefusesOthers: a caller that is not a process of the run's
// group reads nothing, not even its phase, and cannot requeue it.
func TestRunViewRefusesOthers(t *testing.T) {
	s, err := Listen("127.0.0.1:0", Config{Members: func(int) []int { return []int{1} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	requeued := false
	h, err := s.Add(Run{InvocationID: "inv_1", Attempt: 1})
	if err != nil {
		t.Fatal(err)
	}
	h.Attach(make(chan struct{}), func() int { return 4242 }, func() { requeued = true })
	s.Drain(time.Now().Add(time.Minute))
	for _, c := range []struct{ method, url string }{{"GET", h.URL()}, {"GET", h.URL() + "?wait=draining"}, {"POST", h.URL() + "/requeue"}} {
		code, v := call(t, c.method, c.url)
		if code != http.StatusForbidden || v["phase"] != nil || v["invocation_id"] != nil {
			t.Errorf("%s %s by a stranger: %d %v", c.method, c.url[strings.LastIndex(c.url, "/"):], code, v)
		}
	}
	if requeued || h.Requeued() {
		t.Error("a stranger requeued the run")
	}
	if _, err := Listen("0.0.0.0:0", Config{Members: func(int) []int { return nil }}); err == nil {
		t.Error("Listen accepted a non-loopback address")
	}
}
