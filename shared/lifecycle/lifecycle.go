// Package lifecycle lets a body (a process nymph runs) ask nymph where its run
// is in its life and take part in a drain.
//
// nymph puts the URL of a per-run loopback endpoint in each body's environment
// as NYMPH_LIFECYCLE_URL. Through it a body reads its phase (setup, ready,
// draining), the worker's host key and its invocation (Get, Phase, HostKey);
// waits for a drain (WaitDraining); runs shutdown hooks within the drain's
// grace window (OnShutdown); publishes files and directories as artifacts
// of its attempt (Publish); and, once it has flushed, hands its invocation
// back to the queue instead of recording an outcome (Requeue).
//
// Outside nymph (the variable unset) the package stays out of the way: Phase
// and HostKey report "", OnShutdown hooks never run, and the calls that need
// the endpoint return ErrNotUnderNymph.
//
// The URL's path is a secret of the run, so nothing here logs it or puts it in
// an error; errors say "the lifecycle endpoint" instead.
//
// The package uses the standard library only, so any Go body can import it.
package lifecycle

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// EnvURL is the environment variable nymph sets to the run's lifecycle
// endpoint.
const EnvURL = "NYMPH_LIFECYCLE_URL"

// The phases of a run, as View.Phase reports them.
const (
	// PhaseSetup: the run's setup commands are still running.
	PhaseSetup = "setup"
	// PhaseReady: the body is running and no drain has started.
	PhaseReady = "ready"
	// PhaseDraining: the worker is draining; the body has until
	// View.Deadline to flush and exit (or to Requeue).
	PhaseDraining = "draining"
)

// View is what the lifecycle endpoint reports about the run. Fields the
// endpoint adds later are ignored.
type View struct {
	Phase        string `json:"phase"`
	HostKey      string `json:"host_key"` // "" when the worker has none
	WorkerID     string `json:"worker_id"`
	InvocationID string `json:"invocation_id"`
	Attempt      int    `json:"attempt"`
	// Deadline is the end of the drain's grace window; zero until the
	// phase is draining.
	Deadline time.Time `json:"deadline,omitzero"`
}

// ErrNotUnderNymph is returned by the calls that need the lifecycle endpoint
// when NYMPH_LIFECYCLE_URL is unset, i.e. the process is not a nymph body.
var ErrNotUnderNymph = errors.New("lifecycle: not running under nymph (" + EnvURL + " is unset)")

// StatusError is the lifecycle endpoint's refusal: a non-2xx answer, with the
// message of its {"error": "..."} body.
type StatusError struct {
	Code    int    // HTTP status
	Message string // the server's message; may be ""
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("%d %s", e.Code, http.StatusText(e.Code))
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

const (
	// probeTimeout bounds Phase and HostKey, which must not stall a body
	// that only wants to log or branch on the answer.
	probeTimeout = 2 * time.Second
	// The pause before asking again after a failed or early-answered wait:
	// doubled after each error up to maxPause, so a nymph that restarts or
	// answers at once is neither hammered nor waited on for long.
	minPause = 100 * time.Millisecond
	maxPause = 5 * time.Second
	// maxBody bounds what is read of an answer; a view is tiny.
	maxBody = 1 << 20
)

// errBadURL says the variable is set but is not something to send HTTP to.
// It names the variable, never its value.
var errBadURL = errors.New(EnvURL + " is not an http URL")

// client is the package's state: where the endpoint is, how to reach it, and
// the OnShutdown hooks. The package functions use std; tests build their own.
type client struct {
	url func() string // the endpoint's URL, "" outside nymph
	hc  *http.Client

	mu       sync.Mutex
	hooks    []func(context.Context) // registered and not yet run
	watching bool                    // the goroutine waiting for the drain is started
	running  bool                    // a goroutine is running hooks
	drain    *View                   // the draining view, once seen
}

var std = &client{
	url: func() string { return os.Getenv(EnvURL) },
	hc: &http.Client{
		// A transport of its own with no proxy: a proxy named by
		// HTTP_PROXY in the body's environment must never see the
		// secret URL. No client timeout: a wait is a held request,
		// bounded by its context.
		Transport: &http.Transport{IdleConnTimeout: 30 * time.Second},
	},
}

// Get reports the run's current view.
func Get(ctx context.Context) (View, error) { return std.get(ctx) }

// WaitDraining blocks until the run is draining and reports that view. It
// asks again, after a short pause (longer after repeated failures, at most
// 5 s), when the endpoint answers early or fails, and gives up when ctx ends
// or when the endpoint refuses the caller for good (a 4xx such as 403 or
// 404: asking again cannot help).
func WaitDraining(ctx context.Context) (View, error) { return std.waitDraining(ctx) }

// Phase reports the run's phase, or "" outside nymph or when the endpoint
// cannot be read within a short timeout. It fails soft, for a body that
// only wants to log or branch on the answer.
func Phase() string { return std.probe().Phase }

// HostKey reports the worker's host key ("hk1_..."), or "" when the worker
// has none, outside nymph, or when the endpoint cannot be read within a
// short timeout.
func HostKey() string { return std.probe().HostKey }

// OnShutdown registers f to run when the run starts draining. The first
// registration starts one goroutine that waits for the drain (WaitDraining)
// and then runs the hooks one at a time in registration order, each with a
// context whose deadline is View.Deadline: hooks share the grace window, so
// a slow first hook leaves less for the next. A hook registered after the
// drain was seen runs at once (after any still running). Outside nymph, or if
// the endpoint refuses for good, the hooks never run.
//
// A shutdown hook that has flushed may end with Requeue; nymph then ends the
// body, so Requeue belongs in the last hook.
func OnShutdown(f func(ctx context.Context)) { std.onShutdown(f) }

// Requeue asks nymph to hand this invocation back to the queue instead of
// recording an outcome: "I am done flushing". It is accepted only while the
// run is draining (otherwise a *StatusError with Code 409). Once it is
// accepted nymph ends the body (SIGTERM to its process group, then SIGKILL),
// so it is the last thing a shutdown hook does.
func Requeue(ctx context.Context) error { return std.requeue(ctx) }

func (c *client) get(ctx context.Context) (View, error) {
	v, err := c.do(ctx, http.MethodGet, "")
	return v, wrap("get the lifecycle endpoint", err)
}

func (c *client) probe() View {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	v, err := c.do(ctx, http.MethodGet, "")
	if err != nil {
		return View{}
	}
	return v
}

func (c *client) requeue(ctx context.Context) error {
	_, err := c.do(ctx, http.MethodPost, "/requeue")
	return wrap("requeue at the lifecycle endpoint", err)
}

// Artifact is a published artifact as the control plane recorded it.
// Fields the endpoint adds later are ignored.
type Artifact struct {
	Name    string `json:"name"`
	Attempt int    `json:"attempt"`
	Size    int64  `json:"size"`
	// SHA256 is the content's digest, lower-case hex; a directory's
	// content is its tar.gz.
	SHA256      string    `json:"sha256"`
	ContentType string    `json:"content_type,omitempty"`
	CreatedAt   time.Time `json:"created_at,omitzero"`
}

// Publish publishes the file or directory at path as the artifact name of
// this attempt ("" names it by path's base name), and reports it once
// recorded. A relative path is made absolute against the process's working
// directory; the path must lie inside the run's directory (a symbolic link
// out of it is refused). A directory is sent as a tar.gz of its regular
// files and directories. It works while the run drains, so a shutdown hook
// can flush a checkpoint this way, and ends with ctx (a large artifact
// takes as long as its upload).
//
// A refusal is a *StatusError: 400 a bad name or path, 404 no such path,
// 409 the attempt has ended, 413 over a limit, 502 the upload failed.
// Publishing a name again replaces the earlier artifact of that name.
func Publish(ctx context.Context, path, name string) (Artifact, error) {
	return std.publish(ctx, path, name)
}

func (c *client) publish(ctx context.Context, path, name string) (Artifact, error) {
	const op = "publish at the lifecycle endpoint"
	if path == "" {
		return Artifact{}, wrap(op, errors.New("path is empty"))
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return Artifact{}, wrap(op, fmt.Errorf("make %q absolute: %w", path, err))
	}
	body, err := json.Marshal(map[string]string{"path": abs, "name": name})
	if err != nil {
		return Artifact{}, wrap(op, err)
	}
	var a Artifact
	return a, wrap(op, c.send(ctx, http.MethodPost, "/publish", body, &a))
}

func (c *client) waitDraining(ctx context.Context) (View, error) {
	const op = "wait for draining at the lifecycle endpoint"
	pause := minPause
	for {
		v, err := c.do(ctx, http.MethodGet, "?wait=draining")
		switch {
		case err == nil && v.Phase == PhaseDraining:
			return v, nil
		case ctx.Err() != nil:
			return View{}, wrap(op, context.Cause(ctx))
		case err != nil && permanent(err):
			return View{}, wrap(op, err)
		case err == nil:
			// Answered early (nymph shutting down, or a phase change
			// short of draining): ask again, after a short pause so a
			// server that never holds cannot make this spin.
			pause = minPause
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return View{}, wrap(op, context.Cause(ctx))
		case <-t.C:
		}
		if err != nil {
			pause = min(2*pause, maxPause)
		}
	}
}

// permanent reports whether asking again cannot help: not under nymph, a
// bad URL, or a 4xx other than a timeout or rate limit.
func permanent(err error) bool {
	if errors.Is(err, ErrNotUnderNymph) || errors.Is(err, errBadURL) {
		return true
	}
	var se *StatusError
	return errors.As(err, &se) && se.Code >= 400 && se.Code < 500 &&
		se.Code != http.StatusRequestTimeout && se.Code != http.StatusTooManyRequests
}

// do sends one request to the endpoint (suffix appended to its URL) and
// decodes the view it answers. Its errors never hold the URL.
func (c *client) do(ctx context.Context, method, suffix string) (View, error) {
	var v View
	if err := c.send(ctx, method, suffix, nil, &v); err != nil {
		return View{}, err
	}
	return v, nil
}

// send sends one request to the endpoint (suffix appended to its URL),
// with body as JSON when it is not nil, and decodes the answer into out.
// Its errors never hold the URL.
func (c *client) send(ctx context.Context, method, suffix string, body []byte, out any) error {
	base := strings.TrimRight(strings.TrimSpace(c.url()), "/")
	if base == "" {
		return ErrNotUnderNymph
	}
	// Parse errors quote the URL, so they are replaced, not wrapped.
	if u, err := url.Parse(base); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errBadURL
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+suffix, rd)
	if err != nil {
		return errBadURL
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		// A *url.Error quotes the URL: keep only its cause (which
		// names at most host:port, and keeps context errors visible
		// to errors.Is).
		var ue *url.Error
		if errors.As(err, &ue) {
			return ue.Err
		}
		return err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("read the answer: %w", err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(answer, &e) // a body that is not JSON leaves no message
		return &StatusError{Code: resp.StatusCode, Message: e.Error}
	}
	if err := json.Unmarshal(answer, out); err != nil {
		return fmt.Errorf("decode the answer: %w", err)
	}
	return nil
}

// wrap puts the operation in front of err; ErrNotUnderNymph stays bare so it
// reads as it is documented.
func wrap(op string, err error) error {
	if err == nil || errors.Is(err, ErrNotUnderNymph) {
		return err
	}
	return fmt.Errorf("lifecycle: %s: %w", op, err)
}

func (c *client) onShutdown(f func(context.Context)) {
	if f == nil || strings.TrimSpace(c.url()) == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hooks = append(c.hooks, f)
	if c.drain != nil && !c.running {
		c.running = true
		go c.runHooks()
	}
	if !c.watching {
		c.watching = true
		go c.watch()
	}
}

// watch waits for the drain, then runs the hooks registered so far.
func (c *client) watch() {
	v, err := c.waitDraining(context.Background())
	if err != nil {
		return // refused for good: there is no drain to run hooks for
	}
	c.mu.Lock()
	c.drain = &v
	start := !c.running
	c.running = true
	c.mu.Unlock()
	if start {
		c.runHooks()
	}
}

// runHooks runs registered hooks one at a time, in order, until none is
// left; one goroutine at a time runs it (c.running).
func (c *client) runHooks() {
	for {
		c.mu.Lock()
		if len(c.hooks) == 0 {
			c.running = false
			c.mu.Unlock()
			return
		}
		f := c.hooks[0]
		c.hooks[0] = nil
		c.hooks = c.hooks[1:]
		v := *c.drain
		c.mu.Unlock()
		runHook(f, v.Deadline)
	}
}

func runHook(f func(context.Context), deadline time.Time) {
	ctx := context.Background()
	if !deadline.IsZero() { // nymph always sends one; without it there is nothing to cancel on
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	f(ctx)
}
