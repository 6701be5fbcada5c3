// Package uitest drives the web view over HTTP as a browser would, without
// one: a login, pages and forms sent with a session's cookie, and the check
// that a session is refused on every page and action. The tests of
// server/ui and of tests/ (real lakeshore dev processes) share it.
package uitest

import (
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// CookieName is the session cookie's name.
const CookieName = "lakeshore_session"

// Session is one login's cookie value and the CSRF token of its pages.
type Session struct{ Cookie, CSRF string }

// csrfRE finds the CSRF token in a page's forms.
var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// CSRFOf reports the CSRF token of page's forms, or "".
func CSRFOf(page string) string {
	if m := csrfRE.FindStringSubmatch(page); m != nil {
		return m[1]
	}
	return ""
}

// Request is a request of the view at base: a form POST when form is not
// nil, carrying session cookie value cookie (none for "").
func Request(t testing.TB, base, cookie, method, path string, form url.Values) *http.Request {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if cookie != "" {
		req.AddCookie(&http.Cookie{Name: CookieName, Value: cookie})
	}
	return req
}

// noRedirects is a client without a cookie jar that follows no redirect:
// a replayed, copied cookie is all a request carries.
var noRedirects = &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// Send sends req with hc (nil: one without a cookie jar that follows no
// redirect) and reports the answer and its body.
func Send(t testing.TB, hc *http.Client, req *http.Request) (*http.Response, string) {
	t.Helper()
	if hc == nil {
		hc = noRedirects
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// Do sends a request of the view at base with session cookie value cookie
// (none for ""), following no redirect.
func Do(t testing.TB, base, cookie, method, path string, form url.Values) (*http.Response, string) {
	t.Helper()
	return Send(t, nil, Request(t, base, cookie, method, path, form))
}

// Login logs in to the view at base with tok and reads the fleet page's
// CSRF token.
func Login(t testing.TB, base, tok string) Session {
	t.Helper()
	resp, body := Do(t, base, "", "POST", "/ui/login", url.Values{"token": {tok}})
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
		t.Fatalf("login: %d %v %s", resp.StatusCode, resp.Cookies(), body)
	}
	s := Session{Cookie: resp.Cookies()[0].Value}
	_, page := Do(t, base, s.Cookie, "GET", "/ui/", nil)
	if s.CSRF = CSRFOf(page); s.CSRF == "" {
		t.Fatalf("the fleet page after a login has no CSRF token:\n%s", page)
	}
	return s
}

// anyRun is a run id for the pages WantRefused asks: a refusal comes
// before the run is read.
const anyRun = "run_01J0000000000000000000000R"

// WantRefused checks that session s is refused on every page and action
// of the view at base, for invocation inv and worker wrk: the fleet page is
// the login form (and shows no invocation), another page goes to it, the
// live parts answer 401, an action 403 (or 401). why names the case.
func WantRefused(t testing.TB, base string, s Session, inv, wrk, why string) {
	t.Helper()
	for _, rq := range []struct {
		method, path string
		form         url.Values
	}{
		{"GET", "/ui/", nil},
		{"GET", "/ui/live", nil},
		{"GET", "/ui/invocations/" + inv, nil},
		{"GET", "/ui/invocations/" + inv + "/live", nil},
		{"GET", "/ui/invocations/" + inv + "/artifacts/1/out.txt", nil},
		{"POST", "/ui/invocations/" + inv + "/cancel", url.Values{"csrf": {s.CSRF}, "back": {"/ui/"}}},
		{"POST", "/ui/workers/" + wrk + "/drain", url.Values{"csrf": {s.CSRF}}},
		{"POST", "/ui/workers/" + wrk + "/setup", url.Values{"csrf": {s.CSRF}, "command": {"touch /tmp/lakeshore-refused-session"}}},
		{"GET", "/ui/runs", nil},
		{"GET", "/ui/runs/live", nil},
		{"GET", "/ui/runs/" + anyRun, nil},
		{"GET", "/ui/runs/" + anyRun + "/live", nil},
		{"POST", "/ui/runs/" + anyRun + "/cancel", url.Values{"csrf": {s.CSRF}}},
		{"POST", "/ui/runs/" + anyRun + "/retry", url.Values{"csrf": {s.CSRF}}},
		{"POST", "/ui/logout", url.Values{"csrf": {s.CSRF}}},
	} {
		resp, body := Do(t, base, s.Cookie, rq.method, rq.path, rq.form)
		var refused bool
		switch {
		case rq.path == "/ui/":
			refused = resp.StatusCode == http.StatusOK && strings.Contains(body, `name="token"`) && !strings.Contains(body, inv)
		case strings.HasSuffix(rq.path, "/live"):
			refused = resp.StatusCode == http.StatusUnauthorized
		case rq.method == "GET":
			refused = resp.StatusCode == http.StatusSeeOther && resp.Header.Get("Location") == "/ui/"
		default:
			refused = resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized
		}
		if !refused {
			t.Errorf("%s: %s %s answered %d (Location %q), want refused", why, rq.method, rq.path, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
}
