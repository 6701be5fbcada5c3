package lifecycle

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// post sends body to url and decodes the JSON answer.
func post(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	return callWith(t, http.MethodPost, url, strings.NewReader(body))
}

// publishRecorder is a PublishFunc that records its requests and answers
// as told.
type publishRecorder struct {
	mu   sync.Mutex
	reqs []PublishRequest
	err  error
}

func (p *publishRecorder) publish(_ context.Context, req PublishRequest) (wire.Artifact, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reqs = append(p.reqs, req)
	if p.err != nil {
		return wire.Artifact{}, p.err
	}
	return wire.Artifact{Name: req.Name, Attempt: 3, Size: 5, SHA256: "ab"}, nil
}

func (p *publishRecorder) calls() []PublishRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]PublishRequest(nil), p.reqs...)
}

// TestPublishRoute: the run's own process publishes (ready and while
// draining) and reads the recorded artifact; a bad body is 400 and never
// reaches the publisher; a publisher's refusal keeps its status; once
// the run ended nothing is published.
func TestPublishRoute(t *testing.T) {
	s := runtimeTestServer(t)
	h, err := s.Add(Run{InvocationID: "inv_1", Attempt: 3})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	close(started)
	h.Attach(started, func() int { return 4242 }, func() {})
	if code, v := post(t, h.URL()+"/publish", `{"path": "out.txt", "name": "x"}`); code != http.StatusServiceUnavailable {
		t.Fatalf("before a publisher is attached: %d %v", code, v)
	}
	rec := &publishRecorder{}
	h.AttachPublish(rec.publish)

	if code, v := post(t, h.URL()+"/publish", `{"path": "out.txt", "name": "x"}`); code != http.StatusCreated || v["name"] != "x" || v["size"] != 5.0 || v["attempt"] != 3.0 {
		t.Fatalf("publish: %d %v", code, v)
	}
	for _, body := range []string{``, `nope`, `{"path": 7}`, `{"name": "x"}`, `{"path": "a"} {"path": "b"}`, `[]`} {
		if code, v := post(t, h.URL()+"/publish", body); code != http.StatusBadRequest {
			t.Errorf("body %q: %d %v, want 400", body, code, v)
		}
	}
	if code, _ := call(t, "GET", h.URL()+"/publish"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET publish: %d", code)
	}
	s.Drain(time.Now().Add(time.Minute))
	if code, v := post(t, h.URL()+"/publish", `{"path": "/abs/ckpt"}`); code != http.StatusCreated {
		t.Fatalf("publish while draining: %d %v", code, v)
	}
	rec.err = &PublishError{Status: http.StatusRequestEntityTooLarge, Message: "over the limit"}
	if code, v := post(t, h.URL()+"/publish", `{"path": "big"}`); code != http.StatusRequestEntityTooLarge || v["error"] != "over the limit" {
		t.Fatalf("a refused publish: %d %v", code, v)
	}
	rec.err = io.ErrUnexpectedEOF
	if code, _ := post(t, h.URL()+"/publish", `{"path": "big"}`); code != http.StatusBadGateway {
		t.Fatalf("a failed publish: %d", code)
	}
	want := []PublishRequest{{Path: "out.txt", Name: "x"}, {Path: "/abs/ckpt"}, {Path: "big"}, {Path: "big"}}
	if got := rec.calls(); len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("the publisher saw %+v, want %+v", got, want)
	}
	h.Close()
	if code, _ := post(t, h.URL()+"/publish", `{"path": "out.txt"}`); code != http.StatusNotFound {
		t.Fatalf("after the run ended: %d", code)
	}
	if n := len(rec.calls()); n != len(want) {
		t.Fatalf("the publisher was called %d times, want %d", n, len(want))
	}
}

// TestPublishRefusesOthers: a caller that is not a process of the run
// publishes nothing (403), whatever it sends.
func TestPublishRefusesOthers(t *testing.T) {
	s, err := Listen("127.0.0.1:0", Config{Members: func(int) []int { return []int{1} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	h, err := s.Add(Run{InvocationID: "inv_1", Attempt: 1})
	if err != nil {
		t.Fatal(err)
	}
	h.Attach(make(chan struct{}), func() int { return 4242 }, func() {})
	rec := &publishRecorder{}
	h.AttachPublish(rec.publish)
	for _, body := range []string{`{"path": "out.txt"}`, `nope`} {
		if code, v := post(t, h.URL()+"/publish", body); code != http.StatusForbidden || v["name"] != nil {
			t.Errorf("a stranger's publish %q: %d %v", body, code, v)
		}
	}
	if n := len(rec.calls()); n != 0 {
		t.Fatalf("a stranger reached the publisher %d times", n)
	}
}
