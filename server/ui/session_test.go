package ui_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/ui/uitest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/syncbuf"
	"github.com/dreamlake/lakeshore/shared/wire"
)

const (
	oldOperator = "operator-token-old-for-ui-tests-01"
	newOperator = "operator-token-new-for-ui-tests-01"
)

// login logs in with tok.
func (s served) login(t *testing.T, tok string) uitest.Session { return uitest.Login(t, s.url, tok) }

// as sends a request carrying session cookie value cookie (none for ""),
// without the cookie jar: a replayed, copied cookie.
func (s served) as(t *testing.T, cookie, method, path string, form url.Values) (*http.Response, string) {
	t.Helper()
	return uitest.Do(t, s.url, cookie, method, path, form)
}

// wantRefused checks that sess is refused on every page and action.
func (s served) wantRefused(t *testing.T, sess uitest.Session, inv, wrk, why string) {
	t.Helper()
	uitest.WantRefused(t, s.url, sess, inv, wrk, why)
}

// fleetOf submits an invocation to a queue nobody serves and says hello
// as a worker, for the actions to act on.
func fleetOf(t *testing.T, s served) (inv, wrk string) {
	t.Helper()
	i, _, err := s.op.Submit(t.Context(), wire.SubmitRequest{Queue: "nobody", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	w, err := client.New(s.url, enrollToken).Hello(t.Context(), wire.HelloRequest{MachineID: "m-sess", BootID: "b", Lanes: []string{"q"}})
	if err != nil {
		t.Fatal(err)
	}
	return i.InvocationID, w.WorkerID
}

// TestSessionEndsWithItsToken: a session is bound to the operator token
// that opened it. After a restart with only the new token, a session
// opened with the old one is refused on every page and action (and its
// cancel cancels nothing); one opened with the new token keeps working.
func TestSessionEndsWithItsToken(t *testing.T) {
	tb := newTables(t)
	overlap := tb.serve(t, func(c *apitest.Config) { c.OperatorToken, c.PreviousOperatorToken = newOperator, oldOperator })
	overlap.op = client.New(overlap.url, newOperator)
	inv, wrk := fleetOf(t, overlap)
	withOld, withNew := overlap.login(t, oldOperator), overlap.login(t, newOperator)
	if resp, body := overlap.as(t, withOld.Cookie, "GET", "/ui/", nil); resp.StatusCode != 200 || !strings.Contains(body, inv) {
		t.Fatalf("during the overlap the old token's session: %d", resp.StatusCode)
	}

	after := tb.serve(t, func(c *apitest.Config) { c.OperatorToken = newOperator })
	after.op = client.New(after.url, newOperator)
	after.wantRefused(t, withOld, inv, wrk, "the old token's session after the rotation")
	if got, err := after.op.GetInvocation(t.Context(), inv); err != nil || got.State != wire.StateQueued {
		t.Fatalf("after the old session's cancel: %s %v, want still queued", got.State, err)
	}
	if got, err := after.op.GetWorker(t.Context(), wrk); err != nil || got.State == "draining" {
		t.Fatalf("after the old session's drain: %s %v, want not draining", got.State, err)
	}

	if resp, body := after.as(t, withNew.Cookie, "GET", "/ui/", nil); resp.StatusCode != 200 || !strings.Contains(body, inv) {
		t.Fatalf("the new token's session after the rotation: %d", resp.StatusCode)
	}
	if resp, _ := after.as(t, withNew.Cookie, "POST", "/ui/invocations/"+inv+"/cancel", url.Values{"csrf": {withNew.CSRF}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the new token's session's cancel: %d", resp.StatusCode)
	}
	if got, _ := after.op.GetInvocation(t.Context(), inv); got.State != wire.StateCancelled {
		t.Fatalf("after the new session's cancel: %s", got.State)
	}
}

// TestCSRFTokenIsBoundToItsSession: an action needs the CSRF token of
// the session whose cookie it carries: another live session's token (one
// a page of that session showed) is refused, and the action is not done.
func TestCSRFTokenIsBoundToItsSession(t *testing.T) {
	s := serve(t)
	inv, _ := fleetOf(t, s)
	mine, theirs := s.login(t, operatorToken), s.login(t, operatorToken)
	if mine.CSRF == "" || mine.CSRF == theirs.CSRF {
		t.Fatalf("two sessions' CSRF tokens: %q and %q, want two different ones", mine.CSRF, theirs.CSRF)
	}
	cancel := "/ui/invocations/" + inv + "/cancel"
	if resp, _ := s.as(t, mine.Cookie, "POST", cancel, url.Values{"csrf": {theirs.CSRF}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a cancel with another session's CSRF token: %d, want 403", resp.StatusCode)
	}
	if got, _ := s.op.GetInvocation(t.Context(), inv); got.State != wire.StateQueued {
		t.Fatalf("after a cancel with another session's CSRF token: %s, want still queued", got.State)
	}
	if resp, _ := s.as(t, mine.Cookie, "POST", cancel, url.Values{"csrf": {mine.CSRF}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("a cancel with the session's own CSRF token: %d, want 303", resp.StatusCode)
	}
}

// TestLogoutEndsTheSession: a copy of the cookie taken before a logout is
// refused after it, on every page and action.
func TestLogoutEndsTheSession(t *testing.T) {
	s := serve(t)
	inv, wrk := fleetOf(t, s)
	sess := s.login(t, operatorToken)
	other := s.login(t, operatorToken)
	resp, _ := s.as(t, sess.Cookie, "POST", "/ui/logout", url.Values{"csrf": {sess.CSRF}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %d", resp.StatusCode)
	}
	s.wantRefused(t, sess, inv, wrk, "a logged-out cookie replayed")
	if got, _ := s.op.GetInvocation(t.Context(), inv); got.State != wire.StateQueued {
		t.Fatalf("a logged-out session cancelled: %s", got.State)
	}
	if resp, _ := s.as(t, other.Cookie, "GET", "/ui/live", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("another session after a logout: %d", resp.StatusCode)
	}
}

// TestIdleSessionEnds: a session nobody used for the idle timeout is
// refused; page loads and actions keep it alive, the live refresh alone
// does not; none outlives 12 h.
func TestIdleSessionEnds(t *testing.T) {
	c := clock.NewFake(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	s := newTables(t).serve(t, func(cfg *apitest.Config) { cfg.Control.Clock = c.Clock() })
	inv, wrk := fleetOf(t, s)
	sess := s.login(t, operatorToken)
	page := func(path string) int {
		resp, _ := s.as(t, sess.Cookie, "GET", path, nil)
		return resp.StatusCode
	}
	for range 4 { // a page every 20 min: alive
		c.Advance(20 * time.Minute)
		if got := page("/ui/live"); got != 200 {
			t.Fatalf("the live parts 20 min after a page load: %d", got)
		}
		if got := page("/ui/invocations/" + inv); got != 200 {
			t.Fatalf("a page load 20 min after the last: %d", got)
		}
	}
	c.Advance(20 * time.Minute)
	page("/ui/live") // the live refresh is not activity
	c.Advance(11 * time.Minute)
	s.wantRefused(t, sess, inv, wrk, "a session idle for 31 min (a live refresh at 20)")

	sess = s.login(t, operatorToken)
	for i := range 12 * 3 { // active every 20 min, for 12 h
		c.Advance(20 * time.Minute)
		if i < 12*3-1 && page("/ui/") != 200 {
			t.Fatalf("an active session %d min after its login: refused", (i+1)*20)
		}
	}
	s.wantRefused(t, sess, inv, wrk, "an active session 12 h after its login")
}

// TestBackStaysUnderTheView: an action's back= goes only to a page of
// the view; anything else (another site, a backslash, a step out of /ui/)
// goes to the action's own default.
func TestBackStaysUnderTheView(t *testing.T) {
	s := serve(t)
	sess := s.login(t, operatorToken)
	for _, b := range []string{"/ui/../%5Cevil.example", `/ui/../\evil.example`, `/ui/\evil.example`, `/ui/..\evil.example`,
		"/ui/%2e%2e/%2fevil.example", "/ui/./../../evil.example", "https://evil.example/ui/", "//evil.example/ui/",
		"/ui/../ui/../evil", "/ui//evil.example", "/ui/\r\nSet-Cookie: x=y", "/ui/\x00",
		"/ui/?x=//evil.example", "/ui/?x=%2F%2Fevil.example", "/ui/?x=a?b", "/ui/?x=\\evil", "/ui/?x=\r\nSet-Cookie:y", "/ui/?next=https:evil"} {
		inv, _, err := s.op.Submit(t.Context(), wire.SubmitRequest{Queue: "nobody", Argv: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		resp, _ := s.as(t, sess.Cookie, "POST", "/ui/invocations/"+inv.InvocationID+"/cancel", url.Values{"csrf": {sess.CSRF}, "back": {b}})
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusSeeOther || !underView(loc) {
			t.Errorf("back=%q: %d → %q, want a page under /ui/", b, resp.StatusCode, loc)
		}
	}
	inv, _, _ := s.op.Submit(t.Context(), wire.SubmitRequest{Queue: "nobody", Argv: []string{"true"}})
	if resp, _ := s.as(t, sess.Cookie, "POST", "/ui/invocations/"+inv.InvocationID+"/cancel", url.Values{"csrf": {sess.CSRF},
		"back": {"/ui/invocations/" + inv.InvocationID}}); resp.Header.Get("Location") != "/ui/invocations/"+inv.InvocationID {
		t.Errorf("a back= of the view's own page: → %q", resp.Header.Get("Location"))
	}
	// A page of the list, filtered and paged, is returned to whole; a query
	// with any other character goes to the default.
	for b, want := range map[string]string{
		"/ui/?state=queued&queue=q&after=eyJ4-_IjoiMSJ9&minutes=15": "/ui/?after=eyJ4-_IjoiMSJ9&minutes=15&queue=q&state=queued",
		"/ui/?id=inv_01AB":         "/ui/?id=inv_01AB",
		"/ui/?":                    "/ui/",
		"/ui/?state=queued&x=%2Fa": "/ui/invocations/",
		"/ui/../evil?state=queued": "/ui/invocations/",
	} {
		inv, _, _ := s.op.Submit(t.Context(), wire.SubmitRequest{Queue: "nobody", Argv: []string{"true"}})
		resp, _ := s.as(t, sess.Cookie, "POST", "/ui/invocations/"+inv.InvocationID+"/cancel", url.Values{"csrf": {sess.CSRF}, "back": {b}})
		got := strings.Replace(resp.Header.Get("Location"), inv.InvocationID, "", 1)
		if resp.StatusCode != http.StatusSeeOther || got != want {
			t.Errorf("back=%q: %d → %q, want %q", b, resp.StatusCode, got, want)
		}
	}
}

// underView reports whether loc, a Location, is a path under /ui/ as a
// browser reads it.
func underView(loc string) bool {
	u, err := url.Parse(loc)
	return err == nil && u.Scheme == "" && u.Host == "" && !strings.ContainsAny(loc, "\\\r\n") &&
		strings.HasPrefix(loc, "/ui/") && !strings.HasPrefix(loc, "//") && !strings.Contains(u.Path, "/../")
}

// TestLoginThrottled: failed logins are throttled per client address
// (429 with Retry-After, even for the right token) and in all; a minute
// later the address logs in; the failures are logged at warn once a
// minute, not once each.
func TestLoginThrottled(t *testing.T) {
	c := clock.NewFake(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	logs := &syncbuf.Buffer{}
	h := newTables(t).router(t, func(cfg *apitest.Config) {
		cfg.Control.Clock = c.Clock()
		cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	login := func(addr, tok string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/ui/login", strings.NewReader(url.Values{"token": {tok}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.RemoteAddr = addr
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	const attacker = "192.0.2.7:4000"
	refusedAt := 0
	for i := range 100 {
		if rec := login(attacker, "guess-"+strconv.Itoa(i)); rec.Code == http.StatusTooManyRequests {
			refusedAt = i
			break
		}
	}
	if refusedAt == 0 || refusedAt > 20 {
		t.Fatalf("one address's failed logins: throttled after %d (0: never), want within 20", refusedAt)
	}
	rec := login("192.0.2.7:4001", operatorToken)
	if rec.Code != http.StatusTooManyRequests || len(rec.Result().Cookies()) != 0 {
		t.Fatalf("the right token from a throttled address: %d, want 429 and no session", rec.Code)
	}
	if ra, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
		t.Fatalf("Retry-After %q, want 1-60 s", rec.Header().Get("Retry-After"))
	}
	if rec := login("198.51.100.1:5000", operatorToken); rec.Code != http.StatusSeeOther {
		t.Fatalf("another address's login while one is throttled: %d", rec.Code)
	}
	if n := bytes.Count([]byte(logs.String()), []byte(`"level":"WARN"`)); n > 2 {
		t.Fatalf("%d warnings for %d failed logins in a minute, want at most 2:\n%s", n, refusedAt, logs.String())
	}

	c.Advance(61 * time.Second)
	if rec := login(attacker, operatorToken); rec.Code != http.StatusSeeOther {
		t.Fatalf("the address a minute later, with the right token: %d", rec.Code)
	}

	// Many addresses: the failures in all are throttled too.
	c.Advance(61 * time.Second)
	throttled := false
	for i := range 1000 {
		addr := "203.0.113." + strconv.Itoa(i%250) + ":" + strconv.Itoa(1000+i)
		if login(addr, "guess").Code == http.StatusTooManyRequests {
			throttled = i < 500
			break
		}
	}
	if !throttled {
		t.Fatal("failed logins from many addresses were never throttled (within 500)")
	}
}
