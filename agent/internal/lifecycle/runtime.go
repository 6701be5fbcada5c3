package lifecycle

// The runtime API: how a warm process of a resident body pulls its
// invocations (docs/warm.md). Each warm process gets a URL of its own,
// NYMPH_RUNTIME_API, under the same secret-and-peer rule as a run's view:
// the last segment is a secret of the process, and only members of its
// process group are answered.
//
//	GET  <api>/next                → the next invocation (200), nothing yet (204: ask again), or end (410)
//	POST <api>/<invocation>/result → the invocation's result: one JSON value, or an empty body for none
//	POST <api>/<invocation>/error  → the body failed: {"error_type", "error_message", "stack_trace"}
//	POST <api>/init/error          → the on_host_setup hooks failed; the process then exits
//	GET  <api>/lifecycle           → the process's view (setup until its first next), ?wait=draining

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// runtimePrefix is where the warm processes' runtime APIs live.
const runtimePrefix = "/v1/runtime/"

// DefaultNextHold is how long a GET next waits for an invocation before
// it answers 204 (ask again): short enough that no proxy or client
// timeout cuts it, long enough that an idle process asks rarely.
const DefaultNextHold = 20 * time.Second

// maxErrorReport bounds what a POST …/error may send: a message and a
// stack trace.
const maxErrorReport = 256 << 10

// Error types a warm process's answer gives its invocation.
const (
	ErrorTypeBodyError       = "body_error"        // the body (or an on_run_setup hook) raised
	ErrorTypeBadResult       = "bad_result"        // the posted result is not JSON, not UTF-8, or over the limit
	ErrorTypeHostSetupFailed = "host_setup_failed" // the process's on_host_setup hooks failed
)

// Task is one invocation handed to a warm process.
type Task struct {
	InvocationID string
	Attempt      int
	WorkerID     string
	HostKey      string
	// Input is the invocation's input, compact JSON (nil: none).
	Input json.RawMessage
	// Workdir is the directory the body works in for this invocation.
	Workdir string
	// Env is what this invocation sets on top of the process's
	// environment.
	Env map[string]string
	// Deadline is when the invocation times out (zero: never).
	Deadline time.Time
}

// Reply is how a warm process answered its task.
type Reply struct {
	// Result is the result, compact JSON (nil: none).
	Result json.RawMessage
	// ErrorType and Message say why the invocation failed ("" for
	// success).
	ErrorType string
	Message   string
}

// Failed reports whether the reply fails the invocation.
func (r Reply) Failed() bool { return r.ErrorType != "" }

// nextAnswer is what GET next hands a process.
type nextAnswer struct {
	InvocationID string            `json:"invocation_id"`
	Attempt      int               `json:"attempt"`
	Input        json.RawMessage   `json:"input,omitempty"`
	Workdir      string            `json:"workdir"`
	Env          map[string]string `json:"env"`
	Deadline     *time.Time        `json:"deadline,omitempty"`
}

// errorReport is what POST …/error and init/error carry (the shape of
// Lambda's runtime API).
type errorReport struct {
	ErrorType    string   `json:"error_type"`
	ErrorMessage string   `json:"error_message"`
	StackTrace   []string `json:"stack_trace"`
}

// Warm is one warm process's registration with the runtime API.
type Warm struct {
	s   *Server
	key [sha256.Size]byte
	url string
	// group reports the process group of the warm process (0 before it
	// starts and after it ends): only its members are answered.
	group func() int

	// Under s.mu.
	asked    bool     // its first GET next arrived: it is past its host setup
	task     *Offered // the invocation handed or to hand, until answered
	last     Task     // what the view reports: the current or last task
	shutdown bool
	offered  chan struct{} // a signal (capacity 1): a task was offered, or the end came
	initErr  chan Reply    // capacity 1: the host setup failed
	ended    chan struct{}
}

// Offered is one task offered to a warm process, until it is answered.
type Offered struct {
	task  Task
	taken chan struct{}
	reply chan Reply // capacity 1
	// Under Server.mu.
	isTaken bool
}

// Taken is closed once the process has taken the task (its body starts).
func (o *Offered) Taken() <-chan struct{} { return o.taken }

// Reply delivers the process's answer, once.
func (o *Offered) Reply() <-chan Reply { return o.reply }

// AddWarm registers a warm process whose process group group reports,
// and returns its registration; its URL goes into the process's
// environment as NYMPH_RUNTIME_API. Its view names hostKey and workerID
// from the start (its on_host_setup may ask), then its invocations'.
func (s *Server) AddWarm(group func() int, hostKey, workerID string) (*Warm, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("runtime API: secret: %w", err)
	}
	secret := base64.RawURLEncoding.EncodeToString(b[:])
	w := &Warm{s: s, key: sha256.Sum256([]byte(secret)), url: s.base + runtimePrefix + secret, group: group,
		offered: make(chan struct{}, 1), initErr: make(chan Reply, 1), ended: make(chan struct{}),
		last: Task{HostKey: hostKey, WorkerID: workerID}}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.warm[w.key] = w
	return w, nil
}

// URL is the process's NYMPH_RUNTIME_API. It holds the process's secret:
// it goes into the process's environment and nowhere else.
func (w *Warm) URL() string { return w.url }

// Offer hands t to the process's next GET next. One task at a time: an
// offer while another is unanswered is an error.
func (w *Warm) Offer(t Task) (*Offered, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if w.task != nil {
		return nil, fmt.Errorf("runtime API: %s is still unanswered", w.task.task.InvocationID)
	}
	if w.shutdown {
		return nil, errors.New("runtime API: the process is shutting down")
	}
	o := &Offered{task: t, taken: make(chan struct{}), reply: make(chan Reply, 1)}
	w.task, w.last = o, t
	w.signal()
	return o, nil
}

// Withdraw forgets the task offered (its run was stopped, or the process
// died): a late answer for it is refused (404).
func (w *Warm) Withdraw() {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	w.task = nil
}

// InitFailed delivers the process's report that its host setup failed.
func (w *Warm) InitFailed() <-chan Reply { return w.initErr }

// Shutdown tells the process to end: a held or later GET next answers
// 410, and the process runs its on_shutdown hooks and exits.
func (w *Warm) Shutdown() {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	w.shutdown = true
	w.signal()
}

// Close forgets the process: its URL answers 404 from now on.
func (w *Warm) Close() {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if _, ok := w.s.warm[w.key]; ok {
		delete(w.s.warm, w.key)
		close(w.ended)
	}
}

// signal wakes a held GET next (s.mu held).
func (w *Warm) signal() {
	select {
	case w.offered <- struct{}{}:
	default:
	}
}

// serveRuntime answers one runtime API request: the secret names the
// process, the caller must be one of its members.
func (s *Server) serveRuntime(w http.ResponseWriter, r *http.Request, rest string) {
	secret, action, _ := strings.Cut(rest, "/")
	s.mu.Lock()
	p := s.warm[sha256.Sum256([]byte(secret))]
	s.mu.Unlock()
	if p == nil {
		writeError(w, http.StatusNotFound, "no such process (it may have been stopped)")
		return
	}
	if err := s.allowedGroup(r, p.group); err != nil {
		s.log.Warn("runtime API: refused a caller that is not a process of the warm process's group",
			"remote", r.RemoteAddr, "error", err.Error())
		writeError(w, http.StatusForbidden, "only the warm process's own processes may call its runtime API")
		return
	}
	first, second, _ := strings.Cut(action, "/")
	switch {
	case action == "next" && r.Method == http.MethodGet:
		s.next(w, r, p)
	case action == "lifecycle" && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		s.warmView(w, r, p)
	case action == "init/error" && r.Method == http.MethodPost:
		s.initError(w, r, p)
	case second == "result" && r.Method == http.MethodPost:
		s.answer(w, r, p, first, false)
	case second == "error" && r.Method == http.MethodPost:
		s.answer(w, r, p, first, true)
	case action == "next" || action == "lifecycle" || action == "init/error" || second == "result" || second == "error":
		writeError(w, http.StatusMethodNotAllowed, r.Method+" is not allowed here")
	default:
		writeError(w, http.StatusNotFound, "not found")
	}
}

// next hands the process its next task, holding the request until one is
// offered (or the hold passes: 204), or answers 410 once the process must
// end.
func (s *Server) next(w http.ResponseWriter, r *http.Request, p *Warm) {
	hold := time.NewTimer(s.nextHold)
	defer hold.Stop()
	for {
		s.mu.Lock()
		p.asked = true
		switch {
		case p.shutdown:
			s.mu.Unlock()
			writeJSON(w, http.StatusGone, map[string]any{"error": "the process is to end: run its shutdown hooks and exit", "shutdown": true})
			return
		case p.task != nil && p.task.isTaken:
			// Asked again without answering: that invocation failed.
			o := p.task
			p.task = nil
			s.mu.Unlock()
			o.reply <- Reply{ErrorType: ErrorTypeBodyError, Message: "the process asked for its next invocation without answering this one"}
			writeError(w, http.StatusConflict, fmt.Sprintf("%s was not answered: it failed", o.task.InvocationID))
			return
		case p.task != nil:
			o := p.task
			o.isTaken = true
			s.mu.Unlock()
			close(o.taken)
			t := o.task
			ans := nextAnswer{InvocationID: t.InvocationID, Attempt: t.Attempt, Input: t.Input, Workdir: t.Workdir, Env: t.Env}
			if !t.Deadline.IsZero() {
				d := t.Deadline.UTC().Truncate(time.Millisecond)
				ans.Deadline = &d
			}
			if ans.Env == nil {
				ans.Env = map[string]string{}
			}
			w.Header().Set("Lakeshore-Invocation-Id", t.InvocationID)
			writeJSON(w, http.StatusOK, ans)
			return
		}
		s.mu.Unlock()
		select {
		case <-p.offered:
		case <-hold.C:
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusNoContent)
			return
		case <-p.ended:
			writeError(w, http.StatusNotFound, "the process was stopped")
			return
		case <-s.closing:
			writeJSON(w, http.StatusGone, map[string]any{"error": "nymph is stopping", "shutdown": true})
			return
		case <-r.Context().Done():
			return
		}
	}
}

// answer takes the process's result (or error) for invocation id.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, p *Warm, id string, failed bool) {
	limit := int64(maxErrorReport)
	if !failed {
		limit = int64(s.maxResult)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "read the body: "+err.Error())
		return
	}
	s.mu.Lock()
	o := p.task
	if o == nil || !o.isTaken || o.task.InvocationID != id {
		s.mu.Unlock()
		writeError(w, http.StatusNotFound, fmt.Sprintf("%q is not the invocation this process holds", wire.ClipString(id, 200)))
		return
	}
	p.task = nil
	s.mu.Unlock()
	reply, status, msg := Reply{}, http.StatusAccepted, ""
	switch {
	case failed:
		reply = errorReply(ErrorTypeBodyError, body)
	case int64(len(body)) > limit:
		msg = fmt.Sprintf("the result is over the limit of %d bytes", s.maxResult)
		reply, status = Reply{ErrorType: ErrorTypeBadResult, Message: msg}, http.StatusRequestEntityTooLarge
	default:
		reply.Result, msg = compactResult(body, s.maxResult)
		if msg != "" {
			reply, status = Reply{ErrorType: ErrorTypeBadResult, Message: msg}, http.StatusBadRequest
		}
	}
	o.reply <- reply
	if status != http.StatusAccepted {
		writeError(w, status, msg+": the invocation failed")
		return
	}
	writeJSON(w, status, map[string]string{"status": "recorded"})
}

// compactResult reads a posted result: empty is none; otherwise one JSON
// value in UTF-8, at most max bytes compacted. msg says why not.
func compactResult(body []byte, max int) (json.RawMessage, string) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, ""
	}
	if !utf8.Valid(body) {
		return nil, "the result is not UTF-8"
	}
	if !json.Valid(body) {
		return nil, "the result is not one JSON value"
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, body); err != nil {
		return nil, "the result is not one JSON value: " + err.Error()
	}
	if buf.Len() > max {
		return nil, fmt.Sprintf("the result is over the limit of %d bytes", max)
	}
	return buf.Bytes(), ""
}

// errorReply reads a POST …/error body into the invocation's error.
func errorReply(errType string, body []byte) Reply {
	var rep errorReport
	if err := json.Unmarshal(body, &rep); err != nil || (rep.ErrorType == "" && rep.ErrorMessage == "") {
		return Reply{ErrorType: errType, Message: "the body failed (its error report was not a JSON object with error_type and error_message)"}
	}
	msg := rep.ErrorMessage
	if rep.ErrorType != "" {
		msg = rep.ErrorType + ": " + msg
	}
	return Reply{ErrorType: errType, Message: wire.ClipString(strings.TrimSuffix(msg, ": "), 2000)}
}

// initError takes the process's report that its host setup failed.
func (s *Server) initError(w http.ResponseWriter, r *http.Request, p *Warm) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxErrorReport+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "read the body: "+err.Error())
		return
	}
	s.mu.Lock()
	asked := p.asked
	s.mu.Unlock()
	if asked {
		writeError(w, http.StatusConflict, "the process is past its host setup")
		return
	}
	select {
	case p.initErr <- errorReply(ErrorTypeHostSetupFailed, body):
	default:
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"status": "recorded"})
}

// warmView answers the process's view (a View): setup until its first
// GET next, then ready, draining once the daemon drains; the invocation
// it serves, if any.
func (s *Server) warmView(w http.ResponseWriter, r *http.Request, p *Warm) {
	if !s.awaitAsked(w, r, p.ended) {
		return
	}
	s.mu.Lock()
	v := View{Phase: PhaseReady, HostKey: p.last.HostKey, WorkerID: p.last.WorkerID}
	if p.task != nil && p.task.isTaken {
		v.InvocationID, v.Attempt = p.task.task.InvocationID, p.task.task.Attempt
	}
	switch {
	case s.draining:
		d := s.deadline
		v.Phase, v.Deadline = PhaseDraining, &d
	case !p.asked:
		v.Phase = PhaseSetup
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, v)
}
