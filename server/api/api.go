// Package api is the control plane's HTTP router: every daemon and operator
// route of docs/design.md §3, with their tokens, over the store, and the web
// view. The daemon routes and the router they run in are daemonapi's (what
// the daemon functions serve alone); this package adds the rest. The same
// handler runs under Lambda (through lambdahttp), under `lakeshore dev` and
// in tests.
package api

import (
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/dreamlake/lakeshore/server/api/daemonapi"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/ui"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Config is what the router needs: the daemon routes' (the use cases, one
// Service per process, built by its main, and the tokens) and the web
// view's session store.
type Config struct {
	daemonapi.Config
	// Sessions keeps the web view's sessions (the store).
	Sessions ui.Sessions
}

// The web view keeps its sessions in the store.
var _ ui.Sessions = (*store.Store)(nil)

// Operator list bounds.
const (
	maxListLimit = 500
	defaultLimit = 100
)

// Server serves the wire API: the daemon routes' router (daemonapi) with
// the operator and artifact routes added, and the web view beside it.
type Server struct {
	core  *daemonapi.Router // the daemon routes, and the routes this package adds
	svc   *control.Service  // the use cases
	clock clock.Clock
	log   *slog.Logger
	ui    *ui.UI // the web view under /ui/ (docs/ui.md)
}

// New returns the router. It refuses a config without both tokens: a
// control plane must never run open.
func New(cfg Config) (*Server, error) {
	if cfg.Sessions == nil {
		return nil, errors.New("api: no session store")
	}
	core, err := daemonapi.New(cfg.Config)
	if err != nil {
		return nil, err
	}
	s := &Server{core: core, svc: cfg.Control, clock: cfg.Control.Clock(), log: cfg.Logger}
	if s.log == nil {
		s.log = slog.Default()
	}
	for pattern, h := range s.routeTable() {
		core.Handle(pattern, h)
	}
	// The web view acts through the operator routes, in this process.
	view, err := ui.New(ui.Config{API: core, OperatorToken: cfg.OperatorToken,
		PreviousOperatorToken: cfg.PreviousOperatorToken, Sessions: cfg.Sessions, Clock: s.clock, Logger: s.log})
	if err != nil {
		return nil, err
	}
	s.ui = view
	return s, nil
}

// routeTable maps every route pattern ("METHOD /path") this package adds
// to the daemon routes to its handler, operator routes already behind the
// operator token.
func (s *Server) routeTable() map[string]daemonapi.HandlerFunc {
	t := map[string]daemonapi.HandlerFunc{
		"GET /v1/healthz": s.healthz,

		"POST /v1/daemon/artifacts":          s.presignArtifact,
		"POST /v1/daemon/artifacts/complete": s.completeArtifact,
	}
	for pattern, h := range map[string]daemonapi.HandlerFunc{
		"POST /v1/invocations":               s.submit,
		"GET /v1/invocations":                s.listInvocations,
		"GET /v1/invocations/{id}":           s.getInvocation,
		"GET /v1/invocations/{id}/logs":      s.invocationLogs,
		"GET /v1/invocations/{id}/artifacts": s.invocationArtifacts,
		"GET /v1/runs/{id}/artifacts":        s.runArtifacts,
		"POST /v1/invocations/{id}/cancel":   s.cancel,
		"GET /v1/workers":                    s.listWorkers,
		"GET /v1/workers/{id}":               s.getWorker,
		"POST /v1/workers/{id}/drain":        s.drain,
		"POST /v1/workers/{id}/setup":        s.addSetup,
		"GET /v1/workers/{id}/setup-results": s.setupResults,
		"GET /v1/queues/{queue}":             s.queueStats,
		"GET /v1/hosts":                      s.listHosts,
		"POST /v1/hosts/release":             s.releaseHold,
		"POST /v1/runs":                      s.submitRun,
		"GET /v1/runs":                       s.listRuns,
		"GET /v1/runs/{id}":                  s.getRun,
		"GET /v1/runs/{id}/results":          s.runResults,
		"POST /v1/runs/{id}/cancel":          s.cancelRun,
		"POST /v1/runs/{id}/retry":           s.retryRun,
	} {
		t[pattern] = s.core.Operator(h)
	}
	return t
}

// Routes lists every route of the wire API ("METHOD /path", sorted).
func Routes() []string {
	own := (&Server{core: &daemonapi.Router{}}).routeTable()
	return slices.Sorted(slices.Values(append(daemonapi.Routes(), slices.Collect(maps.Keys(own))...)))
}

// GatewayRoutes lists what template.yaml's HttpApi must route to the
// functions, in its syntax: the wire API, and the web view (every path
// under /ui/, and /ui for its redirect).
func GatewayRoutes() []string {
	return slices.Sorted(slices.Values(append(Routes(), "GET /ui", "GET /ui/{proxy+}", "POST /ui/{proxy+}")))
}

// ServeHTTP answers a request: the web view under /ui/, the wire API
// (daemonapi.Router.ServeHTTP) everywhere else.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch p := r.URL.Path; {
	case p == "/ui" && r.Method == http.MethodGet:
		http.Redirect(w, r, ui.Prefix, http.StatusMovedPermanently)
		return
	case strings.HasPrefix(p, ui.Prefix):
		s.ui.ServeHTTP(w, r)
		return
	}
	s.core.ServeHTTP(w, r)
}

func (s *Server) healthz(r *http.Request) (int, any, error) {
	if err := s.svc.Ping(r.Context()); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.Health{Status: "ok"}, nil
}
