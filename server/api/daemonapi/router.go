// Package daemonapi is the daemon's part of the wire API (hello, poll, ack,
// bye, logs: docs/design.md §3) and the router they run in: tokens,
// routing, JSON answers and error codes. The daemon functions (hello, poll,
// ack, bye) serve this router alone, so they start without the web view,
// the operator routes or the artifact store; server/api builds the whole
// API on the same router, so every route answers alike wherever it runs.
package daemonapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/dreamlake/lakeshore/server/auth"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Config is what the router needs: the use cases (one Service per process,
// built by its main) and the tokens.
type Config struct {
	Control       *control.Service
	EnrollToken   string
	OperatorToken string
	// PreviousEnrollToken and PreviousOperatorToken, when set, are still
	// accepted while daemons and operators move to the current ones (a
	// rotation: docs/operations.md). Optional.
	PreviousEnrollToken   string
	PreviousOperatorToken string
	Logger                *slog.Logger
	// DaemonAuth is auth.DaemonAuthToken (the default) or auth.DaemonAuthIAM.
	DaemonAuth string
}

// authWarnEvery is how often a route logs a refused credential at warn: a
// stray client, a revoked token or a scanner must be visible without
// flooding the log with one line a request.
const authWarnEvery = time.Minute

// Router serves the daemon routes, and whatever routes Handle adds.
type Router struct {
	cfg     Config
	svc     *control.Service // the use cases
	clock   clock.Clock
	mux     *http.ServeMux
	log     *slog.Logger
	authLog auth.Limiter // the warn lines of refused credentials, per route
}

// New returns the router of the daemon routes. It refuses a config
// without both tokens: a control plane must never run open, and a daemon
// function that started with a half configuration would hide it until the
// api function met it.
func New(cfg Config) (*Router, error) {
	if cfg.Control == nil {
		return nil, errors.New("api: no use cases")
	}
	if cfg.EnrollToken == "" || cfg.OperatorToken == "" {
		return nil, errors.New("api: enrollment and operator tokens are both required")
	}
	for _, e := range []string{cfg.EnrollToken, cfg.PreviousEnrollToken} {
		for _, o := range []string{cfg.OperatorToken, cfg.PreviousOperatorToken} {
			if e != "" && e == o {
				return nil, errors.New("api: the enrollment and operator tokens must differ (current and previous alike)")
			}
		}
	}
	switch cfg.DaemonAuth {
	case "":
		cfg.DaemonAuth = auth.DaemonAuthToken
	case auth.DaemonAuthToken, auth.DaemonAuthIAM:
	default:
		return nil, fmt.Errorf("api: daemon auth must be %q or %q, got %q", auth.DaemonAuthToken, auth.DaemonAuthIAM, cfg.DaemonAuth)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Router{cfg: cfg, svc: cfg.Control, clock: cfg.Control.Clock(), mux: http.NewServeMux(), log: cfg.Logger,
		authLog: auth.Limiter{Every: authWarnEvery, Max: 1}}
	for pattern, h := range s.routeTable() {
		s.Handle(pattern, h)
	}
	return s, nil
}

// routeTable maps each daemon route pattern ("METHOD /path") to its handler.
func (s *Router) routeTable() map[string]HandlerFunc {
	return map[string]HandlerFunc{
		"POST /v1/daemon/hello": s.hello,
		"POST /v1/daemon/poll":  s.poll,
		"POST /v1/daemon/ack":   s.ack,
		"POST /v1/daemon/bye":   s.bye,
		"POST /v1/daemon/logs":  s.logs,
	}
}

// Routes lists the daemon routes this package serves ("METHOD /path",
// sorted).
func Routes() []string {
	return slices.Sorted(maps.Keys((&Router{}).routeTable()))
}

// HandlerFunc answers with a status and a JSON body (or a Lines body), or
// an error, which the router maps to its wire code.
type HandlerFunc func(r *http.Request) (status int, body any, err error)

// Lines is a body that writes itself (JSON lines, with its own headers)
// instead of being encoded as one JSON value.
type Lines interface {
	WriteResponse(w http.ResponseWriter, status int)
}

// Handle serves pattern ("METHOD /path") with h: its errors mapped to wire
// codes, refused credentials logged at a bounded rate.
func (s *Router) Handle(pattern string, h HandlerFunc) {
	s.mux.Handle(pattern, s.wrap(h))
}

// ServeHTTP answers a request of the wire API (/v1/...); unknown routes and
// methods get JSON errors.
//
// A path that is not canonical ("//", "/./", "/../", a trailing "/") is
// answered 404 here: ServeMux would redirect it with an HTML body, and a
// client that follows a redirect may send a POST twice.
func (s *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The escaped path, as ServeMux matches it: "..%2F" inside a segment
	// is that segment's value (and an id check refuses it), not a step up.
	if p := r.URL.EscapedPath(); p != "/" && path.Clean(p) != p {
		writeError(w, wire.Errorf(wire.CodeNoRoute, "no route %s %s: the path is not canonical (try %s)", r.Method, p, path.Clean("/"+p)))
		return
	}
	if _, pattern := s.mux.Handler(r); pattern == "" {
		s.noRoute(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Router) noRoute(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		writeError(w, wire.Errorf(wire.CodeNoRoute, "no route %s %s", r.Method, r.URL.Path))
		return
	}
	methods := strings.Join(allow, ", ")
	w.Header().Set("Allow", methods)
	writeError(w, wire.Errorf(wire.CodeNotAllowed, "%s %s is not allowed; use %s", r.Method, r.URL.Path, methods))
}

func (s *Router) wrap(h HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		status, body, err := h(r)
		if err != nil {
			status = wire.Status(wire.CodeOf(err))
			level := slog.LevelInfo
			attrs := []any{"method", r.Method, "path", r.URL.Path, "status", status, "error", err.Error(),
				"duration_ms", time.Since(start).Milliseconds()}
			switch {
			case status >= 500:
				level = slog.LevelError
			case status == http.StatusUnauthorized:
				// A client with a wrong, revoked or missing token: worth a
				// warning, once a minute per route; the others at debug,
				// counted in the next warning.
				level = slog.LevelDebug
				if ok, held := s.authLog.Note(r.Pattern, s.clock.Now()); ok {
					level = slog.LevelWarn
					attrs = append(attrs, "remote", r.RemoteAddr, "user_agent", r.UserAgent(), "refused_since_last_warning", held)
				}
			}
			s.log.Log(r.Context(), level, "request refused", attrs...)
			writeError(w, err)
			return
		}
		s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "status", status,
			"duration_ms", time.Since(start).Milliseconds())
		writeJSON(w, status, body)
	})
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	if body == nil {
		w.WriteHeader(status)
		return
	}
	if page, ok := body.(Lines); ok {
		page.WriteResponse(w, status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func writeError(w http.ResponseWriter, err error) {
	writeJSON(w, wire.Status(wire.CodeOf(err)), wire.BodyFor(err))
}

// Operator guards a route with the operator token.
func (s *Router) Operator(h HandlerFunc) HandlerFunc {
	return func(r *http.Request) (int, any, error) {
		if !auth.EqualAny(auth.Bearer(r), s.cfg.OperatorToken, s.cfg.PreviousOperatorToken) {
			return 0, nil, wire.Errorf(wire.CodeUnauthorized, "operator routes need Authorization: Bearer <operator token>")
		}
		return h(r)
	}
}

// WorkerRequest reads a daemon route's token and body: the token must be
// shaped like a worker token (401, checked before the body is read), and the
// body's worker_id must be the token's worker (403). It returns the check
// the store call that follows makes on the worker's row: the secret against
// the stored hash and, in IAM mode, the row's machine against the caller.
func (s *Router) WorkerRequest(r *http.Request, body interface {
	wire.Validator
	Worker() string
}) (store.Authorize, error) {
	instance, err := s.callerInstance(r)
	if err != nil {
		return nil, err
	}
	tok := s.daemonToken(r)
	owner, ok := auth.WorkerOf(tok)
	if !ok {
		if s.cfg.DaemonAuth == auth.DaemonAuthIAM {
			return nil, wire.Errorf(wire.CodeUnauthorized, "daemon routes need %s: <worker token from hello>", wire.TokenHeader)
		}
		return nil, wire.Errorf(wire.CodeUnauthorized, "daemon routes need Authorization: Bearer <worker token from hello>")
	}
	if err := wire.Decode(r.Body, body); err != nil {
		return nil, err
	}
	if owner != body.Worker() {
		return nil, wire.Errorf(wire.CodeForbidden, "the token belongs to another worker than %s", body.Worker())
	}
	return func(w domain.Worker) error {
		if !auth.HashMatches(tok, w.TokenHash) {
			return store.ErrWorkerToken
		}
		return sameInstance(instance, w.MachineID)
	}, nil
}
