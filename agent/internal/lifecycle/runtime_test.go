package lifecycle

import (
	"bytes"
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

// runtimeTestServer is a server whose "process group" 4242 is this test
// process, so its requests pass the peer check.
func runtimeTestServer(t *testing.T) *Server {
	t.Helper()
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
	s.nextHold = 200 * time.Millisecond
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func runtimeDo(t *testing.T, method, url string, body []byte) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestRuntimeAPI: a warm process's view reads setup until it first asks
// for work; next holds, then answers 204; an offered task comes with its
// input, workdir, env and deadline; its result is recorded once, and a
// second answer or one for another id is refused; a result that is not
// JSON, or over the limit, fails the invocation; an error report carries
// its type and message; a shutdown answers 410.
func TestRuntimeAPI(t *testing.T) {
	s := runtimeTestServer(t)
	w, err := s.AddWarm(func() int { return 4242 }, "hk1_abc", "wrk_1")
	if err != nil {
		t.Fatal(err)
	}
	base := w.URL()
	if code, b := runtimeDo(t, "GET", base+"/lifecycle", nil); code != http.StatusOK || !strings.Contains(string(b), `"phase":"setup"`) ||
		!strings.Contains(string(b), `"host_key":"hk1_abc"`) || !strings.Contains(string(b), `"worker_id":"wrk_1"`) {
		t.Fatalf("view before the first next: %d %s", code, b)
	}
	if code, _ := runtimeDo(t, "GET", base+"/next", nil); code != http.StatusNoContent {
		t.Fatalf("next with nothing offered: %d, want 204", code)
	}
	if code, b := runtimeDo(t, "GET", base+"/lifecycle", nil); !strings.Contains(string(b), `"phase":"ready"`) {
		t.Fatalf("view after a next: %d %s", code, b)
	}

	deadline := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	offer, err := w.Offer(Task{InvocationID: "inv_1", Attempt: 2, WorkerID: "wrk_1", Input: json.RawMessage(`{"q":1}`),
		Workdir: "/w/inv_1/2", Env: map[string]string{"A": "b"}, Deadline: deadline})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Offer(Task{InvocationID: "inv_x"}); err == nil {
		t.Fatal("a second offer while one is unanswered was taken")
	}
	code, b := runtimeDo(t, "GET", base+"/next", nil)
	var got nextAnswer
	if err := json.Unmarshal(b, &got); code != http.StatusOK || err != nil {
		t.Fatalf("next: %d %s", code, b)
	}
	if got.InvocationID != "inv_1" || got.Attempt != 2 || string(got.Input) != `{"q":1}` || got.Workdir != "/w/inv_1/2" ||
		got.Env["A"] != "b" || got.Deadline == nil || !got.Deadline.Equal(deadline) {
		t.Fatalf("next answered %+v", got)
	}
	select {
	case <-offer.Taken():
	default:
		t.Fatal("Taken not closed once the process took the task")
	}
	if code, b := runtimeDo(t, "GET", base+"/lifecycle", nil); !strings.Contains(string(b), `"invocation_id":"inv_1"`) {
		t.Fatalf("view while the body runs: %d %s", code, b)
	}
	if code, _ := runtimeDo(t, "POST", base+"/inv_2/result", []byte(`1`)); code != http.StatusNotFound {
		t.Fatalf("a result for another invocation: %d, want 404", code)
	}
	if code, _ := runtimeDo(t, "POST", base+"/inv_1/result", []byte(" {\"score\": 0.5}\n")); code != http.StatusAccepted {
		t.Fatalf("result: %d", code)
	}
	if rep := <-offer.Reply(); rep.Failed() || string(rep.Result) != `{"score":0.5}` {
		t.Fatalf("reply %+v", rep)
	}
	if code, _ := runtimeDo(t, "POST", base+"/inv_1/result", []byte(`2`)); code != http.StatusNotFound {
		t.Fatalf("a second result: %d, want 404", code)
	}

	for _, c := range []struct {
		path, body   string
		status       int
		errType, msg string
	}{
		{"/result", "{not json", http.StatusBadRequest, ErrorTypeBadResult, "not one JSON value"},
		{"/result", `"` + strings.Repeat("x", s.maxResult) + `"`, http.StatusRequestEntityTooLarge, ErrorTypeBadResult, "over the limit"},
		{"/result", "\"\xff\"", http.StatusBadRequest, ErrorTypeBadResult, "not UTF-8"},
		{"/error", `{"error_type":"KeyError","error_message":"'x'","stack_trace":["a"]}`, http.StatusAccepted, ErrorTypeBodyError, "KeyError: 'x'"},
		{"/error", `oops`, http.StatusAccepted, ErrorTypeBodyError, "not a JSON object"},
	} {
		offer, err := w.Offer(Task{InvocationID: "inv_3"})
		if err != nil {
			t.Fatal(err)
		}
		if code, _ := runtimeDo(t, "GET", base+"/next", nil); code != http.StatusOK {
			t.Fatalf("next: %d", code)
		}
		if code, _ := runtimeDo(t, "POST", base+"/inv_3"+c.path, []byte(c.body)); code != c.status {
			t.Errorf("POST %s %.20q: %d, want %d", c.path, c.body, code, c.status)
		}
		if rep := <-offer.Reply(); rep.ErrorType != c.errType || !strings.Contains(rep.Message, c.msg) {
			t.Errorf("POST %s %.20q: reply %+v, want %s with %q", c.path, c.body, rep, c.errType, c.msg)
		}
	}

	if code, _ := runtimeDo(t, "POST", base+"/init/error", []byte(`{"error_type":"E","error_message":"m"}`)); code != http.StatusConflict {
		t.Fatalf("init/error after the first next: %d, want 409", code)
	}
	done := make(chan int)
	go func() {
		code, _ := runtimeDo(t, "GET", base+"/next", nil)
		done <- code
	}()
	time.Sleep(50 * time.Millisecond) // the request is most likely held by now; either way it must answer 410
	w.Shutdown()
	if code := <-done; code != http.StatusGone {
		t.Fatalf("next at shutdown: %d, want 410", code)
	}
	w.Close()
	if code, _ := runtimeDo(t, "GET", base+"/next", nil); code != http.StatusNotFound {
		t.Fatalf("next once closed: %d, want 404", code)
	}
}

// TestRuntimeAPIInitError: a process whose host setup failed reports it
// before its first next, once.
func TestRuntimeAPIInitError(t *testing.T) {
	s := runtimeTestServer(t)
	w, err := s.AddWarm(func() int { return 4242 }, "hk1_abc", "wrk_1")
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := runtimeDo(t, "POST", w.URL()+"/init/error", []byte(`{"error_type":"OSError","error_message":"no weights"}`)); code != http.StatusAccepted {
		t.Fatalf("init/error: %d", code)
	}
	if rep := <-w.InitFailed(); rep.ErrorType != ErrorTypeHostSetupFailed || rep.Message != "OSError: no weights" {
		t.Fatalf("init reply %+v", rep)
	}
}

// TestRuntimeAPIRefusesOthers: a caller that is not a process of the
// warm process's group gets nothing: no task, no view, no answer taken.
// A process not started yet (group 0) lets nobody in.
func TestRuntimeAPIRefusesOthers(t *testing.T) {
	s := runtimeTestServer(t)
	other, err := s.AddWarm(func() int { return 4343 }, "", "") // another run's process: not this test's
	if err != nil {
		t.Fatal(err)
	}
	unstarted, err := s.AddWarm(func() int { return 0 }, "", "")
	if err != nil {
		t.Fatal(err)
	}
	offer, err := other.Offer(Task{InvocationID: "inv_1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []*Warm{other, unstarted} {
		for _, c := range []struct{ method, path string }{
			{"GET", "/next"}, {"GET", "/lifecycle"}, {"GET", "/lifecycle?wait=draining"},
			{"POST", "/inv_1/result"}, {"POST", "/inv_1/error"}, {"POST", "/init/error"},
		} {
			code, b := runtimeDo(t, c.method, w.URL()+c.path, []byte(`{}`))
			if code != http.StatusForbidden || strings.Contains(string(b), "inv_1") {
				t.Errorf("%s %s by a stranger: %d %s", c.method, c.path, code, b)
			}
		}
	}
	select {
	case <-offer.Taken():
		t.Fatal("a stranger took the task")
	default:
	}
}

// TestRuntimeAPIWaitsForTheGroup: a process may call before the daemon
// has noted its process group (its fork returned, the goroutine that
// notes it not yet run): the request waits for the group, and is then
// checked against it, not refused for want of one.
func TestRuntimeAPIWaitsForTheGroup(t *testing.T) {
	s := runtimeTestServer(t)
	var pgid atomic.Int64
	w, err := s.AddWarm(func() int { return int(pgid.Load()) }, "", "")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		pgid.Store(4242)
	}()
	if code, b := runtimeDo(t, "GET", w.URL()+"/lifecycle", nil); code != http.StatusOK {
		t.Fatalf("a call before the group was noted: %d %s, want 200 once it is", code, b)
	}
}
