package ui_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/api"
	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/api/daemonapi"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/server/ui"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The web view's requests FuzzUIForms sends (route modulo len).
var fuzzRoutes = []struct{ method, path string }{
	{"POST", "/ui/login"},
	{"POST", "/ui/logout"},
	{"POST", "/ui/invocations/{id}/cancel"},
	{"POST", "/ui/workers/{id}/drain"},
	{"POST", "/ui/workers/{id}/setup"},
	{"GET", "/ui/"},
	{"GET", "/ui/live"},
	{"GET", "/ui/invocations/{id}"},
	{"GET", "/ui/invocations/{id}/live"},
	{"GET", "/ui/runs"},
	{"GET", "/ui/runs/live"},
	{"GET", "/ui/runs/{id}"},
	{"GET", "/ui/runs/{id}/live"},
	{"POST", "/ui/runs/{id}/cancel"},
	{"POST", "/ui/runs/{id}/retry"},
	{"GET", "/ui/invocations/{id}/artifacts/1/{id}"},
	{"GET", "/ui/invocations/{id}/output"},
	{"GET", "/ui/hosts"},
	{"GET", "/ui/hosts/live"},
}

// Session selectors (modulo fuzzSessions): the cookie a fuzzed request
// carries.
const (
	sessNone   = iota // no cookie
	sessLive          // a live session, logged in with the operator token
	sessFuzzed        // the fuzzed cookie value
	sessEnded         // a session that logged out
	fuzzSessions
)

// FuzzUIForms sends the web view's forms and pages (login, logout, cancel,
// drain, setup, cancel and retry a run, the pages and their live parts
// with fuzzed queries (the invocation list's filter and cursors), an
// artifact's download link, an output's download, the hosts page) with
// fuzzed fields, ids,
// back=, cookie and CSRF token, to the router over the embedded store, and
// checks that the view never panics, never answers 5xx, and never
// redirects outside /ui/. The clock moves by a fuzzed step between inputs
// (sessions go idle and expire, login throttles open and close); an id of
// "$I", "$W" or "$R" is the fixture's invocation, worker or run.
func FuzzUIForms(f *testing.F) {
	db, prefix := storetest.Embedded(f), storetest.Prefix(f)
	if err := schema.EnsureTables(f.Context(), db, prefix); err != nil {
		f.Fatal(err)
	}
	c := clock.NewFake(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	st := store.New(db, prefix)
	router, err := apitest.Build(apitest.Config{Store: st, Config: api.Config{Config: daemonapi.Config{EnrollToken: enrollToken, OperatorToken: operatorToken,
		Logger: slog.New(slog.DiscardHandler)}}, Control: control.Config{Clock: c.Clock()}})
	if err != nil {
		f.Fatal(err)
	}
	srv := httptest.NewServer(router)
	f.Cleanup(srv.Close)
	inv, _, err := client.New(srv.URL, operatorToken).Submit(f.Context(), wire.SubmitRequest{Queue: "q", Argv: []string{"true"}})
	if err != nil {
		f.Fatal(err)
	}
	run, _, err := client.New(srv.URL, operatorToken).SubmitRun(f.Context(), wire.RunRequest{Queue: "q", Name: "<b>fuzz</b>\x1b[31m",
		Argv: []string{"exit", "{x}"}, Matrix: map[string][]string{"x": {"0", "1"}}})
	if err != nil {
		f.Fatal(err)
	}
	wrk, err := client.New(srv.URL, enrollToken).Hello(f.Context(), wire.HelloRequest{MachineID: "m-fuzz", BootID: "b", Lanes: []string{"q"}})
	if err != nil {
		f.Fatal(err)
	}
	send := func(method, path, cookie, addr string, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, "/", strings.NewReader(body))
		req.URL.Path = path
		if method == "GET" {
			// A page's query (its filter and cursor), encoded as a
			// browser sends it: a request line holds no raw control
			// character.
			q, _ := url.ParseQuery(body)
			req.URL.RawQuery = q.Encode()
		}
		req.RemoteAddr = addr
		if method == "POST" {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		if cookie != "" {
			req.Header.Set("Cookie", "lakeshore_session="+cookie)
		}
		rec := httptest.NewRecorder()
		router.ServeHTTP(rec, req)
		return rec
	}
	// login opens a session from an address no fuzzed login fails from;
	// "" when refused (the throttle of all failed logins may be closed).
	login := func() string {
		rec := send("POST", "/ui/login", "", "10.255.0.1:1", url.Values{"token": {operatorToken}}.Encode())
		for _, ck := range rec.Result().Cookies() {
			return ck.Value
		}
		return ""
	}
	live, ended := login(), login()
	if live == "" || ended == "" || send("POST", "/ui/logout", ended, "10.255.0.1:1", url.Values{"csrf": {ui.CSRFToken(ended)}}.Encode()).Code != http.StatusSeeOther {
		f.Fatal("the fixture's sessions")
	}

	f.Add(uint8(0), uint8(sessNone), false, "", operatorToken, "", "", "", "", uint16(1))
	f.Add(uint8(0), uint8(sessNone), false, "", "wrong", "", "", "", "", uint16(1))
	f.Add(uint8(1), uint8(sessLive), true, "", "", "/ui/", "", "", "", uint16(1))
	f.Add(uint8(2), uint8(sessLive), true, "$I", "", "/ui/../%5Cevil.example", "", "", "", uint16(1))
	f.Add(uint8(2), uint8(sessLive), true, "$I", "", "/ui/invocations/$I", "", "", "", uint16(1))
	f.Add(uint8(3), uint8(sessLive), true, "$W", "", "", "", "", "", uint16(1))
	f.Add(uint8(4), uint8(sessLive), true, "$W", "", "", "echo hi", "", "", uint16(1))
	f.Add(uint8(4), uint8(sessEnded), true, "$W", "", "", "echo hi", "", "", uint16(1))
	f.Add(uint8(5), uint8(sessFuzzed), false, "", "", "", "", "", "AAAA", uint16(60))
	f.Add(uint8(6), uint8(sessLive), false, "", "", "", "", "", "", uint16(3600))
	f.Add(uint8(7), uint8(sessLive), false, "$I", "", "", "", "", "", uint16(1))
	f.Add(uint8(8), uint8(sessLive), false, "..%2f..", "", "", "", "", "", uint16(1))
	f.Add(uint8(2), uint8(sessLive), false, "$I", "", "", "", "csrf=x&back=//evil", "", uint16(1))
	f.Add(uint8(9), uint8(sessLive), false, "", "", "", "", "", "", uint16(1))
	f.Add(uint8(11), uint8(sessLive), false, "$R", "", "", "", "", "", uint16(1))
	f.Add(uint8(12), uint8(sessLive), false, "$R", "", "", "", "", "", uint16(1))
	f.Add(uint8(11), uint8(sessLive), false, "$R?did=cancelled&n=-1&left=x", "", "", "", "", "", uint16(1))
	f.Add(uint8(13), uint8(sessLive), true, "$R", "", "", "", "", "", uint16(1))
	f.Add(uint8(14), uint8(sessLive), true, "$R", "", "", "", "", "", uint16(1))
	f.Add(uint8(13), uint8(sessLive), true, "run_..%2f", "", "", "", "", "", uint16(1))
	f.Add(uint8(15), uint8(sessLive), false, "$I", "", "", "", "", "", uint16(1))
	f.Add(uint8(15), uint8(sessNone), false, "$I", "", "", "", "", "", uint16(1))
	f.Add(uint8(15), uint8(sessLive), false, "%3F%25 x", "", "", "", "", "", uint16(1))
	f.Add(uint8(16), uint8(sessLive), false, "$I", "", "", "", "stream=stdout&attempt=1", "", uint16(1))
	f.Add(uint8(16), uint8(sessNone), false, "$I", "", "", "", "stream=stderr", "", uint16(1))
	f.Add(uint8(16), uint8(sessLive), false, "$I", "", "", "", "stream=stdout&attempt=99&x=", "", uint16(1))
	f.Add(uint8(7), uint8(sessLive), false, "$I", "", "", "", "attempt=1", "", uint16(1))
	f.Add(uint8(8), uint8(sessLive), false, "$I", "", "", "", "attempt=-1", "", uint16(1))
	f.Add(uint8(5), uint8(sessLive), false, "", "", "", "", "state=queued&queue=q&after=eyJ4IjoiMSJ9", "", uint16(1))
	f.Add(uint8(6), uint8(sessLive), false, "", "", "", "", "id=inv_0&before=eyJsaXN0ZWRfdG8iOiJpbnZfMCJ9", "", uint16(1))
	f.Add(uint8(6), uint8(sessLive), false, "", "", "", "", "id=$I&after=%00&before=x", "", uint16(1))
	f.Add(uint8(17), uint8(sessLive), false, "", "", "", "", "", "", uint16(1))
	f.Add(uint8(18), uint8(sessLive), false, "", "", "", "", "", "", uint16(1))
	f.Fuzz(func(t *testing.T, route, sessSel uint8, rightCSRF bool, id, token, backTo, command, raw, cookie string, step uint16) {
		c.Advance(time.Duration(step) * time.Second)
		id = strings.NewReplacer("$I", inv.InvocationID, "$W", wrk.WorkerID, "$R", run.RunID).Replace(id)
		backTo = strings.ReplaceAll(backTo, "$I", inv.InvocationID)
		raw = strings.ReplaceAll(raw, "$I", inv.InvocationID)
		rt := fuzzRoutes[int(route)%len(fuzzRoutes)]
		switch sessSel % fuzzSessions {
		case sessNone:
			cookie = ""
		case sessLive:
			if !stillLive(t, st, live, c.Now()) {
				live = login()
			}
			cookie = live
		case sessEnded:
			cookie = ended
		}
		form := url.Values{}
		for k, v := range map[string]string{"token": token, "back": backTo, "command": command} {
			if v != "" {
				form.Set(k, v)
			}
		}
		if rightCSRF {
			form.Set("csrf", ui.CSRFToken(cookie))
		}
		body := form.Encode()
		if raw != "" {
			body += "&" + raw
		}
		path := strings.ReplaceAll(rt.path, "{id}", id)
		rec := send(rt.method, path, cookie, "192.0.2.1:1234", body)
		if rec.Code >= 500 {
			t.Fatalf("%s %s (cookie %q, body %q): %d %s", rt.method, path, cookie, body, rec.Code, rec.Body)
		}
		if loc := rec.Header().Get("Location"); rec.Code >= 300 && rec.Code < 400 && !underView(loc) {
			t.Fatalf("%s %s (body %q): %d → %q, outside /ui/", rt.method, path, body, rec.Code, loc)
		}
	})
}

// stillLive reports whether session secret is live at now, by the store.
func stillLive(t *testing.T, st *store.Store, secret string, now time.Time) bool {
	if secret == "" {
		return false
	}
	s, ok, err := st.UISession(t.Context(), ui.SessionID(secret))
	if err != nil {
		t.Fatal(err)
	}
	return ok && s.Ended(now, ui.DefaultSessionIdle) == ""
}
