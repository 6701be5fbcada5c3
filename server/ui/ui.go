// Package ui is the control plane's web view of the fleet (docs/ui.md): a
// login with the operator token, the workers by state, the queues, a
// timeline of attempts per worker, an invocation's history and output, the
// runs and each run's progress and failed jobs, and the operator's actions
// (cancel, drain, setup; cancel a run, retry its failed jobs). It is served by the same
// router as the API (the api function on AWS, lakeshore dev locally), is a
// client of that API's operator routes in-process, renders everything on
// the server (html/template, SVG) and needs no JavaScript; a small script
// refreshes the page's parts every 2 s where it runs.
package ui

import (
	"cmp"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/display"
	"github.com/dreamlake/lakeshore/shared/wire"
)

//go:embed assets
var assets embed.FS

// Prefix is where the view is served (pinned: GET /ui/).
const Prefix = "/ui/"

// defaultWindow is the timeline's span unless ?minutes= says otherwise.
const defaultWindow = 15 * time.Minute

// listLimit bounds what one page reads of the fleet.
const listLimit = 500

// Config is what the view needs.
type Config struct {
	// API serves the operator routes (/v1/...) the view reads and acts
	// through, with the operator token.
	API           http.Handler
	OperatorToken string
	// PreviousOperatorToken, during a rotation, still logs in, and the
	// sessions it opened last until it is removed.
	PreviousOperatorToken string
	// Sessions keeps the view's sessions (the store): required.
	Sessions Sessions
	// SessionIdle is how long a session may go without a page load or an
	// action (default DefaultSessionIdle).
	SessionIdle time.Duration
	Clock       clock.Clock
	Logger      *slog.Logger
}

// UI is the web view's handler.
type UI struct {
	cfg Config
	// fingerprints name the operator tokens accepted now (tokenFingerprint).
	fingerprints []string
	logins       *loginLimits
	api          *client.Client
	tmpl         *template.Template
	mux          *http.ServeMux
	log          *slog.Logger
}

// New returns the view for cfg.
func New(cfg Config) (*UI, error) {
	if cfg.API == nil || cfg.OperatorToken == "" || cfg.Sessions == nil {
		return nil, errors.New("ui: an API handler, the operator token and a session store are required")
	}
	if cfg.SessionIdle <= 0 {
		cfg.SessionIdle = DefaultSessionIdle
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	tmpl, err := template.New("ui").ParseFS(assets, "assets/*.html")
	if err != nil {
		return nil, fmt.Errorf("ui: templates: %w", err)
	}
	u := &UI{cfg: cfg, logins: newLoginLimits(), tmpl: tmpl, mux: http.NewServeMux(), log: cfg.Logger,
		api: client.New("http://api.in-process", cfg.OperatorToken, client.WithHTTPClient(&http.Client{Transport: inProcess{cfg.API}}),
			client.WithUserAgent("lakeshore-ui/1"))}
	for _, tok := range []string{cfg.OperatorToken, cfg.PreviousOperatorToken} {
		if tok != "" {
			u.fingerprints = append(u.fingerprints, tokenFingerprint(tok))
		}
	}
	static, _ := fs.Sub(assets, "assets")
	u.mux.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", http.FileServerFS(static)))
	u.mux.HandleFunc("GET /ui/{$}", u.withSession(false, u.index))
	u.mux.HandleFunc("POST /ui/login", u.login)
	u.mux.HandleFunc("POST /ui/logout", u.withSession(true, u.logout))
	u.mux.HandleFunc("GET /ui/live", u.withSession(false, u.live))
	u.mux.HandleFunc("GET /ui/invocations/{id}", u.withSession(false, u.invocation))
	u.mux.HandleFunc("GET /ui/invocations/{id}/live", u.withSession(false, u.invocationLive))
	u.mux.HandleFunc("GET /ui/invocations/{id}/output", u.withSession(false, u.wholeOutput))
	u.mux.HandleFunc("GET /ui/invocations/{id}/artifacts/{attempt}/{name}", u.withSession(false, u.artifact))
	u.mux.HandleFunc("POST /ui/invocations/{id}/cancel", u.withSession(true, u.cancel))
	u.mux.HandleFunc("GET /ui/runs", u.withSession(false, u.runs))
	u.mux.HandleFunc("GET /ui/runs/live", u.withSession(false, u.runsLive))
	u.mux.HandleFunc("GET /ui/runs/{id}", u.withSession(false, u.run))
	u.mux.HandleFunc("GET /ui/runs/{id}/live", u.withSession(false, u.runLive))
	u.mux.HandleFunc("POST /ui/runs/{id}/cancel", u.withSession(true, u.cancelRun))
	u.mux.HandleFunc("POST /ui/runs/{id}/retry", u.withSession(true, u.retryRun))
	u.mux.HandleFunc("GET /ui/hosts", u.withSession(false, u.hosts))
	u.mux.HandleFunc("GET /ui/hosts/live", u.withSession(false, u.hostsLive))
	u.mux.HandleFunc("POST /ui/workers/{id}/drain", u.withSession(true, u.drain))
	u.mux.HandleFunc("POST /ui/workers/{id}/setup", u.withSession(true, u.setup))
	return u, nil
}

func (u *UI) now() time.Time { return u.cfg.Clock.Now() }

// csp allows this origin's own script, style and fetches, and nothing
// else: no inline script, no third-party asset, no framing.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// ServeHTTP answers a request under Prefix.
func (u *UI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if _, pattern := u.mux.Handler(r); pattern == "" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	u.mux.ServeHTTP(w, r)
}

// withSession runs h for a request with a live session (and, for an
// action, its CSRF token). Without one the fleet page is the login form,
// another page goes to it, a script's request gets 401, an action 403.
func (u *UI) withSession(action bool, h func(w http.ResponseWriter, r *http.Request, sess string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sess, err := u.session(r)
		switch {
		case err != nil:
			u.log.Error("ui: session", "error", err.Error())
			http.Error(w, "the session could not be read; try again", http.StatusServiceUnavailable)
		case sess == "" && r.Method == http.MethodGet && r.URL.Path == Prefix:
			u.render(w, http.StatusOK, "login.html", map[string]any{})
		case sess == "" && r.Method == http.MethodGet && !wantsJSON(r):
			http.Redirect(w, r, Prefix, http.StatusSeeOther)
		case sess == "" && r.Method == http.MethodGet:
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "not logged in"})
		case sess == "":
			http.Error(w, "not logged in", http.StatusForbidden)
		case action && !u.csrfOK(r, sess):
			u.log.Warn("ui: refused an action without its CSRF token", "path", r.URL.Path)
			http.Error(w, "missing or wrong CSRF token: reload the page and try again", http.StatusForbidden)
		default:
			h(w, r, sess)
		}
	}
}

func wantsJSON(r *http.Request) bool {
	return strings.HasSuffix(r.URL.Path, "/live") || strings.Contains(r.Header.Get("Accept"), "application/json")
}

func (u *UI) index(w http.ResponseWriter, r *http.Request, sess string) {
	f, err := u.fleet(r.Context(), sess, r)
	u.page(w, "fleet.html", f, err)
}

// live answers the fleet page's parts, rendered, for the script to swap in.
func (u *UI) live(w http.ResponseWriter, r *http.Request, sess string) {
	f, err := u.fleet(r.Context(), sess, r)
	u.liveParts(w, f, err, "workers", "queues", "timeline", "recent")
}

func (u *UI) invocation(w http.ResponseWriter, r *http.Request, sess string) {
	p, err := u.invocationOf(r, sess)
	u.page(w, "invocation.html", p, err)
}

func (u *UI) invocationLive(w http.ResponseWriter, r *http.Request, sess string) {
	p, err := u.invocationOf(r, sess)
	u.liveParts(w, p, err, "invocation")
}

// invocationOf reads the invocation page r asks for: {id}, ?attempt=.
func (u *UI) invocationOf(r *http.Request, sess string) (invPage, error) {
	n, err := attemptParam(r)
	if err != nil {
		return invPage{}, err
	}
	return u.invocationPage(r.Context(), sess, r.PathValue("id"), n)
}

// page answers template name rendered with data, or the error page for
// err.
func (u *UI) page(w http.ResponseWriter, name string, data any, err error) {
	if err != nil {
		u.fail(w, err)
		return
	}
	u.render(w, http.StatusOK, name, data)
}

// liveParts answers the named parts rendered with data, or err as JSON.
func (u *UI) liveParts(w http.ResponseWriter, data any, err error, names ...string) {
	if err != nil {
		writeJSON(w, statusOf(err), map[string]string{"error": err.Error()})
		return
	}
	u.parts(w, data, names...)
}

func (u *UI) cancel(w http.ResponseWriter, r *http.Request, _ string) {
	id := r.PathValue("id")
	_, err := u.api.CancelInvocation(r.Context(), id)
	u.acted(w, r, "cancel "+id, err, back(r, "/ui/invocations/"+id))
}

func (u *UI) drain(w http.ResponseWriter, r *http.Request, _ string) {
	id := r.PathValue("id")
	_, err := u.api.DrainWorker(r.Context(), id)
	u.acted(w, r, "drain "+id, err, Prefix)
}

func (u *UI) setup(w http.ResponseWriter, r *http.Request, _ string) {
	id, cmd := r.PathValue("id"), strings.TrimSpace(r.PostFormValue("command"))
	if cmd == "" {
		http.Error(w, "setup: the command is empty", http.StatusBadRequest)
		return
	}
	_, err := u.api.AddSetup(r.Context(), id, []string{"/bin/sh", "-c", cmd})
	u.acted(w, r, "setup on "+id, err, Prefix)
}

// acted ends an action: back to the page it came from, or the API's
// refusal as the answer.
func (u *UI) acted(w http.ResponseWriter, r *http.Request, what string, err error, to string) {
	if err != nil {
		http.Error(w, what+": "+err.Error(), statusOf(err))
		return
	}
	u.log.Info("ui: operator action", "action", what)
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// window reads ?minutes= (1-1440) for the timeline.
func window(r *http.Request) time.Duration {
	if n, err := strconv.Atoi(r.URL.Query().Get("minutes")); err == nil && n >= 1 && n <= 1440 {
		return time.Duration(n) * time.Minute
	}
	return defaultWindow
}

// fleet reads what the fleet page at r shows: the workers, every queue's
// live work (running, then queued, oldest first) and the newest
// invocations for the timeline and the counts, and the page of the
// invocation list r's query asks for, each read by index, so the page
// costs the same however long the history.
func (u *UI) fleet(ctx context.Context, sess string, r *http.Request) (fleet, error) {
	rq, err := parseRecent(r.URL.Query())
	if err != nil {
		return fleet{}, err
	}
	win := window(r)
	now := u.now()
	wl, err := u.api.ListWorkers(ctx, listLimit, "")
	if err != nil {
		return fleet{}, fmt.Errorf("list workers: %w", err)
	}
	var lists [3][]wire.Invocation
	for i, p := range []client.ListInvocationsParams{
		{State: wire.StateRunning, Limit: listLimit},
		{State: wire.StateQueued, Limit: listLimit},
		// The newest of every state, for the timeline: a longer history
		// costs nothing more.
		{Order: wire.OrderNewest, Limit: timelineNewest},
	} {
		il, err := u.api.ListInvocations(ctx, p)
		if err != nil {
			return fleet{}, fmt.Errorf("list invocations: %w", err)
		}
		lists[i] = il.Invocations
	}
	running, queued, newest := lists[0], lists[1], lists[2]
	seen := map[string]bool{}
	var invs []wire.Invocation
	for _, inv := range slices.Concat(running, queued, newest) {
		if !seen[inv.InvocationID] {
			seen[inv.InvocationID] = true
			invs = append(invs, inv)
		}
	}
	slices.SortFunc(invs, func(a, b wire.Invocation) int { return b.CreatedAt.Compare(a.CreatedAt) })
	f := fleet{Groups: groupWorkers(wl.Workers, now), CSRF: u.csrfToken(sess),
		Timeline: layoutTimeline(invs, wl.Workers, now, win),
		LiveURL:  Prefix + "live?" + rq.values("minutes", strconv.Itoa(int(win/time.Minute))).Encode(), States: wire.InvocationStates}
	if f.Recent, err = u.recentList(ctx, rq, win, labels(wl.Workers), now); err != nil {
		return fleet{}, err
	}
	queues := map[string]bool{}
	for _, w := range wl.Workers {
		for _, q := range w.Lanes {
			queues[q] = true
		}
	}
	oldest := map[string]time.Time{}
	for _, inv := range invs {
		queues[inv.Queue] = true
	}
	for _, inv := range queued {
		if oldest[inv.Queue].IsZero() || inv.CreatedAt.Before(oldest[inv.Queue]) {
			oldest[inv.Queue] = inv.CreatedAt
		}
	}
	for _, q := range slices.Sorted(maps.Keys(queues)) {
		st, err := u.api.QueueStats(ctx, q)
		if err != nil {
			return fleet{}, fmt.Errorf("queue %s: %w", q, err)
		}
		row := queueRow{Queue: q, Queued: st.Counts[wire.StateQueued], Running: st.Counts[wire.StateRunning], Done: st.DoneCount,
			Succeeded: st.Counts[wire.StateSucceeded], Failed: st.Counts[wire.StateFailed], Cancelled: st.Counts[wire.StateCancelled], Oldest: "—"}
		if oldest[q].IsZero() && row.Queued > 0 {
			// Its queued work is past the first page of every queue's:
			// its own first one, by index.
			il, err := u.api.ListInvocations(ctx, client.ListInvocationsParams{Queue: q, State: wire.StateQueued, Limit: 1})
			if err != nil {
				return fleet{}, fmt.Errorf("oldest queued of %s: %w", q, err)
			}
			for _, inv := range il.Invocations {
				oldest[q] = inv.CreatedAt
			}
		}
		if t := oldest[q]; !t.IsZero() {
			row.Oldest = shortAge(now.Sub(t))
		}
		f.Queues = append(f.Queues, row)
	}
	return f, nil
}

// timelineNewest is how many of the newest invocations the fleet page's
// timeline reads, besides the running and queued ones.
const timelineNewest = 75

// invPage is what an invocation's page shows.
type invPage struct {
	Inv      wire.Invocation
	Argv     string
	Attempts []attemptRow
	Result   string
	Error    string
	Waiting  string
	Output   outputView
	Running  bool
	CSRF     string
	Back     string
	// Artifacts: the counted attempt's, and apart the other attempts'.
	Artifacts artifactsView
}

type attemptRow struct {
	Attempt                         int
	Worker, Claimed, Ended, Outcome string
	Reason, ExitCode                string
	Recorded                        bool
}

// invocationPage reads what invocation id's page shows, with attempt's
// output (0: the latest attempt's).
func (u *UI) invocationPage(ctx context.Context, sess, id string, attempt int) (invPage, error) {
	inv, err := u.api.GetInvocation(ctx, id)
	if err != nil {
		return invPage{}, err
	}
	wl, err := u.api.ListWorkers(ctx, listLimit, "")
	if err != nil {
		return invPage{}, fmt.Errorf("list workers: %w", err)
	}
	names, now := labels(wl.Workers), u.now()
	p := invPage{Inv: inv, Argv: printable(strings.Join(inv.Argv, " ")), Running: !wire.Terminal(inv.State),
		CSRF: u.csrfToken(sess), Back: "/ui/invocations/" + inv.InvocationID}
	for _, a := range inv.Attempts {
		row := attemptRow{Attempt: a.Attempt, Worker: cmp.Or(names[a.WorkerID], a.WorkerID), Claimed: shortAge(now.Sub(a.ClaimedAt)) + " ago",
			Outcome: cmp.Or(a.Outcome, "running"), Reason: printable(a.Reason), Recorded: a.Recorded, Ended: "—"}
		if a.EndedAt != nil {
			row.Ended = shortAge(now.Sub(*a.EndedAt)) + " ago"
		}
		if a.ExitCode != nil {
			row.ExitCode = strconv.Itoa(*a.ExitCode)
		}
		p.Attempts = append(p.Attempts, row)
	}
	if len(inv.ResultBlob) > 0 {
		p.Result = printableLog(string(inv.ResultBlob))
	}
	if inv.Error != nil {
		p.Error = printable(inv.Error.Type + ": " + inv.Error.Message)
	}
	p.Waiting = printable(inv.WaitingReason)
	if attempt > inv.Attempt {
		return invPage{}, wire.Errorf(wire.CodeNotFound, "invocation %s has run %d attempts; there is no attempt %d", id, inv.Attempt, attempt)
	}
	p.Output = u.output(ctx, inv, attempt)
	p.Artifacts = u.invocationArtifacts(ctx, inv.InvocationID)
	return p, nil
}

// printableLog shows output with its newlines and tabs, its other hidden
// characters escaped (display.Block).
func printableLog(s string) string { return display.Block(s) }

// render writes template name with data as the page.
func (u *UI) render(w http.ResponseWriter, status int, name string, data any) {
	var b strings.Builder
	if err := u.tmpl.ExecuteTemplate(&b, name, data); err != nil {
		u.log.Error("ui: render", "template", name, "error", err.Error())
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// parts answers the named templates rendered with data, as JSON.
func (u *UI) parts(w http.ResponseWriter, data any, names ...string) {
	out := map[string]string{}
	for _, n := range names {
		var b strings.Builder
		if err := u.tmpl.ExecuteTemplate(&b, n, data); err != nil {
			u.log.Error("ui: render", "template", n, "error", err.Error())
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "internal error"})
			return
		}
		out[n] = b.String()
	}
	writeJSON(w, http.StatusOK, out)
}

func (u *UI) fail(w http.ResponseWriter, err error) {
	u.render(w, statusOf(err), "error.html", map[string]any{"Error": err.Error()})
}

// statusOf is the status to answer an API refusal with (its own: 404, 409
// …), or 502 when the API could not be asked.
func statusOf(err error) int {
	if we := (*wire.Error)(nil); errors.As(err, &we) {
		return wire.Status(we.Code)
	}
	return http.StatusBadGateway
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
