// Package lifecycle serves each run's lifecycle view to its body: a
// loopback HTTP endpoint whose per-run URL nymph puts in the body's
// environment as NYMPH_LIFECYCLE_URL (docs/lifecycle.md).
//
//	GET  <url>                → the view: phase, host_key, worker_id, invocation_id, attempt, deadline once draining
//	GET  <url>?wait=draining  → the same, once the drain starts (or the run ends)
//	POST <url>/requeue        → "done flushing: hand me back" (202; 409 unless draining)
//	POST <url>/publish        → publish a file or directory of the run as an artifact (publish.go)
//
// Warm processes of resident bodies pull their invocations from the same
// server, at a URL of their own (runtime.go).
//
// The URL's last segment is a secret of the run, and a request is answered
// only to a process of the run's process group (Linux: the caller's socket
// is looked up in /proc; peer_linux.go), so no other run — another
// invocation, another uid — reads it even when it learns the URL. It
// exposes no token, nothing of other runs, and nothing writable but the
// requeue and the run's own artifacts.
package lifecycle

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// Phases a body reads. Booting and terminating have no spelling here: no
// body runs before the daemon is set up, and once the grace is over the
// view still reads draining, its deadline past.
const (
	PhaseSetup    = "setup"    // the run's run_setup commands run
	PhaseReady    = "ready"    // the body runs
	PhaseDraining = "draining" // the daemon drains: the grace window runs until deadline
)

// pathPrefix is where the per-run URLs live.
const pathPrefix = "/v1/lifecycle/"

// View is what a run's endpoint answers.
type View struct {
	Phase        string     `json:"phase"`
	HostKey      string     `json:"host_key"`
	WorkerID     string     `json:"worker_id"`
	InvocationID string     `json:"invocation_id"`
	Attempt      int        `json:"attempt"`
	Deadline     *time.Time `json:"deadline,omitempty"`
}

// Run names one run: what its view says of it.
type Run struct {
	HostKey      string
	WorkerID     string
	InvocationID string
	Attempt      int
}

// Config configures a Server.
type Config struct {
	Logger *slog.Logger
	// Members lists the live processes of process group pgid: a caller
	// must be one of them (peer_linux.go; elsewhere every caller that
	// knows the URL is let in). Required.
	Members func(pgid int) []int
}

// Server is the lifecycle endpoint of one nymph process.
type Server struct {
	cfg  Config
	log  *slog.Logger
	ln   net.Listener
	http *http.Server
	base string // http://127.0.0.1:port
	// peer checks that the caller's socket (remote → local) is held by a
	// process of group pgid: inGroup, which tests replace.
	peer func(remote, local netip.AddrPort, pgid int, members func(pgid int) []int) error

	// nextHold bounds a held GET next; maxResult bounds a posted result
	// (runtime.go).
	nextHold  time.Duration
	maxResult int

	mu       sync.Mutex
	runs     map[[sha256.Size]byte]*entry
	warm     map[[sha256.Size]byte]*Warm
	draining bool
	deadline time.Time
	drained  chan struct{} // closed as the drain starts
	closing  chan struct{}
}

type entry struct {
	run   Run
	ended chan struct{}
	// Set by Attach, read under Server.mu: started is closed once the
	// body started (until then the run is in setup); group reports the
	// process group the run has running now; requeue ends the run once its
	// body asked to be handed back.
	started  <-chan struct{}
	group    func() int
	requeue  func()
	requeued bool
	// publish does a publish request's work (AttachPublish); nil: none.
	publish PublishFunc
}

// Listen starts a server on addr (a loopback address; port 0 picks one).
func Listen(addr string, cfg Config) (*Server, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().IsLoopback() {
		return nil, fmt.Errorf("lifecycle endpoint: %q is not a loopback address and port", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("lifecycle endpoint: listen on %s: %w", addr, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Members == nil {
		ln.Close()
		return nil, errors.New("lifecycle endpoint: no way to list a run's processes (Config.Members)")
	}
	s := newServer(cfg, "http://"+ln.Addr().String())
	s.ln = ln
	s.http = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("lifecycle endpoint stopped", "error", err.Error())
		}
	}()
	return s, nil
}

// newServer is a Server answering at base, not yet serving.
func newServer(cfg Config, base string) *Server {
	return &Server{
		cfg: cfg, log: cfg.Logger, base: base, peer: inGroup, nextHold: DefaultNextHold, maxResult: wire.MaxResultBlobBytes,
		runs: map[[sha256.Size]byte]*entry{}, warm: map[[sha256.Size]byte]*Warm{},
		drained: make(chan struct{}), closing: make(chan struct{}),
	}
}

// Close ends held requests and stops the server, within ctx.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	select {
	case <-s.closing:
	default:
		close(s.closing)
	}
	s.mu.Unlock()
	return s.http.Shutdown(ctx)
}

// Handle is one run's registration: its URL, and whether it asked to be
// handed back.
type Handle struct {
	s   *Server
	key [sha256.Size]byte
	e   *entry
	url string
}

// URL is the run's NYMPH_LIFECYCLE_URL. It holds the run's secret: it
// goes into the body's environment and nowhere else (never a log).
func (h *Handle) URL() string { return h.url }

// Requeued reports whether the body asked to be handed back.
func (h *Handle) Requeued() bool {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	return h.e.requeued
}

// Attach ties the registration to the run's processes, once started:
// started is closed as the body starts, group reports the process group
// the run has running now (a caller must be one of its members), and
// requeue is called once, from a request's goroutine, when the body asks
// to be handed back (it must not block). Until then every caller is
// refused.
func (h *Handle) Attach(started <-chan struct{}, group func() int, requeue func()) {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	h.e.started, h.e.group, h.e.requeue = started, group, requeue
}

// Close forgets the run: its URL answers 404 from now on, and a wait on
// it returns.
func (h *Handle) Close() {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	if _, ok := h.s.runs[h.key]; ok {
		delete(h.s.runs, h.key)
		close(h.e.ended)
	}
}

// Add registers run and reports its handle.
func (s *Server) Add(run Run) (*Handle, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("lifecycle endpoint: secret for %s: %w", run.InvocationID, err)
	}
	secret := base64.RawURLEncoding.EncodeToString(b[:])
	h := &Handle{s: s, key: sha256.Sum256([]byte(secret)), e: &entry{run: run, ended: make(chan struct{})}, url: s.base + pathPrefix + secret}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs[h.key] = h.e
	return h, nil
}

// Drain tells every run the daemon drains, with the grace window ending
// at deadline: views read draining, and waits for it return. A later call
// moves the deadline (a spot reclaim shortens the grace).
func (s *Server) Drain(deadline time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deadline = deadline.UTC().Truncate(time.Millisecond)
	if !s.draining {
		s.draining = true
		close(s.drained)
	}
}

// viewLocked reports e's view now (s.mu held).
func (s *Server) viewLocked(e *entry) View {
	v := View{Phase: PhaseReady, HostKey: e.run.HostKey, WorkerID: e.run.WorkerID, InvocationID: e.run.InvocationID, Attempt: e.run.Attempt}
	switch {
	case s.draining:
		d := s.deadline
		v.Phase, v.Deadline = PhaseDraining, &d
	case !isClosed(e.started):
		v.Phase = PhaseSetup
	}
	return v
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// ServeHTTP answers one request: the secret names the run, the caller
// must be one of its processes, then GET reads (or waits for) the view,
// POST …/requeue hands the run back and POST …/publish publishes an
// artifact.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if rest, ok := strings.CutPrefix(r.URL.Path, runtimePrefix); ok {
		s.serveRuntime(w, r, rest)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, pathPrefix)
	if !ok {
		writeError(w, http.StatusNotFound, "not found")
		return
	}
	secret, action, _ := strings.Cut(rest, "/")
	s.mu.Lock()
	e := s.runs[sha256.Sum256([]byte(secret))]
	s.mu.Unlock()
	if e == nil {
		writeError(w, http.StatusNotFound, "no such run (it may have ended)")
		return
	}
	s.mu.Lock()
	group := e.group
	s.mu.Unlock()
	if err := s.allowedGroup(r, group); err != nil {
		s.log.Warn("lifecycle endpoint: refused a caller that is not a process of the run",
			"invocation_id", e.run.InvocationID, "attempt", e.run.Attempt, "remote", r.RemoteAddr, "error", err.Error())
		writeError(w, http.StatusForbidden, "only the run's own processes may read its lifecycle view")
		return
	}
	switch {
	case action == "" && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		s.get(w, r, e)
	case action == "requeue" && r.Method == http.MethodPost:
		s.requeue(w, e)
	case action == "publish" && r.Method == http.MethodPost:
		s.publish(w, r, e)
	case action == "" || action == "requeue" || action == "publish":
		w.Header().Set("Allow", map[string]string{"": "GET", "requeue": "POST", "publish": "POST"}[action])
		writeError(w, http.StatusMethodNotAllowed, r.Method+" is not allowed here")
	default:
		writeError(w, http.StatusNotFound, "not found")
	}
}

// allowedGroup checks that the caller is a process of the process group
// group reports (nil, or 0: none runs, and nobody is let in).
func (s *Server) allowedGroup(r *http.Request, group func() int) error {
	remote, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return fmt.Errorf("remote address %q: %w", r.RemoteAddr, err)
	}
	la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return errors.New("no local address")
	}
	local, err := netip.ParseAddrPort(la.String())
	if err != nil {
		return fmt.Errorf("local address %q: %w", la, err)
	}
	pgid := 0
	if group != nil {
		pgid = waitGroup(r.Context(), group)
	}
	if pgid == 0 {
		return errors.New("the run has no process running")
	}
	return s.peer(unmap(remote), unmap(local), pgid, s.cfg.Members)
}

// groupWait bounds how long a request waits for its run's process group
// to be known. The daemon learns a group's id as its fork returns, and a
// process it just started may call before the daemon's goroutine has
// noted it (a loaded machine delays that goroutine): the caller then
// waits, and is checked against the group once it is known. A caller
// whose run has no process (it ended, or never started) is refused after
// the wait.
const groupWait = 2 * time.Second

// waitGroup reads group until it names a process group (non-zero), the
// request ends, or groupWait passes; 0 then.
func waitGroup(ctx context.Context, group func() int) int {
	if pgid := group(); pgid != 0 {
		return pgid
	}
	deadline := time.NewTimer(groupWait)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return 0
		case <-deadline.C:
			return group()
		case <-tick.C:
			if pgid := group(); pgid != 0 {
				return pgid
			}
		}
	}
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, e *entry) {
	if !s.awaitAsked(w, r, e.ended) {
		return
	}
	s.mu.Lock()
	v := s.viewLocked(e)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, v)
}

func (s *Server) requeue(w http.ResponseWriter, e *entry) {
	s.mu.Lock()
	if !s.draining {
		s.mu.Unlock()
		writeError(w, http.StatusConflict, "not draining: a run is handed back only once a drain starts (see phase)")
		return
	}
	first := !e.requeued
	e.requeued = true
	v, requeue := s.viewLocked(e), e.requeue
	s.mu.Unlock()
	if first {
		s.log.Info("the body asked to be handed back; ending it", "invocation_id", e.run.InvocationID, "attempt", e.run.Attempt)
		if requeue != nil {
			requeue()
		}
	}
	writeJSON(w, http.StatusAccepted, v)
}

// awaitAsked waits for what a view request's ?wait= asks (only
// "draining": the drain's start, or ended closing) and reports whether to
// answer with the view; false once it answered an error itself, or the
// request ended.
func (s *Server) awaitAsked(w http.ResponseWriter, r *http.Request, ended <-chan struct{}) bool {
	switch wait := r.URL.Query().Get("wait"); wait {
	case "":
	case PhaseDraining:
		select {
		case <-s.drained:
		case <-ended:
		case <-s.closing:
		case <-r.Context().Done():
			return false
		}
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("wait=%q: only wait=draining is known", wait))
		return false
	}
	return true
}

// unmap reads an IPv4-mapped IPv6 address as the IPv4 one, as the socket
// tables list it.
func unmap(ap netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()) }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}
